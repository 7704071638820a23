# SPDX-License-Identifier: Apache-2.0
"""python -m benchmarks.serving: the serving benchmark (see the package docstring)."""
import argparse
import dataclasses
import datetime
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from . import server
from .bench_ab import ab_max_len
from .model import make_model_dir
from .report import section_status, write_report
from .runner import JOBS, run_jobs
from .server import Plan, Stop, ensure_server_deps, preflight, smoke_overrides


SECTIONS = ("serve", "concurrency", "throughput", "bench_ab")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=PACKAGE_DOC.split("\n\n")[0])
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
    server.T0 = time.monotonic() - max(p.get("wall_s", 0) for p in parts)
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
