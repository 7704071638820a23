# SPDX-License-Identifier: Apache-2.0
"""Probe: does block-major prefill gain from giving the chunk's first tokens
to the token-tiled kernel?  A token at position p sees ``v = p // 128 + 1``
blocks.  While ``v`` is small it selects most of them (all when v <= top-k),
so consecutive tokens share their blocks and a tile of ``TM`` tokens reads
each block once and writes its output once, where block-major writes one
partial output per (token, block) and merges them (run 41, 8k: kernel 385 us
+ merge 142 us for 8192 x 16 pairs).

One bf16 batch (8192-token chunk at 8k context, the index's selections).
Variants: ``prefix_P_tmN``: tokens [0, P) by ``token_tile=N``, tokens [P, T)
by ``block_major=4``; ``prefix_0`` is today's layout.  Each is captured in a
CUDA graph and timed in ``ROUNDS`` paired rounds (L2 flushed), with each
kernel's device time, and its output's largest difference from prefix_0's.
Results: $OUT/probe_dense_prefix.json.

  PROBE=probe_dense_prefix.py GIT_COMMIT=... bash ci/gpu_kernel_job.sh
"""

import json
import os

from bench_msa import (B, D, TOPK, Batch, kernel_times, load_kernels, paired_rounds,
                       probe_setup)


def main():
    import torch
    out_dir, dev, timer = probe_setup()
    rounds = int(os.environ.get("ROUNDS", "7"))
    ctx = int(os.environ.get("CONTEXT", "8192"))
    prefixes = [int(p) for p in os.environ.get("PREFIXES", "2048,3072,4096,5120").split(",")]
    tiles = [int(t) for t in os.environ.get("TILES", "8,4").split(",")]
    index_block_topk, block_sparse_attention, src = load_kernels()
    bt = Batch([ctx], 8192, 0, dev)
    sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                           B, TOPK, num_decode_tokens=0)
    first_pos = int(bt.token_pos[0])

    def layout(P, tm):
        o = torch.empty_like(bt.q)

        def attn():
            if P > 0:
                block_sparse_attention(bt.q[:P], bt.kv, bt.block_table, bt.token_req[:P],
                                       bt.token_pos[:P], sel[:P], B, D ** -0.5,
                                       out=o[:P], token_tile=tm)
            if P < bt.T:
                block_sparse_attention(bt.q[P:], bt.kv, bt.block_table, bt.token_req[P:],
                                       bt.token_pos[P:], sel[P:], B, D ** -0.5,
                                       out=o[P:], block_major=4)
        return attn, o

    variants = [("prefix_0", 0, 0)] + [(f"prefix_{P}_tm{tm}", P, tm)
                                       for P in prefixes for tm in tiles]
    graphs, kernels, diffs = {}, {}, {}
    base = None
    for name, P, tm in variants:
        attn, o = layout(P, tm)
        o.fill_(float("nan"))
        attn()
        if base is None:
            base = o.clone()
        diffs[name] = float((o.float() - base.float()).abs().max())
        kernels[name] = kernel_times(attn, timer, reps=10)
        graphs[name] = timer.graph(attn)
        print(name, diffs[name], kernels[name], flush=True)
    res = dict(kernels_from=src, gpu=torch.cuda.get_device_name(0),
               commit=os.environ.get("GIT_COMMIT", "?"), context=ctx,
               chunk_first_pos=first_pos, rounds=rounds, max_diff_from_prefix_0=diffs,
               kernels=kernels, **paired_rounds(timer, graphs, rounds, base="prefix_0"))
    print(json.dumps({k: v for k, v in res.items() if k not in ("us", "kernels")}, indent=1))
    (out_dir / "probe_dense_prefix.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
