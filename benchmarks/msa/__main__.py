# SPDX-License-Identifier: Apache-2.0
"""python -m benchmarks.msa: the MSA kernel benchmark (see the package docstring)."""
import argparse
import json
import os
import sys
from pathlib import Path

import torch

from . import __doc__ as PACKAGE_DOC
from .checks import correctness
from .harness import Timer, load_kernels
from .report import to_markdown
from .sweeps import SWEEP_KINDS, sweep
from .table import bench


def main():
    ap = argparse.ArgumentParser(description=PACKAGE_DOC.split("\n")[0], epilog=PACKAGE_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=100, help="timed replays per measurement")
    ap.add_argument("--quick", action="store_true", help="8k context, batch 1 only")
    ap.add_argument("--prefill-only", action="store_true",
                    help="the correctness check and the prefill table, no decode table")
    ap.add_argument("--decode-only", action="store_true",
                    help="the correctness check and the decode table, no prefill table")
    ap.add_argument("--check-only", action="store_true", help="only the correctness check")
    ap.add_argument("--sweep", action="store_true", help="also sweep the launch-shape knobs")
    ap.add_argument("--sweep-only", action="store_true", help="only the launch-shape sweep")
    ap.add_argument("--sweep-kinds", default=",".join(SWEEP_KINDS),
                    help=f"comma-separated subset of {','.join(SWEEP_KINDS)}")
    ap.add_argument("--prefix-overlap", action="store_true",
                    help="only the 8k prefill step with the dense prefix (prefix_overlap.py; "
                         "env PREFIX, CONTEXT, ROUNDS)")
    args = ap.parse_args()
    kinds = tuple(k for k in args.sweep_kinds.split(",") if k)
    bad = [k for k in kinds if k not in SWEEP_KINDS]
    if bad:
        ap.error(f"unknown --sweep-kinds {bad}; choose from {', '.join(SWEEP_KINDS)}")
    args.sweep_kinds = kinds
    out = Path(os.environ.get("OUT", "./out"))
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("python -m benchmarks.msa needs a GPU (CUDA or ROCm); nothing to do.",
              file=sys.stderr)
        return 2
    if args.prefix_overlap:
        from .prefix_overlap import run as prefix_overlap
        prefix_overlap(out, args.reps)
        return 0
    if args.sweep_only:
        res = dict(sweep=sweep(Timer(torch.device("cuda"), args.reps), torch.device("cuda"),
                               kinds),
                   correctness_passed=True)
        (out / "bench_msa_sweep.json").write_text(json.dumps(res, indent=1))
        return 0
    if args.check_only:
        idx, attn, src = load_kernels()
        res = dict(info=dict(kernels_from=src), correctness=correctness(idx, attn,
                                                                        torch.device("cuda")))
        res["correctness_passed"] = all(e["passed"] for e in res["correctness"])
    else:
        res = bench(args)
    (out / "bench_msa.json").write_text(json.dumps(res, indent=1))
    if not args.check_only:
        md = to_markdown(res)
        (out / "bench_msa.md").write_text(md)
        print(md)
    print(f"[info] results in {out}/bench_msa.json", flush=True)
    return 0 if res["correctness_passed"] else 1



if __name__ == "__main__":
    sys.exit(main())
