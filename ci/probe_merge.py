# SPDX-License-Identifier: Apache-2.0
"""Probe: why the block-major path's per-token merge (``sparse_attn_merge``,
an 8192-token chunk x 16 heads x 16 partials x 128 fp16) reads at only
~0.8 TB/s on the H200 (run 9).  Times, by CUDA-graph replay (median of
``--reps``, L2 flushed), the repo's merge, layout variants of it written here,
and torch reductions over the same bytes.  Results: $OUT/probe_merge.json.

  PYTHONPATH=<stub vllm> python ci/probe_merge.py
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench_msa import Timer  # ci/ is the script's directory

T, HQ, S, D = 8192, 16, 16, 128


@triton.jit
def merge_rows_kernel(part_o_ptr, part_lse_ptr, out_ptr, NROWS,
                      S: tl.constexpr, D: tl.constexpr, R: tl.constexpr):
    """R (token, head) rows per program, one [R, S, D] load."""
    r = tl.program_id(0) * R + tl.arange(0, R)
    offs_s = tl.arange(0, S)
    offs_d = tl.arange(0, D)
    rmask = r < NROWS
    r64 = r.to(tl.int64)
    lse = tl.load(part_lse_ptr + r64[:, None] * S + offs_s[None, :], mask=rmask[:, None],
                  other=float("-inf"))
    o = tl.load(part_o_ptr + (r64[:, None, None] * S + offs_s[None, :, None]) * D
                + offs_d[None, None, :], mask=rmask[:, None, None], other=0.0)
    m = tl.max(lse, axis=1)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m[:, None])
    w = w / tl.where(tl.sum(w, axis=1) > 0, tl.sum(w, axis=1), 1.0)[:, None]
    res = tl.sum(tl.where(w[:, :, None] > 0, o.to(tl.float32) * w[:, :, None], 0.0), axis=1)
    tl.store(out_ptr + r64[:, None] * D + offs_d[None, :], res.to(out_ptr.dtype.element_ty),
             mask=rmask[:, None])


@triton.jit
def sum_only_kernel(part_o_ptr, out_ptr, S: tl.constexpr, D: tl.constexpr):
    """The same bytes, no softmax weights: the access pattern's ceiling."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, S)
    offs_d = tl.arange(0, D)
    o = tl.load(part_o_ptr + (row * S + offs_s[:, None]) * D + offs_d[None, :])
    tl.store(out_ptr + row * D + offs_d, tl.sum(o.to(tl.float32), axis=0).to(tl.bfloat16))


def main():
    dev = torch.device("cuda")
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 50
    time_fn = Timer(dev, reps).time_fn  # the benchmark's: graph replay, L2 flushed

    from vllm.models.minimax_m3.common.triton_ops.sparse_attn_merge import (
        sparse_attn_merge_kernel)
    res = dict(gpu=torch.cuda.get_device_name(0), shape=dict(T=T, HQ=HQ, S=S, D=D), rows=[])
    for pdt in (torch.float16, torch.float32):
        part_o = torch.randn((T, HQ, S, D), dtype=pdt, device=dev)
        part_lse = torch.randn((T, HQ, S), dtype=torch.float32, device=dev)
        out = torch.empty((T, HQ, D), dtype=torch.bfloat16, device=dev)
        nbytes = part_o.numel() * part_o.element_size() + part_lse.numel() * 4
        ref = None
        cases = [("repo_merge_h1_w4", lambda: sparse_attn_merge_kernel[(T, HQ)](
            part_o, part_lse, out, part_lse, out.stride(0), out.stride(1), HQ=HQ, S=S,
            S_PAD=S, D=D, D_PAD=D, num_warps=4))]
        for w in (1, 2):
            cases.append((f"repo_merge_h1_w{w}", lambda w=w: sparse_attn_merge_kernel[(T, HQ)](
                part_o, part_lse, out, part_lse, out.stride(0), out.stride(1), HQ=HQ, S=S,
                S_PAD=S, D=D, D_PAD=D, num_warps=w)))
        for R, w in ((1, 4), (2, 4), (4, 4), (4, 8), (8, 8)):
            cases.append((f"rows{R}_w{w}", lambda R=R, w=w: merge_rows_kernel[
                (triton.cdiv(T * HQ, R),)](part_o, part_lse, out, T * HQ, S=S, D=D, R=R,
                                           num_warps=w)))
        for w in (1, 2, 4):
            cases.append((f"sum_only_w{w}", lambda w=w: sum_only_kernel[(T * HQ,)](
                part_o, out, S=S, D=D, num_warps=w)))
        cases.append(("torch_sum_dim2", lambda: torch.sum(part_o, dim=2, out=None)))
        cases.append(("torch_copy", lambda: part_o.clone()))
        for name, fn in cases:
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            diff = None
            if name.startswith(("repo", "rows")):
                if ref is None:
                    ref = out.float().clone()
                diff = float((out.float() - ref).abs().max())
            us = time_fn(fn)
            row = dict(partials=str(pdt).split(".")[-1], variant=name, us=round(us, 1),
                       gb_s=round(nbytes / us / 1e3, 1), max_diff_vs_repo=diff)
            res["rows"].append(row)
            print(row, flush=True)
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_merge.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
