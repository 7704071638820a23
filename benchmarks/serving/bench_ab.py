# SPDX-License-Identifier: Apache-2.0
"""Section bench_ab: seed 002's A/B of scalar-scale folding with ``vllm bench serve``."""

import dataclasses
import json
import subprocess
import sys
import time

from .jobs import Job, main_cfg
from .model import SERVED_NAME
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

