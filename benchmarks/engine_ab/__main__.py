# SPDX-License-Identifier: Apache-2.0
"""Driver: the model directory, one process per side, the report (see __init__)."""

import argparse
import datetime
import json
import os
import subprocess
import sys

from .model import write_model_dir
from .step_profile import ctx_out_path, parse_ctx_list

# A and B: one v0.26.0-flavor install, the knob picks the MSA path. C: the v0.23.0 flavor's
# install (the knob does not exist there), run in a call of its own.
SIDES = {"A": "upstream", "B": "series", "C": "series"}
PROFILE_MODES = ("graphs", "eager", "prefill", "prefill-eager")


def _run(cmd: list[str], env: dict, log_path: str, timeout: int):
    """One child process, its output in ``log_path``: exit status or "timeout"."""
    with open(log_path, "w") as log:
        try:
            return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return "timeout"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine_ab")
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=4, help="1 dense + (layers-1) MSA/MoE layers")
    p.add_argument("--sides", default="A,B")
    p.add_argument("--smoke", action="store_true", help="tiny fp32 shapes on the CPU")
    p.add_argument("--timeout", type=int, default=420, help="seconds per side")
    p.add_argument("--profile", default="",
                   help="after the rows, profile per side (step_profile): comma list of "
                        "graphs|eager (decode steps) and prefill|prefill-eager (one prefill "
                        "of --prefill-ctx tokens), e.g. graphs,prefill")
    p.add_argument("--profile-batch", type=int, default=1)
    p.add_argument("--decode-ctx", type=int, default=8192,
                   help="context length of the decode-step profiles (graphs|eager)")
    p.add_argument("--prefill-ctx", default="32768",
                   help="prompt length of the prefill profiles; a comma list (e.g. 1023,1024) "
                        "profiles each length in the same engine start")
    p.add_argument("--prefill-repeats", type=int, default=10,
                   help="unprofiled prefills timed per length before the profiled one")
    p.add_argument("--no-rows", action="store_true", help="profile only")
    p.add_argument("--serving-limits", action="store_true",
                   help="profiles with the serving matrix's max_model_len and batched tokens")
    args = p.parse_args(argv)
    prefill_ctxs = parse_ctx_list(args.prefill_ctx, 32768)
    os.makedirs(args.out, exist_ok=True)
    model = write_model_dir(os.path.join(args.out, "model"), args.layers, args.smoke)
    results = os.path.join(args.out, "engine_ab.json")
    meta = {"date": datetime.date.today().isoformat(), "layers": args.layers,
            "smoke": args.smoke, "sides": {}}
    for side in args.sides.split(","):
        if side not in SIDES:
            p.error(f"unknown side {side!r}: A, B (v0.26.0 install) or C (v0.23.0 install)")
        env = dict(os.environ, VLLM_MINIMAX_M3_MSA=SIDES[side], VLLM_ENABLE_V1_MULTIPROCESSING="0")
        rows_path = os.path.join(args.out, f"side-{side}.json")
        smoke = ["--smoke"] if args.smoke else []
        rc = "not run"
        if not args.no_rows:
            rc = _run([sys.executable, "-m", "benchmarks.engine_ab.side", "--model", model,
                       "--rows", rows_path, *smoke], env,
                      os.path.join(args.out, f"side-{side}.log"), args.timeout)
        rows = json.load(open(rows_path)) if os.path.exists(rows_path) else {}
        meta["sides"][side] = {"msa": SIDES[side], "rc": rc, "rows": rows, "profiles": {}}
        for mode in filter(None, args.profile.split(",")):
            if mode not in PROFILE_MODES:
                p.error(f"unknown profile mode {mode!r}: one of {', '.join(PROFILE_MODES)}")
            prefill = mode.startswith("prefill")
            shape = (["--prefill", "--ctx", ",".join(map(str, prefill_ctxs)),
                      "--repeats", str(args.prefill_repeats)] if prefill
                     else ["--batch", str(args.profile_batch), "--ctx", str(args.decode_ctx)])
            several = prefill and len(prefill_ctxs) > 1
            if prefill:  # several lengths: step_profile adds -ctx<N> per file
                tag = "" if several else f"-ctx{prefill_ctxs[0]}"
            else:
                tag = f"-b{args.profile_batch}" + (
                    "" if args.decode_ctx == 8192 else f"-ctx{args.decode_ctx}")
            prof = os.path.join(args.out, f"profile-{side}-{mode}{tag}.json")
            prc = _run([sys.executable, "-m", "benchmarks.engine_ab.step_profile", "--model",
                        model, "--out", prof, *shape, *smoke,
                        *(["--eager"] if mode.endswith("eager") else []),
                        *(["--serving-limits"] if args.serving_limits else [])], env,
                       prof.replace(".json", ".log"), args.timeout)
            for ctx in (prefill_ctxs if several else [None]):
                path = ctx_out_path(prof, ctx, True) if ctx else prof
                key = f"{mode}@{ctx}" if ctx else mode
                meta["sides"][side]["profiles"][key] = (
                    json.load(open(path)) if os.path.exists(path) else {"rc": prc})
        json.dump(meta, open(results, "w"), indent=1)
    from .report import write_report
    write_report(meta, os.path.join(args.out, "engine_ab.md"))
    print(open(os.path.join(args.out, "engine_ab.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
