# SPDX-License-Identifier: Apache-2.0
"""The engine-level serving matrix of MiniMax-M3: A / B / C through `vllm serve` and
`vllm bench serve` (GPU; CPU smoke).

  A  vLLM 0.26.0 (the series' v0.26.0 wheel), upstream's MSA path  VLLM_MINIMAX_M3_MSA=upstream
  B  the same install, the series' MSA path                         VLLM_MINIMAX_M3_MSA=series
  C  vLLM 0.23.0 with the series (the v0.23.0 wheel: another install, another call)

Every side serves one config-only model directory (the released layer shapes, --layers
layers: 1 dense + the rest MSA/MoE, dummy weights; benchmarks/engine_ab/model.py's
released config form, which upstream's loader reads, plus the serving package's
word-level tokenizer) with seed 002's flags: FP8 KV, FULL_AND_PIECEWISE CUDA graphs,
chunked prefill (32768 batched tokens), prefix caching off, 32 sequences, block 128
(upstream's M3 takes no other), --max-model-len 132096 (128k + 256 + margin) whatever
ISLs a run selects, so split runs stay comparable.  Per row (ISL x concurrency, OSL 256):
`vllm bench serve --backend vllm --dataset-name random --ignore-eos --temperature 0
--save-result`, after an unrecorded warm-up (concurrency > 1: that many prompts of
min(ISL, --warmup-isl) tokens, --warmup-osl tokens); output tok/s, median TTFT, median TPOT.
Before each concurrency-1 row, the first request at that length against 3 repeats
(``first_request.py``: TTFT client-side; issue 48's "first <= 1.2 x a repeat"), unless
--no-first-request.

Rows run concurrency-major (every ISL at concurrency 1, then 8, then 32), so the
rows where upstream's path crashed before (illegal memory access at decode batch >= 8)
come last on a side.  A server that dies during a row marks the row "crashed" (with
its log tail) and is started again for the next row (--on-crash).  No row or server
start begins after --deadline; rows not reached are "not run".  Each side writes
OUT/side-<S>.json after every row; OUT/matrix.md joins the sides of this run.  Rows
of one side split over several runs join too: ``report`` takes any side JSONs.

  python -m benchmarks.serving.matrix run --sides B,A [--isl 1k,8k,32k,128k]
      [--concurrency 1,8,32] [--num-prompts 1=4,8=8,32=32,128kx1=2] [--deadline 540]
      [--wheels DIR] [--out OUT]                # on the v0.26.0 install
  python -m benchmarks.serving.matrix run --sides C ...      # on the v0.23.0 install
  python -m benchmarks.serving.matrix report RUN1/side-*.json RUN2/side-C.json --out DIR
  python -m benchmarks.serving.matrix run --dry-run ...      # rows, prompts, rough time
  python -m benchmarks.serving.matrix run --smoke-cpu --sides B   # tiny shapes on CPU

`vllm bench serve` runs inside one long-lived process (--bench-mode worker: vLLM's own
CLI entry point called once per argument list, saving the ~20 s interpreter start and
import of every run); --bench-mode cli starts `python -m vllm.entrypoints.cli.main` per
run instead.  Exit status: 0 when every selected row was reached (a crash is a result),
1 when some were not (deadline, timeout, a server that did not start), 2 for a wrong
install or bad arguments.
"""

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .bench_serve import BenchWorker
from .matrix_report import write_report
from .matrix_side import CliBench, SideRun
from .matrix_spec import (GPU_DEFAULTS, PLAN_GUESS, SIDES, SMOKE_DEFAULTS, Matrix, estimate,
                          parse_list, parse_prompts, parse_tokens)
from .server import Plan, Stop, ensure_server_deps, preflight, smoke_overrides


