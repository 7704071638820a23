"""Upstream v0.26.0's Triton MSA path (its indexer and sparse-attention impls, vLLM's
own kernels) on one batch, in Triton's interpreter on CPU, against the series' path
(the PyTorch reference ops) on the same caches, metadata and shared top-k buffer
(benchmarks/engine_ab/cpu_sparse_layer.py builds both).

    TRITON_INTERPRET=1 python upstream_triton_on_cpu.py DECODE_CONTEXTS PREFILLS

DECODE_CONTEXTS: comma-separated contexts of decode requests (one new token each);
PREFILLS: comma-separated CONTEXT+NEW prefill requests. Prints the largest output
difference; exit status 0 when it is within fp16 rounding, 1 otherwise (a crash of
upstream's kernels ends the process). Used by test_upstream_m3_triton_topk_buffer.py.

fp16, not bf16: in the interpreter upstream's decode kernel gave non-finite outputs
on bf16 inputs (2026-12-05; not investigated), on fp16 it agrees with the reference.
"""

import os
import sys
from pathlib import Path

import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1 (before triton is imported) to run vLLM's Triton "
             "kernels on CPU")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.engine_ab.cpu_sparse_layer import (SparseLayer, make_batch,  # noqa: E402
                                                   use_real_triton)

SHAPES = dict(kv_heads=4, gqa=2, head_dim=128, index_dim=128)
TOPK, TOLERANCE = 2, 3e-2


def main(argv: list[str]) -> int:
    decode_ctx = [int(c) for c in argv[0].split(",") if c]
    prefill = [tuple(int(x) for x in p.split("+")) for p in argv[1].split(",") if p]
    use_real_triton()
    batch = make_batch(decode_ctx, prefill, dtype=torch.float16, **SHAPES)
    series = SparseLayer("series", batch, topk=TOPK, **SHAPES).forward().float()
    upstream = SparseLayer("upstream", batch, topk=TOPK, **SHAPES).forward().float()
    err = (series - upstream).abs().max().item()
    print(f"decode contexts {decode_ctx}, prefills {prefill}: "
          f"max |upstream - series| = {err:.3g} (tolerance {TOLERANCE})")
    return 0 if err <= TOLERANCE else 1   # NaN fails too


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
