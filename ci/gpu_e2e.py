#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end serving validation of MiniMax-M3 through `vllm serve` (issue 5).

A config-only model directory with the released model's layer shapes but only
a few layers (random weights: ``--load-format dummy``) is served with the seed
flags; sections talk to it over HTTP on 127.0.0.1:

  serve        completions of 100 / 1k / 8k / 32k / 64k-token prompts (token ids,
               so lengths are exact; 16 greedy tokens, logprobs) and one chat
               completion: prompt tokens, latency (s), output non-empty, every
               logprob finite.  Every server stop (SIGINT) is timed and checked
               (exit within 60 s with code 0 or the SIGINT code).
  concurrency  64 concurrent greedy requests of mixed lengths, then each alone:
               exact token-id matches, first divergence position and the
               top-1/top-2 logprob margin there (ties under random weights).
  throughput   per mode (CUDA graphs FULL_AND_PIECEWISE / eager x KV fp8 / auto):
               decode tokens/s and ms/token at batch 1 and 32 (512-token prompts,
               256 tokens, ignore_eos; from the engine's timestamps via /metrics)
               and TTFT (ms) of 8k and 32k prompts.
  bench_ab     seed 002's A/B: `vllm bench serve` (random dataset) against the
               FP8-KV server with VLLM_MINIMAX_M3_FOLD_KV_SCALE=1 (fold) and 0:
               output tokens/s and median TTFT (ms).

Jobs that share a server configuration run together, so each configuration
starts once (5 starts for all sections on GPU).  One failing job or section
does not stop the others.  Results: $OUT/e2e.md (dated report), $OUT/e2e.json,
$OUT/serve.log (all servers), $OUT/bench.log (all `vllm bench serve` runs);
the report is rewritten after every job, so a killed run still leaves one.

  python ci/gpu_e2e.py [--sections serve,concurrency,throughput,bench_ab]
                       [--wheels /tmp/gpu-extra/wheels] [--deadline 560]
  python ci/gpu_e2e.py --smoke-cpu      # same flow, tiny shapes, on CPU

Sizes (defaults on GPU): --ab-isl 8192,131072 --ab-osl 128 --ab-concurrency 4,8
--ab-prompts-per-conc 2 (num-prompts = 2 x concurrency); with bench_ab selected
every server gets --max-model-len >= the longest ISL + OSL (132096), else 70000.
--tp-modes picks throughput modes.  --deadline S: no job starts after S seconds
(skipped jobs are reported); SIGTERM stops the servers and writes the report.
--wheels DIR: if uvicorn / model_hosting_container_standards do not import, the
wheels of ci/gpu_extra_wheels.sh in DIR are installed (no index) first.

Expected GPU wall (H200, estimates): start-up ~60-90 s per graphs server
(torch.compile + capture), ~30-40 s eager; serve ~10 s, concurrency ~20 s,
throughput ~15 s per mode, bench_ab ~90-120 s per fold at the defaults; all
sections ~9-10 min, so split across two calls (e.g. serve,concurrency,throughput
then bench_ab) when a call is limited to 10 min.

Random dummy weights (uniform +-1e-3) make near-uniform logits: greedy outputs
are often one repeated token and top-1/top-2 margins tiny, so a concurrency
mismatch can be a tie flipped by batching; the report gives the margins.

Exit status: 0 when every selected section passed, 1 otherwise.
"""

import argparse
import asyncio
import dataclasses
import datetime
import glob
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path

SECTIONS = ("serve", "concurrency", "throughput", "bench_ab")
SERVED_NAME = "minimax-m3-e2e"
FOLD_ENV = "VLLM_MINIMAX_M3_FOLD_KV_SCALE"
SERVER_MODULES = ("uvicorn", "model_hosting_container_standards")
SPECIAL_WORDS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_WORDS = ["user", "assistant", "system", ":", "hello", "what", "is", "vllm", "?", "."]
FIRST_PLAIN_ID = len(SPECIAL_WORDS) + len(CHAT_WORDS)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
T0 = time.monotonic()


class Stop(BaseException):
    """SIGTERM (e.g. the caller's time limit): stop servers, write the report."""


# --------------------------------------------------------------- model directory
def text_config(layers: int = 4, smoke: bool = False, max_pos: int = 262144) -> dict:
    """MiniMax-M3 text config in transformers' normalized form.

    GPU: the released layer shapes (hidden 6144, 64 q / 4 KV heads of 128,
    MoE 128 x 3072 top-4 + shared 3072, index 4 x 128, blocks of 128, top-16),
    vocab cut to 32000; the first half of the layers dense attention + dense
    MLP (12288), the rest MSA + MoE.  smoke: tiny shapes for CPU."""
    n_dense = layers // 2
    if smoke:
        shapes = dict(vocab_size=512, hidden_size=64, intermediate_size=32,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      dense_intermediate_size=48, shared_intermediate_size=32,
                      num_local_experts=4, num_experts_per_tok=2, rotary_dim=16,
                      index_n_heads=2, index_head_dim=32, index_block_size=32,
                      index_topk_blocks=2, rope_theta=10000.0)
    else:
        shapes = dict(vocab_size=32000, hidden_size=6144, intermediate_size=3072,
                      num_attention_heads=64, num_key_value_heads=4, head_dim=128,
                      dense_intermediate_size=12288, shared_intermediate_size=3072,
                      num_local_experts=128, num_experts_per_tok=4, rotary_dim=64,
                      index_n_heads=4, index_head_dim=128, index_block_size=128,
                      index_topk_blocks=16, rope_theta=5e6)
    theta = shapes.pop("rope_theta")
    return dict(
        shapes,
        model_type="minimax_m3_vl_text",
        num_hidden_layers=layers,
        layer_types=["full_attention"] * n_dense + ["minimax_m3_sparse"] * (layers - n_dense),
        mlp_layer_types=["dense"] * n_dense + ["sparse"] * (layers - n_dense),
        rope_parameters={"rope_type": "default", "rope_theta": theta,
                         "partial_rotary_factor": 0.5},
        index_local_blocks=1,
        hidden_act="silu",  # what transformers writes; read as swigluoai
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        routed_scaling_factor=2.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=max_pos,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def make_model_dir(path: str, layers: int = 4, smoke: bool = False) -> dict:
    """Write config.json (``minimax_m3_vl`` wrapper around ``text_config``, a
    tiny vision config that --language-model-only never builds) and a matching
    tokenizer into ``path``; returns the text config."""
    os.makedirs(path, exist_ok=True)
    text = text_config(layers, smoke)
    cfg = {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
        "model_type": "minimax_m3_vl",
        "text_config": text,
        "vision_config": {"model_type": "minimax_m3_vl_vision", "hidden_size": 32,
                          "intermediate_size": 32, "num_hidden_layers": 1,
                          "num_attention_heads": 2},
        "projector_hidden_size": 64,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    build_tokenizer(path, text["vocab_size"])
    return text


def build_tokenizer(path: str, vocab_size: int) -> None:
    """Word-level tokenizer with exactly ``vocab_size`` entries: specials, a few
    chat words, then ``t<id>``.  Whitespace-split, so decode -> encode of any
    non-special id list is exact (what `vllm bench serve --dataset-name random`
    needs); a jinja chat template for /v1/chat/completions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIAL_WORDS + CHAT_WORDS
    vocab = {w: i for i, w in enumerate(words)}
    vocab.update({f"t{i}": i for i in range(len(words), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", model_max_length=1 << 22)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


# ----------------------------------------------------------------- environment
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


# ---------------------------------------------------------------------- plan
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


# -------------------------------------------------------------------- servers
@dataclasses.dataclass(frozen=True)
class ServerCfg:
    """One server configuration: KV dtype, CUDA graphs or eager, FP8 KV-scale
    folding (env VLLM_MINIMAX_M3_FOLD_KV_SCALE), max model length (tokens)."""
    kv: str = "fp8"
    graphs: bool = True
    fold: bool = True
    max_len: int = 70000

    @property
    def label(self) -> str:
        return f"{'graphs' if self.graphs else 'eager'}/kv-{self.kv}/fold-{int(self.fold)}"


def server_args(cfg: ServerCfg, plan: Plan) -> list[str]:
    """`vllm serve` flags (without host/port) for ``cfg``; on CPU (smoke) the
    KV dtype is auto and the engine eager whatever ``cfg`` asks."""
    a = ["--load-format", "dummy", "--served-model-name", SERVED_NAME,
         "--block-size", str(plan.block), "--language-model-only",
         "--no-enable-prefix-caching", "--enable-chunked-prefill",
         "--max-num-batched-tokens", str(plan.batched_tokens),
         "--max-num-seqs", str(plan.max_seqs), "--max-model-len", str(cfg.max_len),
         "--dtype", plan.dtype, "--seed", "0"]
    if plan.smoke:
        return a + ["--kv-cache-dtype", "auto", "--enforce-eager",
                    "--kv-cache-memory-bytes", "256M"]
    a += ["--kv-cache-dtype", cfg.kv]
    if cfg.graphs:
        return a + ["--compilation-config", json.dumps({"cudagraph_mode": "FULL_AND_PIECEWISE"})]
    return a + ["--enforce-eager"]


def server_key(cfg: ServerCfg, plan: Plan) -> tuple:
    """Servers with equal flags and env are one server (reused)."""
    return tuple(server_args(cfg, plan)), cfg.fold


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
                       "env": f"{FOLD_ENV}={int(cfg.fold)}"}
        self.proc = None

    def start(self) -> None:
        """Start and wait for /health; records start-up seconds or raises."""
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", self.plan.model,
               "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        env = dict(os.environ, **{FOLD_ENV: str(int(self.cfg.fold))})
        log = open(self.plan.out / "serve.log", "a")
        log.write(f"\n===== {datetime.datetime.now():%H:%M:%S} {self.cfg.label}: "
                  f"{FOLD_ENV}={int(self.cfg.fold)} {' '.join(cmd)}\n")
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


def warm_up(server: Server, plan: Plan) -> None:
    """Before any measurement: a few concurrent short requests and one prompt of
    min(8192, max_len / 2) tokens, so Triton JIT and first-call costs are not
    timed; records the seconds."""
    t0 = time.monotonic()
    rng = random.Random(3)
    long_len = min(8192, plan.max_len // 2)

    async def body(aclient):
        await asyncio.gather(*(timed_stream(aclient, rand_ids(rng, 64 + 32 * i, plan.vocab), 8)
                               for i in range(4)))
        await timed_stream(aclient, rand_ids(rng, long_len, plan.vocab), 8)

    run_async(server, plan.request_timeout, body)
    server.record["warmup_s"] = round(time.monotonic() - t0, 1)


def log_tail(plan: Plan, n: int = 3000) -> str:
    try:
        return (plan.out / "serve.log").read_text(errors="replace")[-n:]
    except OSError:
        return ""


class Pool:
    """At most one running server; reused while the requested key matches.
    A configuration that failed to start is not retried."""

    def __init__(self, plan: Plan, records: list):
        self.plan, self.records = plan, records
        self.key, self.server, self.failed = None, None, {}

    def get(self, cfg: ServerCfg) -> Server:
        key = server_key(cfg, self.plan)
        if key in self.failed:
            raise RuntimeError(f"server {cfg.label} failed to start earlier: {self.failed[key]}")
        if key == self.key and self.server.proc.poll() is None:
            return self.server
        self.close()
        server = Server(cfg, self.plan)
        self.records.append(server.record)
        self.key, self.server = key, server  # close() stops it, whatever happens next
        try:
            server.start()
            warm_up(server, self.plan)
        except Exception as e:
            server.record["error"] = f"{type(e).__name__}: {e}"[:300]
            self.failed[key] = server.record["error"].splitlines()[0]
            self.close()
            raise
        return server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.key, self.server = None, None


# ---------------------------------------------------------------- client helpers
def rand_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    """``n`` random non-special token ids."""
    return [rng.randrange(FIRST_PLAIN_ID, vocab) for _ in range(n)]


def client_kwargs(server: "Server", timeout: float) -> dict:
    return dict(base_url=server.url + "/v1", api_key="EMPTY", timeout=timeout, max_retries=0)


def sync_client(server: "Server", timeout: float):
    import openai

    return openai.OpenAI(**client_kwargs(server, timeout))


def run_async(server: "Server", timeout: float, body):
    """``asyncio.run(body(aclient))`` with an AsyncOpenAI client that lives and
    closes inside that one event loop."""
    import openai

    async def main():
        async with openai.AsyncOpenAI(**client_kwargs(server, timeout)) as aclient:
            return await body(aclient)

    return asyncio.run(main())


def finite(values) -> bool:
    """Every logprob finite (vLLM writes -inf as -9999.0: counted as not finite)."""
    return all(v is not None and math.isfinite(v) and v > -9000.0 for v in values)


def choice_token_ids(choice) -> list[int]:
    ids = getattr(choice, "token_ids", None)
    if ids is None and choice.model_extra:
        ids = choice.model_extra.get("token_ids")
    return list(ids or [])


def completion_record(choice, usage) -> dict:
    """Token ids, logprobs (chosen and top-k) and finiteness of one choice."""
    lp = choice.logprobs
    chosen = list(lp.token_logprobs or []) if lp else []
    tops = [sorted((d or {}).values(), reverse=True) for d in (lp.top_logprobs or [])] if lp else []
    return {"tokens": choice_token_ids(choice), "logprobs": chosen, "top": tops,
            "text_nonempty": bool(choice.text and choice.text.strip()),
            "finite": finite(chosen) and all(finite(t) for t in tops),
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}


def complete(client, prompt, max_tokens: int, logprobs: int = 1) -> dict:
    """One greedy completion (ignore_eos) with token ids and logprobs; latency in s."""
    t0 = time.perf_counter()
    r = client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
        logprobs=logprobs, extra_body={"return_token_ids": True, "ignore_eos": True,
                                       "skip_special_tokens": False})
    rec = completion_record(r.choices[0], r.usage)
    rec["latency_s"] = round(time.perf_counter() - t0, 3)
    return rec


async def acomplete(aclient, prompt, max_tokens: int, logprobs: int = 2) -> dict:
    r = await aclient.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
        logprobs=logprobs, extra_body={"return_token_ids": True, "ignore_eos": True,
                                       "skip_special_tokens": False})
    return completion_record(r.choices[0], r.usage)


async def timed_stream(aclient, prompt, max_tokens: int) -> dict:
    """Streamed greedy completion (ignore_eos): absolute start, first-chunk and
    end times (perf_counter s), tokens in the first chunk (> 1 when the stream
    coalesced) and the completion token count from usage."""
    t0 = time.perf_counter()
    first, n_first, n = None, 0, 0
    stream = await aclient.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True})
    async for chunk in stream:
        if chunk.choices and first is None:
            first = time.perf_counter()
            n_first = len(choice_token_ids(chunk.choices[0])) or 1
        if chunk.usage:
            n = chunk.usage.completion_tokens
    return {"t0": t0, "first": first or time.perf_counter(), "end": time.perf_counter(),
            "n": n, "n_first": n_first}


# ------------------------------------------------------------------ jobs
@dataclasses.dataclass
class Job:
    section: str
    name: str
    cfg: ServerCfg
    fn: object  # fn(server, plan) -> dict with "ok"


def main_cfg(plan: Plan) -> ServerCfg:
    return ServerCfg(kv=plan.main_kv, graphs=not plan.smoke, fold=True, max_len=plan.max_len)


# serve ---------------------------------------------------------------------
def serve_jobs(plan: Plan) -> list[Job]:
    """Completions at each prompt length and one chat completion, on the main server."""
    return [Job("serve", "completions+chat", main_cfg(plan), run_serve)]


def run_serve(server: Server, plan: Plan) -> dict:
    """Per prompt length: prompt tokens, latency (s, 16 greedy tokens, non-streamed),
    output non-empty, logprobs finite.  Then one chat completion."""
    client = sync_client(server, plan.request_timeout)
    rng, rows = random.Random(0), []
    for n in plan.serve_lens:
        try:
            rec = complete(client, rand_ids(rng, n, plan.vocab), plan.serve_max_tokens)
            rows.append({"prompt_len": n, "prompt_tokens": rec["prompt_tokens"],
                         "completion_tokens": rec["completion_tokens"],
                         "latency_s": rec["latency_s"], "text_nonempty": rec["text_nonempty"],
                         "logprobs_finite": rec["finite"],
                         "distinct_tokens": len(set(rec["tokens"])),
                         "ok": rec["prompt_tokens"] == n and rec["finite"] and rec["text_nonempty"]
                         and rec["completion_tokens"] == plan.serve_max_tokens})
        except Exception as e:
            rows.append({"prompt_len": n, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
    chat = run_chat(client, plan)
    return {"ok": all(r["ok"] for r in rows) and chat["ok"], "rows": rows, "chat": chat}


def run_chat(client, plan: Plan) -> dict:
    """One chat completion through the tokenizer's chat template."""
    try:
        t0 = time.perf_counter()
        r = client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "hello what is vllm ?"}],
            max_tokens=plan.serve_max_tokens, temperature=0.0, logprobs=True, top_logprobs=1,
            extra_body={"ignore_eos": True, "skip_special_tokens": False})
        c = r.choices[0]
        lps = [t.logprob for t in (c.logprobs.content or [])] if c.logprobs else []
        out = {"role": c.message.role, "prompt_tokens": r.usage.prompt_tokens,
               "completion_tokens": r.usage.completion_tokens,
               "latency_s": round(time.perf_counter() - t0, 3),
               "content_nonempty": bool((c.message.content or "").strip()),
               "logprobs_finite": finite(lps) and len(lps) == plan.serve_max_tokens}
        out["ok"] = (out["role"] == "assistant" and out["content_nonempty"]
                     and out["logprobs_finite"])
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    return out


# concurrency ---------------------------------------------------------------
def concurrency_jobs(plan: Plan) -> list[Job]:
    return [Job("concurrency", f"{plan.conc_n} concurrent vs alone", main_cfg(plan),
                run_concurrency)]


def run_concurrency(server: Server, plan: Plan) -> dict:
    """``conc_n`` concurrent greedy requests (random lengths in ``conc_lens``,
    seed 1), then each alone: exact token-id equality per request; for a
    mismatch the first differing position and the alone run's top-1 minus
    top-2 logprob there (a margin near 0 is a tie that batching may flip)."""
    client = sync_client(server, plan.request_timeout)
    rng = random.Random(1)
    prompts = [rand_ids(rng, rng.randint(*plan.conc_lens), plan.vocab) for _ in range(plan.conc_n)]

    async def all_at_once(aclient):
        return await asyncio.gather(
            *(acomplete(aclient, p, plan.conc_max_tokens) for p in prompts),
            return_exceptions=True)

    t0 = time.perf_counter()
    together = run_async(server, plan.request_timeout, all_at_once)
    t_conc = time.perf_counter() - t0
    t0 = time.perf_counter()
    alone = []
    for p in prompts:
        try:
            alone.append(complete(client, p, plan.conc_max_tokens, logprobs=2))
        except Exception as e:
            alone.append(e)
    t_alone = time.perf_counter() - t0
    errors = [f"{type(r).__name__}: {r}"[:200] for r in together + alone
              if isinstance(r, Exception)]
    matches, diverged, nonfinite, max_lp_diff = 0, [], 0, 0.0
    for i, (a, b) in enumerate(zip(together, alone)):
        if isinstance(a, Exception) or isinstance(b, Exception):
            continue
        nonfinite += (not a["finite"]) + (not b["finite"])
        if a["tokens"] == b["tokens"] and a["tokens"]:
            matches += 1
            max_lp_diff = max(max_lp_diff, max_diff(a["logprobs"], b["logprobs"]) or 0)
            continue
        pos = next((k for k, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y),
                   min(len(a["tokens"]), len(b["tokens"])))
        top = b["top"][pos] if pos < len(b["top"]) else []
        margin = top[0] - top[1] if len(top) > 1 else None
        diverged.append({"request": i, "prompt_len": len(prompts[i]), "first_divergence": pos,
                         "alone_top1_minus_top2": margin,
                         "max_logprob_diff_before": max_diff(a["logprobs"][:pos],
                                                             b["logprobs"][:pos])})
        max_lp_diff = max(max_lp_diff, max_diff(a["logprobs"][:pos], b["logprobs"][:pos]) or 0)
    return {"ok": not errors and nonfinite == 0 and matches == len(prompts),
            "requests": len(prompts), "exact_matches": matches, "errors": errors[:5],
            "n_errors": len(errors), "nonfinite_logprob_runs": nonfinite,
            "mismatches": diverged, "max_logprob_diff_equal_prefix": max_lp_diff,
            "distinct_tokens": len({t for r in alone if isinstance(r, dict) for t in r["tokens"]}),
            "concurrent_wall_s": round(t_conc, 2),
            "sequential_wall_s": round(t_alone, 2),
            "prompt_lens": f"{min(map(len, prompts))}..{max(map(len, prompts))}",
            "max_tokens": plan.conc_max_tokens}


def max_diff(xs, ys):
    """Largest |x - y| of two logprob lists (None when empty or not finite)."""
    d = [abs(x - y) for x, y in zip(xs, ys)]
    return max(d) if d and finite(xs) and finite(ys) else None


# throughput ----------------------------------------------------------------
def mode_cfg(mode: str, plan: Plan) -> ServerCfg:
    """'graphs:fp8' -> ServerCfg; graphs = FULL_AND_PIECEWISE CUDA graphs."""
    kind, kv = mode.split(":")
    return ServerCfg(kv=kv, graphs=kind == "graphs", fold=True, max_len=plan.max_len)


def throughput_jobs(plan: Plan) -> list[Job]:
    return [Job("throughput", m, mode_cfg(m, plan), run_throughput) for m in plan.tp_modes]


ENGINE_METRICS = ("vllm:request_decode_time_seconds_sum", "vllm:request_decode_time_seconds_count",
                  "vllm:request_generation_tokens_sum", "vllm:request_prefill_time_seconds_sum",
                  "vllm:request_prefill_time_seconds_count")


def scrape(server: Server) -> dict:
    """The server's Prometheus counters in ENGINE_METRICS, summed over labels."""
    text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    out = dict.fromkeys(ENGINE_METRICS, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def engine_delta(server: Server, before: dict, n_requests: int) -> dict:
    """Counter deltas since ``before`` once ``n_requests`` more have finished
    (the server records a request as it finishes; wait up to 5 s)."""
    for _ in range(50):
        d = {k: v - before[k] for k, v in scrape(server).items()}
        if d["vllm:request_decode_time_seconds_count"] >= n_requests:
            break
        time.sleep(0.1)
    return d


def run_throughput(server: Server, plan: Plan) -> dict:
    """Per batch size b (b concurrent requests, ``tp_prompt``-token prompts,
    ``tp_out`` tokens, ignore_eos), from the engine's own timestamps
    (/metrics: request decode time = first to last token): decode tokens/s =
    b x tokens after the first / mean decode time, and ms per output token.
    The client-side view (streamed chunks) is kept in the JSON.  TTFT ms per
    prompt length: client-side, median of ``tp_repeats`` single requests, and
    the engine's prefill ms (scheduled to first token)."""
    rng = random.Random(2)
    out = {"flags": server.record["flags"], "ok": True}

    async def batch(aclient, b: int, prompt_len: int, max_tokens: int):
        ps = [rand_ids(rng, prompt_len, plan.vocab) for _ in range(b)]
        return await asyncio.gather(*(timed_stream(aclient, p, max_tokens) for p in ps))

    async def decode(aclient, b: int):
        before = scrape(server)
        rs = await batch(aclient, b, plan.tp_prompt, plan.tp_out)
        d = engine_delta(server, before, b)
        gen = d["vllm:request_generation_tokens_sum"] - d["vllm:request_decode_time_seconds_count"]
        mean_decode = d["vllm:request_decode_time_seconds_sum"] / max(
            d["vllm:request_decode_time_seconds_count"], 1)
        out[f"decode_tok_s_b{b}"] = round(gen / mean_decode, 1) if mean_decode > 0 else None
        out[f"ms_per_token_b{b}"] = round(1000 * d["vllm:request_decode_time_seconds_sum"]
                                          / max(gen, 1), 2)
        window = max(r["end"] for r in rs) - max(r["first"] for r in rs)
        client_toks = sum(r["n"] - r["n_first"] for r in rs)
        out[f"client_decode_tok_s_b{b}"] = round(client_toks / window, 1) if window > 0 else None
        out[f"client_first_chunk_max_b{b}"] = max(r["n_first"] for r in rs)
        out[f"tokens_b{b}"] = sorted({r["n"] for r in rs})
        out["ok"] &= all(r["n"] == plan.tp_out for r in rs)

    async def ttft(aclient, n: int):
        before = scrape(server)
        ts = [(await batch(aclient, 1, n, 1))[0] for _ in range(plan.tp_repeats)]
        d = engine_delta(server, before, plan.tp_repeats)
        out[f"ttft_ms_{n}"] = round(1000 * statistics.median(r["first"] - r["t0"] for r in ts), 1)
        out[f"prefill_ms_{n}"] = round(1000 * d["vllm:request_prefill_time_seconds_sum"]
                                       / max(d["vllm:request_prefill_time_seconds_count"], 1), 1)

    async def measure(aclient):
        steps = [(f"b{b}", decode, b) for b in plan.tp_batches]
        steps += [(f"ttft_{n}", ttft, n) for n in plan.tp_ttft_lens]
        for name, fn, arg in steps:
            try:
                await fn(aclient, arg)
            except Exception as e:
                out[f"error_{name}"] = f"{type(e).__name__}: {e}"[:300]
                out["ok"] = False

    run_async(server, plan.request_timeout, measure)
    return out


# bench_ab ------------------------------------------------------------------
def ab_max_len(plan: Plan) -> int:
    """Smallest max-model-len (multiple of 1024) that fits the longest A/B case."""
    need = max(plan.ab_isl) + plan.ab_osl + 64
    return -(-need // 1024) * 1024


def bench_ab_jobs(plan: Plan) -> list[Job]:
    """One `vllm bench serve` run per (fold on/off, ISL, concurrency)."""
    jobs = []
    for fold in plan.ab_folds:
        cfg = dataclasses.replace(main_cfg(plan), fold=fold)
        for isl in plan.ab_isl:
            for c in plan.ab_conc:
                name = f"isl{isl}-osl{plan.ab_osl}-c{c}-fold{int(fold)}"
                jobs.append(Job("bench_ab", name, cfg,
                                lambda s, p, isl=isl, c=c, n=name: run_bench(s, p, isl, c, n)))
    return jobs


def _set_arg(args: list[str], flag: str, value: str) -> list[str]:
    """A copy of a CLI argument list with ``flag``'s value replaced."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def run_bench(server: Server, plan: Plan, isl: int, conc: int, name: str) -> dict:
    """`vllm bench serve --backend vllm --dataset-name random` (greedy,
    ignore_eos, --num-prompts = concurrency x ab_prompts_per_conc): output
    tokens/s and median TTFT (ms) from its --save-result JSON."""
    n = conc * plan.ab_prompts_per_conc
    rdir = plan.work / "bench"
    rdir.mkdir(exist_ok=True)
    args = ["bench", "serve", "--backend", "vllm", "--host", "127.0.0.1",
            "--port", str(server.port), "--model", SERVED_NAME, "--tokenizer", plan.model,
            "--dataset-name", "random", "--random-input-len", str(isl),
            "--random-output-len", str(plan.ab_osl), "--max-concurrency", str(conc),
            "--num-prompts", str(n), "--ignore-eos", "--temperature", "0", "--seed", "0",
            "--disable-tqdm", "--save-result", "--result-dir", str(rdir),
            "--result-filename", f"{name}.json"]
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *args]
    out = {"cmd": "vllm " + " ".join(args).replace(str(plan.model), "<model-dir>"),
           "isl": isl, "osl": plan.ab_osl, "concurrency": conc, "num_prompts": n,
           "fold": server.cfg.fold}
    # Unrecorded warm-up at the same ISL and concurrency (OSL 8): the first
    # batch of a new shape pays Triton JIT / first-call costs, which otherwise
    # land in whichever fold runs first (seen: 6x TTFT on the first case).
    warm = [a for a in args if a not in ("--save-result",)]
    warm = _set_arg(_set_arg(_set_arg(warm, "--num-prompts", str(conc)),
                             "--random-output-len", "8"), "--seed", "1")
    warm = warm[:warm.index("--result-dir")]
    with open(plan.out / "bench.log", "a") as log:
        log.write(f"\n===== {name} warm-up ({server.cfg.label})\n")
        log.flush()
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", *warm],
                           stdout=log, stderr=subprocess.STDOUT,
                           timeout=min(plan.ab_timeout, max(plan.remaining(), 30)))
        except subprocess.TimeoutExpired:
            pass
        out["warmup_s"] = round(time.monotonic() - t0, 1)
        log.write(f"\n===== {name} ({server.cfg.label}, {FOLD_ENV}={int(server.cfg.fold)})\n")
        log.flush()
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                timeout=min(plan.ab_timeout, max(plan.remaining(), 30))).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    out["wall_s"] = round(time.monotonic() - t0, 1)
    res_file = rdir / f"{name}.json"
    if rc != 0 or not res_file.exists():
        return {**out, "ok": False, "error": f"vllm bench serve rc {rc}; see bench.log"}
    res = json.loads(res_file.read_text())
    out.update({k: res.get(k) for k in ("completed", "failed", "duration", "output_throughput",
                                         "median_ttft_ms", "median_tpot_ms",
                                         "total_input_tokens", "total_output_tokens")})
    out["ok"] = out["completed"] == n and not out["failed"]
    return out


JOBS = {"serve": serve_jobs, "concurrency": concurrency_jobs,
        "throughput": throughput_jobs, "bench_ab": bench_ab_jobs}


# ------------------------------------------------------------------- runner
def order_jobs(jobs: list[Job], plan: Plan) -> list[Job]:
    """Group jobs by server (main configuration first, then first appearance);
    within a server keep the sections' order.  Each server starts once."""
    keys = [server_key(main_cfg(plan), plan)]
    for j in jobs:
        if server_key(j.cfg, plan) not in keys:
            keys.append(server_key(j.cfg, plan))
    return sorted(jobs, key=lambda j: keys.index(server_key(j.cfg, plan)))


def run_jobs(jobs: list[Job], plan: Plan, state: dict) -> None:
    """Run every job on its server; record each result (or error / skip) and
    rewrite the report after each."""
    pool = Pool(plan, state["servers"])
    try:
        for job in order_jobs(jobs, plan):
            slot = state["results"].setdefault(job.section, {})
            if plan.remaining() <= 0:
                slot[job.name] = {"ok": False, "skipped": "deadline reached"}
                continue
            t0 = time.monotonic()
            try:
                server = pool.get(job.cfg)
                slot[job.name] = job.fn(server, plan)
            except Stop:
                slot[job.name] = {"ok": False, "error": "stopped (SIGTERM)"}
                raise
            except Exception as e:
                slot[job.name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:1500],
                                  "traceback": traceback.format_exc()[-1500:]}
            slot[job.name]["job_s"] = round(time.monotonic() - t0, 1)
            slot[job.name]["server"] = job.cfg.label
            write_report(plan, state)
    finally:
        pool.close()
        write_report(plan, state)


# ------------------------------------------------------------------- report
def section_status(state: dict, sec: str) -> str:
    res = state["results"].get(sec)
    if not res:
        return "not run"
    bad_stop = not all(s.get("clean_stop") for s in state["servers"] if "stop_rc" in s)
    if any(not r.get("ok") and "skipped" not in r for r in res.values()) or (
            sec == "serve" and bad_stop):
        return "FAIL"
    if any("skipped" in r for r in res.values()):
        return "incomplete (deadline)"
    return "pass"


def fmt(v, unit: str = "") -> str:
    return "-" if v is None else f"{v}{unit}"


def md_serve(res: dict, state: dict) -> list[str]:
    lines = ["| prompt len | prompt tokens | completion tokens | latency (s) | text non-empty "
             "| logprobs finite | distinct tokens | ok |", "|---|---|---|---|---|---|---|---|"]
    for job in res.values():
        for r in job.get("rows", []):
            lines.append(f"| {r['prompt_len']} | {fmt(r.get('prompt_tokens'))} | "
                         f"{fmt(r.get('completion_tokens'))} | {fmt(r.get('latency_s'))} | "
                         f"{fmt(r.get('text_nonempty'))} | {fmt(r.get('logprobs_finite'))} | "
                         f"{fmt(r.get('distinct_tokens'))} | {r['ok']} {r.get('error', '')} |")
        if job.get("chat"):
            lines += ["", f"chat completion: `{json.dumps(job['chat'])}`"]
        if job.get("error") or job.get("skipped"):
            lines += ["", f"error: `{(job.get('error') or job['skipped'])[:500]}`"]
    stops = [s for s in state["servers"] if "stop_rc" in s]
    lines += ["", f"server stops (SIGINT, <= 60 s, rc 0 or SIGINT): "
              f"{sum(bool(s.get('clean_stop')) for s in stops)} of {len(stops)} clean"]
    return lines


def md_concurrency(res: dict, state: dict) -> list[str]:
    lines = []
    for name, r in res.items():
        if "requests" not in r:
            lines.append(f"{name}: `{r.get('error', r.get('skipped'))}`")
            continue
        lines += [f"{name}: {r['exact_matches']} of {r['requests']} concurrent outputs equal "
                  f"the alone outputs (prompts {r['prompt_lens']} tokens, {r['max_tokens']} "
                  f"greedy tokens, {r.get('distinct_tokens')} distinct token ids in all "
                  f"outputs); errors {r['n_errors']}; runs with non-finite logprobs "
                  f"{r['nonfinite_logprob_runs']}; largest |logprob difference| of a chosen "
                  f"token before any divergence {r['max_logprob_diff_equal_prefix']:.3g}; "
                  f"wall {r['concurrent_wall_s']} s together, "
                  f"{r['sequential_wall_s']} s one by one."]
        if r["mismatches"]:
            lines += ["", "| request | prompt len | first divergence | alone top1-top2 logprob "
                      "| max logprob diff before |", "|---|---|---|---|---|"]
            lines += [f"| {m['request']} | {m['prompt_len']} | {m['first_divergence']} | "
                      f"{fmt(m['alone_top1_minus_top2'])} | {fmt(m['max_logprob_diff_before'])} |"
                      for m in r["mismatches"][:20]]
        lines += [f"error: `{e}`" for e in r["errors"]]
    return lines


def md_throughput(res: dict, state: dict, plan: Plan) -> list[str]:
    b, lens = plan.tp_batches, plan.tp_ttft_lens
    head = ("| mode | " + " | ".join(f"decode tok/s b{x} | ms/token b{x}" for x in b) + " | "
            + " | ".join(f"TTFT ms {n} (engine prefill ms)" for n in lens) + " | ok |")
    lines = [f"{plan.tp_prompt}-token prompts, {plan.tp_out} output tokens (ignore_eos), "
             "greedy; decode numbers from the engine's timestamps (/metrics: first to last "
             f"token); TTFT client-side, median of {plan.tp_repeats}.", "",
             head, "|---" * (2 + 2 * len(b) + len(lens)) + "|"]
    for name, r in res.items():
        cells = [f"{fmt(r.get(f'decode_tok_s_b{x}'))} | {fmt(r.get(f'ms_per_token_b{x}'))}"
                 for x in b]
        cells += [f"{fmt(r.get(f'ttft_ms_{n}'))} ({fmt(r.get(f'prefill_ms_{n}'))})" for n in lens]
        err = " ".join(str(v)[:200] for k, v in r.items() if k.startswith(("error", "skipped")))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r.get('ok')} {err} |")
    if plan.smoke:
        lines += ["", "(smoke on CPU: every mode runs eager with KV auto)"]
    return lines


def md_bench_ab(res: dict, state: dict, plan: Plan) -> list[str]:
    lines = [f"`vllm bench serve` random dataset, OSL {plan.ab_osl}, num-prompts = "
             f"{plan.ab_prompts_per_conc} x concurrency, greedy, ignore_eos, KV {plan.main_kv}; "
             f"fold = {FOLD_ENV}=1 (default), unfolded = {FOLD_ENV}=0.", "",
             "| ISL/OSL | concurrency | prompts | metric | unfolded (0) | fold (1) | change |",
             "|---|---|---|---|---|---|---|"]
    if state["meta"].get("merged_from"):
        lines[0] += (" The two folds were served side by side, each on its own GPU of the "
                     "same machine (`--ab-folds 1` / `--ab-folds 0`, joined by `--merge-ab`).")
    runs = {(r["isl"], r["concurrency"], r["fold"]): r for r in res.values() if "isl" in r}
    for isl, c in sorted({k[:2] for k in runs}):
        off, on = runs.get((isl, c, False), {}), runs.get((isl, c, True), {})
        n = on.get("num_prompts", off.get("num_prompts"))
        for key, label in (("output_throughput", "output tok/s"),
                           ("median_ttft_ms", "TTFT median (ms)"),
                           ("median_tpot_ms", "TPOT median (ms)")):
            a, b = off.get(key), on.get(key)
            chg = f"{100 * (b - a) / a:+.1f}%" if a and b else "-"
            lines.append(f"| {isl}/{plan.ab_osl} | {c} | {n} | {label} | "
                         f"{fmt(a and round(a, 2))} | {fmt(b and round(b, 2))} | {chg} |")
    bad = {n: r.get("error") or r.get("skipped") for n, r in res.items() if not r.get("ok")}
    lines += [f"- {n}: `{str(e)[:300]}`" for n, e in bad.items()]
    cmd = next((r["cmd"] for r in res.values() if "cmd" in r), None)
    if cmd:
        lines += ["", f"example command: `{cmd}`"]
    return lines


def write_report(plan: Plan, state: dict) -> None:
    """$OUT/e2e.json (everything) and $OUT/e2e.md (dated summary + tables)."""
    state["wall_s"] = round(time.monotonic() - T0, 1)
    (plan.out / "e2e.json").write_text(json.dumps(state, indent=1, default=str))
    m, pre = state["meta"], state["meta"].get("preflight", {})
    lines = ["# MiniMax-M3 end-to-end serving validation" + (" (CPU smoke)" if plan.smoke else ""),
             "", f"date: {m['date']} | GPU: {pre.get('gpu', '?')} | vllm: {pre.get('vllm', '?')} | "
             f"torch: {pre.get('torch', '?')} | repo commit: {m['git_commit']} | "
             f"wall: {state['wall_s']} s", "",
             f"model: {m['model']} (random weights, --load-format dummy)", "",
             f"server deps: `{json.dumps(m.get('deps'))}`", "",
             "| section | status | wall (s) |", "|---|---|---|"]
    for sec in state["sections"]:
        wall = sum(r.get("job_s", 0) for r in state["results"].get(sec, {}).values())
        lines.append(f"| {sec} | {section_status(state, sec)} | {wall:.0f} |")
    render = {"serve": md_serve, "concurrency": md_concurrency,
              "throughput": lambda r, s: md_throughput(r, s, plan),
              "bench_ab": lambda r, s: md_bench_ab(r, s, plan)}
    for sec in state["sections"]:
        if state["results"].get(sec):
            lines += ["", f"## {sec}", ""] + render[sec](state["results"][sec], state)
    lines += ["", "## servers", "", "| config | env | start (s) | warm-up (s) | stop rc | stop (s) "
              "| clean stop | error |", "|---|---|---|---|---|---|---|---|"]
    for s in state["servers"]:
        lines.append(f"| {s['config']} | {s['env']} | {fmt(s.get('start_s'))} | "
                     f"{fmt(s.get('warmup_s'))} | "
                     f"{fmt(s.get('stop_rc'))} | {fmt(s.get('stop_s'))} | "
                     f"{fmt(s.get('clean_stop'))} | {str(s.get('error', ''))[:200]} |")
    if state["servers"]:
        lines += ["", f"flags (first server): `{state['servers'][0]['flags']}`"]
    (plan.out / "e2e.md").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="comma list of " + ", ".join(SECTIONS))
    ap.add_argument("--smoke-cpu", action="store_true", help="tiny shapes on CPU")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--workdir", default=None, help="model dir and scratch (default: a temp dir)")
    ap.add_argument("--wheels", default=None, help="dir of ci/gpu_extra_wheels.sh wheels")
    ap.add_argument("--layers", type=int, default=4, help="layers: half dense, half MSA+MoE")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="seconds after start after which no job starts (0 = none)")
    ap.add_argument("--startup-timeout", type=float, default=None)
    ap.add_argument("--tp-modes", default=None, help="e.g. graphs:fp8,eager:fp8")
    ap.add_argument("--ab-isl", default=None, help="comma list, e.g. 8192,131072")
    ap.add_argument("--ab-osl", type=int, default=None)
    ap.add_argument("--ab-concurrency", default=None, help="comma list, e.g. 4,8")
    ap.add_argument("--ab-prompts-per-conc", type=int, default=None)
    ap.add_argument("--ab-folds", default=None,
                    help="fold settings to serve, e.g. 1 or 0 (default 1,0: both, one "
                         "after the other); run 1 and 0 on two GPUs side by side and join "
                         "the halves with --merge-ab")
    ap.add_argument("--merge-ab", nargs="+", default=None, metavar="E2E_JSON",
                    help="only write --out/e2e.{md,json} joining the bench_ab results "
                         "of these e2e.json files (one per fold)")
    return ap.parse_args(argv)


