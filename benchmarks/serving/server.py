# SPDX-License-Identifier: Apache-2.0
"""The servers: extra wheels, preflight, the plan (sizes, limits), ``vllm serve``
configurations, one server's life (start, warm-up, stop) and the pool that reuses them."""

import dataclasses
import datetime
import glob
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .model import SERVED_NAME


FOLD_ENV = "VLLM_MINIMAX_M3_FOLD_KV_SCALE"


SERVER_MODULES = ("uvicorn", "model_hosting_container_standards")


T0 = time.monotonic()


class Stop(BaseException):
    """SIGTERM (e.g. the caller's time limit): stop servers, write the report."""


def ensure_server_deps(wheels: str | None, site: str = "/tmp/gpu-e2e-site") -> dict:
    """If `vllm serve`'s imports are missing, install the wheels of
    ci/gpu_extra_wheels.sh from ``wheels`` (no index, no deps, projects already
    installed skipped) into ``site`` and put it on the path of this process and
    of every child."""
    missing = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return {"missing": [], "installed": []}
    if not wheels or not glob.glob(os.path.join(wheels, "*.whl")):
        return {"missing": missing, "installed": [], "error": "no --wheels dir with wheels"}
    todo = []
    for w in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        name = os.path.basename(w).split("-")[0]
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            todo.append(w)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-compile", "--find-links", wheels, "--target", site, *todo],
        capture_output=True, text=True)
    sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (site, os.environ.get("PYTHONPATH")) if p)
    importlib.invalidate_caches()
    out = {"missing": missing, "installed": [os.path.basename(w) for w in todo],
           "pip_rc": proc.returncode}
    if proc.returncode:
        out["error"] = proc.stderr[-2000:]
    return out


PREFLIGHT = r"""
import json, subprocess
out = {}
import torch, vllm
out.update(vllm=vllm.__version__, torch=torch.__version__)
for m in ("vllm.entrypoints.openai.api_server", "vllm.benchmarks.serve"):
    try:
        __import__(m); out[m] = "ok"
    except Exception as e:
        out[m] = f"{type(e).__name__}: {e}"
try:
    out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
except Exception:
    out["gpu"] = "none"
print("PREFLIGHT" + json.dumps(out))
"""