def git_commit() -> str:
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).parent).stdout.strip() \
            or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serving.matrix",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve and benchmark the selected sides")
    run.add_argument("--sides", required=True, help="comma list of A, B (v0.26.0 install), C "
                     "(v0.23.0 install), in run order; e.g. B,A (A's crashes then cost B nothing)")
    run.add_argument("--isl", default=None, help="ISLs, e.g. 1k,8k,32k,128k (default)")
    run.add_argument("--concurrency", default=None, help="e.g. 1,8,32 (default)")
    run.add_argument("--osl", type=int, default=None, help="output tokens (default 256)")
    run.add_argument("--num-prompts", default=None,
                     help="C=N per concurrency, ISLxC=N for one row (later wins); default "
                          "1=4,8=8,32=32,128kx1=2; a concurrency not listed gets N=C")
    run.add_argument("--layers", type=int, default=None, help="1 dense + the rest MSA/MoE (4)")
    run.add_argument("--max-model-len", type=int, default=None, help="default 132096")
    run.add_argument("--deadline", type=float, default=0.0,
                     help="seconds from start after which no row or server start begins; "
                          "running rows are cut at it (0 = none)")
    run.add_argument("--row-timeout", type=float, default=300.0, help="seconds per bench run")
    run.add_argument("--startup-timeout", type=float, default=None, help="seconds (420)")
    run.add_argument("--warmup-isl", type=parse_tokens, default=None,
                     help="warm-up prompt length cap (4096)")
    run.add_argument("--warmup-osl", type=int, default=None, help="warm-up output tokens (16)")
    run.add_argument("--no-warmup", action="store_true", help="no per-row warm-up")
    run.add_argument("--no-first-request", action="store_true",
                     help="skip the first-request probe of each concurrency-1 row "
                     "(benchmarks/serving/first_request.py)")
    run.add_argument("--on-crash", choices=("restart", "skip-higher-concurrency"),
                     default="restart", help="after a crashed row: start the server again for "
                     "the next row (default), or also skip the side's rows at that concurrency "
                     "and above")
    run.add_argument("--max-restarts", type=int, default=-1, help="per side (-1: no limit)")
    run.add_argument("--bench-mode", choices=("worker", "cli"), default="worker")
    run.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                     help="more environment for every side's server, e.g. "
                          "VLLM_USE_BREAKABLE_CUDAGRAPH=0 (repeatable)")
    run.add_argument("--serve-args", default="", help="more `vllm serve` flags, one string")
    run.add_argument("--wheels", default=None, help="dir of ci/gpu_extra_wheels.sh wheels")
    run.add_argument("--out", default=os.environ.get("OUT", "out"))
    run.add_argument("--workdir", default=None, help="model dir and scratch (default: temp)")
    run.add_argument("--smoke-cpu", action="store_true", help="tiny shapes on CPU (B or C)")
    run.add_argument("--allow-any-version", action="store_true",
                     help="skip the check that the installed vLLM fits the sides")
    run.add_argument("--dry-run", action="store_true",
                     help="print the rows, their prompts and a rough time; start nothing")
    rep = sub.add_parser("report", help="join side JSONs (any runs) into one markdown table")
    rep.add_argument("files", nargs="+", help="side-<S>.json files")
    rep.add_argument("--out", required=True, help="dir for matrix.md and matrix.json")
    return ap.parse_args(argv)


def build_matrix(a: argparse.Namespace) -> Matrix:
    d = SMOKE_DEFAULTS if a.smoke_cpu else GPU_DEFAULTS
    try:
        prompts = parse_prompts(a.num_prompts or d["num_prompts"])
        isls = parse_list(a.isl or d["isl"])
        concs = parse_list(a.concurrency or d["concurrency"])
    except argparse.ArgumentTypeError as e:
        raise UsageError(str(e))
    if not isls or not concs or min(isls + concs) < 1 or min(prompts.values(), default=1) < 1:
        raise UsageError("ISLs, concurrencies and prompt counts must be positive")
    m = Matrix(isls=isls, concs=concs, osl=a.osl or d["osl"], prompts=prompts,
               warmup=not a.no_warmup, warmup_isl=a.warmup_isl or d["warmup_isl"],
               warmup_osl=a.warmup_osl or d["warmup_osl"], row_timeout=a.row_timeout,
               on_crash=a.on_crash, max_restarts=a.max_restarts,
               first_request=not a.no_first_request)
    if max(m.isls) + m.osl > (a.max_model_len or d["max_model_len"]):
        raise UsageError(f"ISL {max(m.isls)} + OSL {m.osl} exceeds --max-model-len "
                         f"{a.max_model_len or d['max_model_len']}")
    return m


class UsageError(Exception):
    """Bad arguments or the wrong install: exit status 2, nothing measured."""


def side_names(text: str, smoke: bool) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SIDES]
    if bad or not names or len(set(names)) != len(names):
        raise UsageError(f"--sides {text!r}: want distinct sides out of A, B, C")
    if smoke and "A" in names:
        raise UsageError("side A (upstream's MSA kernels) needs a GPU; the CPU smoke runs B or C")
    return names