def make_plan(a: argparse.Namespace) -> Plan:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="m3-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = Plan(smoke=a.smoke_cpu, out=out, work=work, deadline=a.deadline)
    if a.smoke_cpu:
        plan = dataclasses.replace(plan, **smoke_overrides())
    def ints(text):
        return text and tuple(int(x) for x in text.split(","))

    over = {"startup_timeout": a.startup_timeout, "ab_osl": a.ab_osl,
            "ab_prompts_per_conc": a.ab_prompts_per_conc,
            "tp_modes": a.tp_modes and tuple(a.tp_modes.split(",")),
            "ab_isl": ints(a.ab_isl), "ab_conc": ints(a.ab_concurrency),
            "ab_folds": a.ab_folds and tuple(bool(int(x)) for x in a.ab_folds.split(","))}
    return dataclasses.replace(plan, **{k: v for k, v in over.items() if v})


def on_sigterm(signum, frame):
    raise Stop()


def merge_ab(a: argparse.Namespace) -> int:
    """Join the bench_ab halves of runs made side by side (fold 1 on one GPU,
    fold 0 on another) into one report under --out."""
    parts = [json.loads(Path(f).read_text()) for f in a.merge_ab]
    state = dict(parts[0], sections=["bench_ab"], servers=[], results={"bench_ab": {}})
    state["meta"] = dict(parts[0]["meta"], merged_from=[str(f) for f in a.merge_ab])
    for p in parts:
        state["results"]["bench_ab"].update(p["results"].get("bench_ab", {}))
        state["servers"] += p.get("servers", [])
    plan = make_plan(a)
    global T0
    T0 = time.monotonic() - max(p.get("wall_s", 0) for p in parts)
    write_report(plan, state)
    status = section_status(state, "bench_ab")
    print(json.dumps({"bench_ab": status}), f"report: {plan.out / 'e2e.md'}")
    return 0 if status == "pass" else 1


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.merge_ab:
        return merge_ab(a)
    sections = [s for s in a.sections.split(",") if s]
    bad = sorted(set(sections) - set(SECTIONS))
    if bad:
        sys.exit(f"unknown sections {bad}; choose from {SECTIONS}")
    plan = make_plan(a)
    signal.signal(signal.SIGTERM, on_sigterm)
    for f in ("serve.log", "bench.log"):
        (plan.out / f).unlink(missing_ok=True)
    deps = ensure_server_deps(a.wheels)
    text = make_model_dir(str(plan.work / "model"), a.layers, plan.smoke)
    plan.model, plan.vocab = str(plan.work / "model"), text["vocab_size"]
    if "bench_ab" in sections:
        plan.max_len = max(plan.max_len, ab_max_len(plan))
    state = {
        "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "git_commit": os.environ.get("GIT_COMMIT", "unknown"), "argv": sys.argv[1:],
                 "mode": "smoke-cpu" if plan.smoke else "gpu", "deps": deps,
                 "model": ", ".join(f"{k}={text[k]}" for k in (
                     "num_hidden_layers", "hidden_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok",
                     "index_n_heads", "index_block_size", "index_topk_blocks", "vocab_size")),
                 "max_model_len": plan.max_len},
        "sections": sections, "results": {}, "servers": [],
    }
    state["meta"]["preflight"] = preflight()
    write_report(plan, state)
    jobs = [j for s in sections for j in JOBS[s](plan)]
    try:
        run_jobs(jobs, plan, state)
    except (Stop, KeyboardInterrupt):
        state["meta"]["interrupted"] = True
        write_report(plan, state)
    status = {s: section_status(state, s) for s in sections}
    print(json.dumps(status), f"report: {plan.out / 'e2e.md'}")
    return 0 if all(v == "pass" for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
