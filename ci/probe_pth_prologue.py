# SPDX-License-Identifier: Apache-2.0
"""Probe: is the per-token-head FP8 block-major prefill slower than scalar FP8
(run 39: 417 against 409 us per 8192-token chunk at 8k) because its held block
waits for the scale loads?  Today a program loads its block's K/V and the
per-token-head scales after the chunk-wide max position (``pmax_all``, a
reduction through shared memory), then multiplies the scales into the block.

  scales_early  the scale rows loaded first, right after the program's group
                is known, unmasked (every key of a selected block lies on a
                page of the request's block-table row); the held K/V load no
                longer loads them.  Outputs must equal the default's bitwise.

One bf16 batch (8192-token chunk at 8k context, the index's selections) stored
as bf16, scalar fp8 and per-token-head fp8; the attention launch of each
captured in a CUDA graph and timed in ``ROUNDS`` paired rounds (L2 flushed),
plus each launch's kernel device times.  Results: $OUT/probe_pth_prologue.json.

  PYTHONPATH=<stub vllm> python ci/probe_pth_prologue.py
"""

import json
import os
import sys

from bench_msa import (B, D, TOPK, Batch, kernel_times, load_kernels, paired_rounds,
                       probe_setup)
from probe_prefill_ceiling import patched_kernel

PATCHES = {
    "scales_early": [
        ("from ._triton import tl, triton",
         "from ._paged import paged_rows\nfrom ._triton import tl, triton"),
        ("        # keys after the program's last query position are never loaded\n",
         "        if SCALE_HELD_KV:\n"
         "            kp0 = b * SPARSE_BLOCK + offs_n\n"
         "            srow0 = paged_rows(bt_row, kp0, kp0 >= 0, stride_cp, stride_cs, stride_sp,\n"
         "                               stride_ss, PAGE_SIZE, True)[1]\n"
         "            ksc0 = tl.load(kvs_ptr + srow0 + g * stride_sh)\n"
         "            vsc0 = tl.load(kvs_ptr + stride_skv + srow0 + g * stride_sh)\n"
         "        # keys after the program's last query position are never loaded\n"),
        ("PAGE_SIZE, 2 if SCALE_MODE == 2 else 0)",
         "PAGE_SIZE, 2 if SCALE_MODE == 2 and not SCALE_HELD_KV else 0)"),
        ("k = (k.to(tl.float32) * ksc[:, None])", "k = (k.to(tl.float32) * ksc0[:, None])"),
        ("v = (v.to(tl.float32) * vsc[:, None])", "v = (v.to(tl.float32) * vsc0[:, None])"),
    ],
}


def main():
    import torch
    out_dir, dev, timer = probe_setup()
    rounds = int(os.environ.get("ROUNDS", "9"))
    index_block_topk, block_sparse_attention, src = load_kernels()
    attn_mod = sys.modules[block_sparse_attention.__module__]
    real = attn_mod.sparse_attn_block_major_kernel
    bt = Batch([8192], 8192, 0, dev)
    sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                           B, TOPK, num_decode_tokens=0)
    batches = {0: bt, 1: bt.with_kv_mode(1), 2: bt.with_kv_mode(2)}
    kinds = [("bf16", 0, None), ("fp8", 1, None), ("fp8-pth", 2, None),
             ("pth-scales_early", 2, "scales_early")]
    graphs, kernels, outs = {}, {}, {}
    for name, mode, patch in kinds:
        kb = batches[mode]
        o = torch.empty_like(kb.q)

        def attn(kb=kb, o=o, mode=mode):
            block_sparse_attention(kb.q, kb.kv, kb.block_table, kb.token_req, kb.token_pos,
                                   sel, B, D ** -0.5, mode, kb.k_scale, kb.v_scale,
                                   kb.kv_scales, out=o, block_major=4)
        attn_mod.sparse_attn_block_major_kernel = (
            real if patch is None else patched_kernel(attn_mod, patch, PATCHES))
        try:
            o.fill_(float("nan"))
            attn()
            outs[name] = o.clone()
            kernels[name] = kernel_times(attn, timer, reps=10)
            graphs[name] = (timer.graph(attn), attn, o)
        finally:
            attn_mod.sparse_attn_block_major_kernel = real
    res = dict(kernels_from=src, gpu=torch.cuda.get_device_name(0),
               commit=os.environ.get("GIT_COMMIT", "?"), rounds=rounds, kernels=kernels,
               scales_early_equals_default=bool(torch.equal(outs["pth-scales_early"],
                                                            outs["fp8-pth"])),
               **paired_rounds(timer, {k: g for k, (g, _, _) in graphs.items()}, rounds))
    print(json.dumps({k: v for k, v in res.items() if k not in ("us",)}, indent=1))
    (out_dir / "probe_pth_prologue.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
