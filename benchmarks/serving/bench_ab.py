# SPDX-License-Identifier: Apache-2.0
"""Section bench_ab: seed 002's A/B of scalar-scale folding with ``vllm bench serve``."""

import dataclasses
import time

from .bench_serve import bench_args, display_cmd, read_result, run_cli, warmup_args
from .jobs import Job, main_cfg
from .server import FOLD_ENV, Plan, Server


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


def run_bench(server: Server, plan: Plan, isl: int, conc: int, name: str) -> dict:
    """`vllm bench serve --backend vllm --dataset-name random` (greedy,
    ignore_eos, --num-prompts = concurrency x ab_prompts_per_conc): output
    tokens/s and median TTFT (ms) from its --save-result JSON."""
    n = conc * plan.ab_prompts_per_conc
    rdir = plan.work / "bench"
    rdir.mkdir(exist_ok=True)
    args = bench_args(server.port, plan.model, isl, plan.ab_osl, conc, n, rdir, f"{name}.json")
    out = {"cmd": display_cmd(args, plan.model),
           "isl": isl, "osl": plan.ab_osl, "concurrency": conc, "num_prompts": n,
           "fold": server.cfg.fold}
    # Unrecorded warm-up at the same ISL and concurrency (OSL 8): the first
    # batch of a new shape pays Triton JIT / first-call costs, which otherwise
    # land in whichever fold runs first (seen: 6x TTFT on the first case).
    warm = warmup_args(args, conc, 8)
    with open(plan.out / "bench.log", "a") as log:
        log.write(f"\n===== {name} warm-up ({server.cfg.label})\n")
        log.flush()
        t0 = time.monotonic()
        run_cli(warm, log, min(plan.ab_timeout, max(plan.remaining(), 30)))
        out["warmup_s"] = round(time.monotonic() - t0, 1)
        log.write(f"\n===== {name} ({server.cfg.label}, {FOLD_ENV}={int(server.cfg.fold)})\n")
        log.flush()
        t0 = time.monotonic()
        rc = run_cli(args, log, min(plan.ab_timeout, max(plan.remaining(), 30)))
    out["wall_s"] = round(time.monotonic() - t0, 1)
    res = read_result(rdir / f"{name}.json", n)
    if rc != 0 or "error" in res:
        return {**out, "ok": False, "error": f"vllm bench serve rc {rc}; see bench.log"}
    out.update(res)
    return out