def check_install(names: list[str], pre: dict) -> None:
    """Every side must fit the installed vLLM: A and B the series' v0.26.0 wheel
    (VLLM_MINIMAX_M3_MSA exists only there), C the series' v0.23.0 wheel."""
    version = str(pre.get("vllm", "?"))
    sides = [SIDES[s] for s in names]
    if all(version.startswith(s.version_prefix) for s in sides) and "+m3" in version:
        return
    want = "; ".join(f"{s.name} needs {s.version_prefix}x+m3 ({s.what})" for s in sides)
    hint = f" (preflight: {pre['error'][-500:]})" if pre.get("error") else ""
    raise UsageError(f"the installed vLLM is {version!r}{hint}; {want}. Run A,B and C in "
                     "separate calls, each on its install, or pass --allow-any-version.")


def on_sigterm(signum, frame):
    raise Stop()


def run(a: argparse.Namespace) -> int:
    from ..engine_ab.model import text_config, write_model_dir
    from .model import build_tokenizer

    m = build_matrix(a)
    names = side_names(a.sides, a.smoke_cpu)
    extra_env = tuple(tuple(kv.split("=", 1)) for kv in a.server_env)
    if any(len(kv) != 2 or not kv[0] for kv in extra_env):
        raise UsageError(f"--server-env wants NAME=VALUE, got {a.server_env}")
    if a.dry_run:
        lines, total = estimate(m, len(names))
        print(f"sides {','.join(names)}; rows in run order (rough guess: {PLAN_GUESS}):")
        print("\n".join(lines))
        print(f"about {total:.0f} s for all sides (server starts included, crashes not)")
        return 0
    d = SMOKE_DEFAULTS if a.smoke_cpu else GPU_DEFAULTS
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in ("serve.log", "bench.log"):
        (out / f).unlink(missing_ok=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="m3-matrix-"))
    deps = ensure_server_deps(a.wheels)
    pre = preflight()
    if not a.allow_any_version:
        check_install(names, pre)
    broken = {m: pre.get(m) for m in ("vllm.entrypoints.openai.api_server", "vllm.benchmarks.serve")
              if pre.get(m) != "ok"}
    if broken:
        raise UsageError(f"`vllm serve` / `vllm bench serve` would not start: {broken} "
                         f"(server deps: {deps}); pass --wheels with the missing wheels")
    layers = a.layers or d["layers"]
    model = write_model_dir(str(work / "model"), layers, a.smoke_cpu)
    text = text_config(layers, a.smoke_cpu)
    build_tokenizer(model, text["vocab_size"])
    plan = Plan(smoke=a.smoke_cpu, out=out, work=work, deadline=a.deadline)
    if a.smoke_cpu:
        plan = dataclasses.replace(plan, **smoke_overrides())
    plan = dataclasses.replace(plan, block=128, max_len=a.max_model_len or d["max_model_len"],
                               startup_timeout=a.startup_timeout or (600.0 if a.smoke_cpu else 420.0),
                               model=model, vocab=text["vocab_size"])
    meta = {"gpu": pre.get("gpu", "?"), "vllm": pre.get("vllm", "?"), "torch": pre.get("torch", "?"),
            "preflight": pre, "deps": deps, "commit": git_commit(), "argv": sys.argv[1:],
            "mode": "smoke-cpu" if a.smoke_cpu else "gpu", "bench_mode": a.bench_mode,
            "layers": layers, "max_model_len": plan.max_len,
            "model": ", ".join(f"{k}={text[k]}" for k in (
                "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "num_local_experts", "num_experts_per_tok", "vocab_size")),
            "warmup": (f"{m.warmup_osl} output tokens, min(ISL, {m.warmup_isl}) input tokens, "
                       "concurrency > 1 only") if m.warmup else "none"}
    if a.bench_mode == "worker":
        bench = BenchWorker(out / "bench.log", work / "status")
    else:
        bench = CliBench(out / "bench.log")
    signal.signal(signal.SIGTERM, on_sigterm)
    paths, stopped = [], False

    def report():
        if paths:
            write_report([str(p) for p in paths], out)

    try:
        for name in names:
            side_run = SideRun(SIDES[name], plan, m, bench, meta, extra_env,
                               tuple(a.serve_args.split()), on_save=report)
            paths.append(side_run.path)
            if stopped:
                side_run.mark_unreached("stopped (SIGTERM)")
                continue
            try:
                side_run.run()
            except (Stop, KeyboardInterrupt):
                stopped = True
    finally:
        if hasattr(bench, "close"):
            bench.close()
        report()
    reached = all(r["status"] != "not run" and r["status"] != "timeout"
                  for p in paths for r in json.loads(Path(p).read_text())["rows"].values())
    print(f"report: {out / 'matrix.md'}")
    return 0 if reached and not stopped else 1


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        if a.command == "report":
            print(write_report(a.files, Path(a.out)).read_text())
            return 0
        return run(a)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
