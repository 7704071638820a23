# SPDX-License-Identifier: Apache-2.0
"""`vllm bench serve` for the sections that use it (bench_ab, the serving matrix):
its argument list, the warm-up variant, its --save-result JSON, and two ways to run it.

* ``run_cli``: one ``python -m vllm.entrypoints.cli.main bench serve ...`` process per
  run (what bench_ab does).
* ``BenchWorker``: one long-lived process (``bench_worker.py``) that runs vLLM's own
  CLI entry point, ``vllm.entrypoints.cli.main:main``, once per argument list it is
  sent: the same parser and code as the ``vllm bench serve`` command, without paying
  the interpreter start and vLLM import (about 20 s per run on the H200: bench_ab's
  8k rows took 21-29 s of wall for 1-3.5 s of benchmark) for every row.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .model import SERVED_NAME

RESULT_KEYS = ("completed", "failed", "duration", "output_throughput", "median_ttft_ms",
               "median_tpot_ms", "mean_ttft_ms", "mean_tpot_ms", "total_input_tokens",
               "total_output_tokens")

REPO = Path(__file__).resolve().parents[2]


def bench_args(port: int, model_dir: str, isl: int, osl: int, conc: int, num_prompts: int,
               result_dir: Path | None = None, result_name: str | None = None, seed: int = 0,
               ready_check_s: int | None = None) -> list[str]:
    """Arguments after ``vllm``: the random dataset at exactly ``isl`` / ``osl``
    tokens, greedy, ignore_eos, at most ``conc`` requests in flight; with
    ``result_dir`` the --save-result JSON goes to ``result_dir / result_name``, with
    --save-detailed (per-request TTFTs: ``read_result``'s ``ttfts_ms``).
    ``ready_check_s`` bounds bench's initial test request retries (its default is
    600 s of retries against a server that died)."""
    args = ["bench", "serve", "--backend", "vllm", "--host", "127.0.0.1", "--port", str(port),
            "--model", SERVED_NAME, "--tokenizer", str(model_dir),
            "--dataset-name", "random", "--random-input-len", str(isl),
            "--random-output-len", str(osl), "--max-concurrency", str(conc),
            "--num-prompts", str(num_prompts), "--ignore-eos", "--temperature", "0",
            "--seed", str(seed), "--disable-tqdm"]
    if ready_check_s is not None:
        args += ["--ready-check-timeout-sec", str(ready_check_s)]
    if result_dir is not None:
        args += ["--save-result", "--save-detailed", "--result-dir", str(result_dir),
                 "--result-filename", str(result_name)]
    return args


def set_arg(args: list[str], flag: str, value: str) -> list[str]:
    """A copy of a CLI argument list with ``flag``'s value replaced."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def warmup_args(args: list[str], num_prompts: int, osl: int, isl: int | None = None) -> list[str]:
    """The unrecorded warm-up of a run: same server and concurrency, ``num_prompts``
    prompts of ``osl`` tokens (and ``isl`` input tokens if given), seed 1, nothing saved."""
    warm = set_arg(set_arg(set_arg(args, "--num-prompts", str(num_prompts)),
                           "--random-output-len", str(osl)), "--seed", "1")
    if isl is not None:
        warm = set_arg(warm, "--random-input-len", str(isl))
    if "--save-result" in warm:
        warm = warm[:warm.index("--save-result")]
    return warm


def display_cmd(args: list[str], model_dir: str) -> str:
    """The command line as a person would type it (model dir shortened)."""
    return "vllm " + " ".join(args).replace(str(model_dir), "<model-dir>")


def read_result(path: Path, num_prompts: int) -> dict:
    """The metrics of a --save-result JSON; ``ok``: every prompt completed, none failed;
    ``ttfts_ms``: each request's TTFT in request order where --save-detailed gave them.
    A missing file gives ``{"ok": False, "error": ...}``."""
    if not path.exists():
        return {"ok": False, "error": f"no result file {path.name}"}
    res = json.loads(path.read_text())
    out = {k: res.get(k) for k in RESULT_KEYS}
    if isinstance(res.get("ttfts"), list):
        out["ttfts_ms"] = [round(t * 1e3, 2) if t is not None else None for t in res["ttfts"]]
    out["ok"] = out["completed"] == num_prompts and not out["failed"]
    return out


def run_cli(args: list[str], log, timeout: float) -> int | str:
    """``vllm <args>`` in a process of its own, output to the open file ``log``;
    the exit code, or "timeout"."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *args]
    try:
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return "timeout"


class BenchWorker:
    """Runs ``vllm <args>`` lists in one long-lived process (``bench_worker.py``).

    Each call writes one JSON line (argument list, title, status file) to the
    worker's stdin and waits for the status file.  A worker that dies or overruns
    ``timeout`` is killed (its whole session) and the next call starts a new one.
    ``entry`` names the CLI entry point (``module:function``; tests use a fake)."""

    def __init__(self, log_path: Path, status_dir: Path,
                 entry: str = "vllm.entrypoints.cli.main:main"):
        self.log_path, self.status_dir, self.entry = Path(log_path), Path(status_dir), entry
        self.status_dir.mkdir(parents=True, exist_ok=True)
        self.proc, self.calls = None, 0

    def _start(self) -> None:
        log = open(self.log_path, "a")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.serving.bench_worker", "--entry", self.entry],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
            cwd=REPO, start_new_session=True)
        log.close()

    def run(self, args: list[str], title: str, timeout: float) -> dict:
        """``{"rc": exit code | "timeout" | "worker died", "wall_s": s[, "error"]}``."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.calls += 1
        status = self.status_dir / f"status-{os.getpid()}-{self.calls}.json"
        status.unlink(missing_ok=True)
        t0 = time.monotonic()
        try:
            self.proc.stdin.write(json.dumps({"args": args, "title": title,
                                              "status": str(status)}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            self.close()
            return {"rc": "worker died", "wall_s": 0.0, "error": f"{type(e).__name__}: {e}"}
        while not status.exists():
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                return {"rc": "worker died", "wall_s": round(time.monotonic() - t0, 1),
                        "error": f"bench worker exited with {rc}; see bench.log"}
            if time.monotonic() - t0 > timeout:
                self.close()
                return {"rc": "timeout", "wall_s": round(time.monotonic() - t0, 1),
                        "error": f"no result within {timeout:.0f} s (worker killed)"}
            time.sleep(0.2)
        out = json.loads(status.read_text())
        out["wall_s"] = round(time.monotonic() - t0, 1)
        return out

    def close(self) -> None:
        """Kill the worker's session (it may be inside a run)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None