def preflight() -> dict:
    """vllm / torch versions, GPU name, and whether the API server and the
    benchmark modules import (seconds, not minutes, to learn a missing dep)."""
    p = subprocess.run([sys.executable, "-c", PREFLIGHT], capture_output=True, text=True,
                       timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("PREFLIGHT"):
            return json.loads(line[len("PREFLIGHT"):])
    return {"error": p.stderr[-3000:]}


@dataclasses.dataclass
class Plan:
    """Everything a section needs: sizes (tokens) per mode, paths, limits."""
    smoke: bool
    out: Path
    work: Path
    model: str = ""
    vocab: int = 0
    block: int = 128
    max_len: int = 70000
    dtype: str = "bfloat16"
    main_kv: str = "fp8"
    batched_tokens: int = 32768
    max_seqs: int = 32
    startup_timeout: float = 300.0
    request_timeout: float = 120.0
    deadline: float = 0.0
    serve_lens: tuple = (100, 1024, 8192, 32768, 65536)
    serve_max_tokens: int = 16
    conc_n: int = 64
    conc_lens: tuple = (50, 4000)
    conc_max_tokens: int = 32
    tp_modes: tuple = ("graphs:fp8", "graphs:auto", "eager:fp8", "eager:auto")
    tp_prompt: int = 512
    tp_out: int = 256
    tp_batches: tuple = (1, 32)
    tp_ttft_lens: tuple = (8192, 32768)
    tp_repeats: int = 3
    ab_isl: tuple = (8192, 131072)
    ab_osl: int = 128
    ab_conc: tuple = (4, 8)
    ab_prompts_per_conc: int = 2
    ab_folds: tuple = (True, False)  # which fold settings this run serves
    ab_timeout: float = 240.0

    def remaining(self) -> float:
        return (self.deadline - (time.monotonic() - T0)) if self.deadline else 1e9


def smoke_overrides() -> dict:
    """CPU sizes: tiny model, short prompts, every section still exercised."""
    return dict(block=32, max_len=1024, dtype="float32", main_kv="auto", batched_tokens=256,
                max_seqs=8, serve_lens=(20, 100, 300, 700), serve_max_tokens=8, conc_n=8,
                conc_lens=(10, 300), conc_max_tokens=8, tp_prompt=64, tp_out=16,
                tp_batches=(1, 4), tp_ttft_lens=(256, 512), tp_repeats=1, ab_isl=(128, 512),
                ab_osl=8, ab_conc=(2,), ab_prompts_per_conc=2, startup_timeout=600.0,
                request_timeout=300.0)


@dataclasses.dataclass(frozen=True)
class ServerCfg:
    """One server configuration: KV dtype, CUDA graphs or eager, FP8 KV-scale
    folding (env VLLM_MINIMAX_M3_FOLD_KV_SCALE), max model length (tokens);
    ``env``: more (NAME, VALUE) pairs for the server's environment (e.g. the
    serving matrix's VLLM_MINIMAX_M3_MSA); ``extra_args``: more `vllm serve` flags."""
    kv: str = "fp8"
    graphs: bool = True
    fold: bool = True
    max_len: int = 70000
    env: tuple = ()
    extra_args: tuple = ()

    @property
    def label(self) -> str:
        base = f"{'graphs' if self.graphs else 'eager'}/kv-{self.kv}/fold-{int(self.fold)}"
        return base + "".join(f"/{k}={v}" for k, v in self.env)

    def environment(self) -> dict:
        """The variables this configuration sets in the server's environment."""
        return {FOLD_ENV: str(int(self.fold)), **dict(self.env)}


def server_args(cfg: ServerCfg, plan: Plan) -> list[str]:
    """`vllm serve` flags (without host/port) for ``cfg``; on CPU (smoke) the
    KV dtype is auto and the engine eager whatever ``cfg`` asks."""
    a = ["--load-format", "dummy", "--served-model-name", SERVED_NAME,
         "--block-size", str(plan.block), "--language-model-only",
         "--no-enable-prefix-caching", "--enable-chunked-prefill",
         "--max-num-batched-tokens", str(plan.batched_tokens),
         "--max-num-seqs", str(plan.max_seqs), "--max-model-len", str(cfg.max_len),
         "--dtype", plan.dtype, "--seed", "0"]
    a += list(cfg.extra_args)
    if plan.smoke:
        return a + ["--kv-cache-dtype", "auto", "--enforce-eager",
                    "--kv-cache-memory-bytes", "256M"]
    a += ["--kv-cache-dtype", cfg.kv]
    if cfg.graphs:
        return a + ["--compilation-config", json.dumps({"cudagraph_mode": "FULL_AND_PIECEWISE"})]
    return a + ["--enforce-eager"]


def server_key(cfg: ServerCfg, plan: Plan) -> tuple:
    """Servers with equal flags and env are one server (reused)."""
    return tuple(server_args(cfg, plan)), tuple(sorted(cfg.environment().items()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `vllm serve` process in its own session, logging to $OUT/serve.log."""

    def __init__(self, cfg: ServerCfg, plan: Plan):
        self.cfg, self.plan = cfg, plan
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = server_args(cfg, plan)
        self.record = {"config": cfg.label, "flags": " ".join(self.args),
                       "env": " ".join(f"{k}={v}" for k, v in cfg.environment().items())}
        self.proc = None

    def start(self) -> None:
        """Start and wait for /health; records start-up seconds or raises."""
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", self.plan.model,
               "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        env = dict(os.environ, **self.cfg.environment())
        log = open(self.plan.out / "serve.log", "a")
        log.write(f"\n===== {datetime.datetime.now():%H:%M:%S} {self.cfg.label}: "
                  f"{self.record['env']} {' '.join(cmd)}\n")
        log.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        log.close()
        limit = min(self.plan.startup_timeout, max(self.plan.remaining(), 0))
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited (rc {self.proc.returncode}) during start-up; "
                                   f"see serve.log:\n{log_tail(self.plan)}")
            try:
                if urllib.request.urlopen(self.url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > limit:
                self.kill()
                raise RuntimeError(f"server not healthy after {limit:.0f} s; see serve.log:\n"
                                   f"{log_tail(self.plan)}")
            time.sleep(1)
        self.record["start_s"] = round(time.monotonic() - t0, 1)

    def stop(self, grace: float = 60.0) -> dict:
        """SIGINT, then wait up to ``grace`` s.  Clean = exit code 0 or the
        SIGINT code within the grace time; leftovers of its session are killed."""
        if self.proc is None or self.proc.poll() is not None:
            self.record["exited_before_stop"] = getattr(self.proc, "returncode", None)
            if self.proc is not None:
                self.kill_session()
            return self.record
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            rc = None
            self.kill()
        secs = round(time.monotonic() - t0, 1)
        self.record.update(stop_rc=rc, stop_s=secs,
                           clean_stop=rc in (0, -signal.SIGINT, 128 + signal.SIGINT))
        self.record["leftover_killed"] = self.kill_session()
        return self.record

    def kill(self) -> None:
        self.kill_session()
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def kill_session(self) -> bool:
        """SIGKILL what is left in the server's session (engine-core children)."""
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError, TypeError, AttributeError):
            return False
        time.sleep(3)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        time.sleep(2)
        return True


def log_tail(plan: Plan, n: int = 3000) -> str:
    try:
        return (plan.out / "serve.log").read_text(errors="replace")[-n:]
    except OSError:
        return ""

