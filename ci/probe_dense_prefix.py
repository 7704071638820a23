# SPDX-License-Identifier: Apache-2.0
"""Probe: ``prefix_blocks`` -- block-major prefill with the chunk's first
tokens (those that see fewer than ``prefix_blocks`` blocks) computed by
``sparse_attn_prefix`` instead: tiles of consecutive tokens walking every
block they see, masked per row by the token's selection, output written
directly, where block-major writes one partial per (token, block) and merges
them (run 41, 8k: kernel 385 us + merge 142 us for 8192 x 16 pairs).

One bf16 batch (8192-token chunk at ``CONTEXT``, default 8k, the index's
selections).  Variants (``name:json _tune``, joined by ";", in ``VARIANTS``;
the first is the base) each run with ``block_major=4`` and the variant's
``prefix_blocks`` (a key of its json, taken out of the _tune); each is
captured in a CUDA graph and timed in ``ROUNDS`` paired rounds (L2 flushed),
with each kernel's device time and its output's largest difference from the
base's.  Results: $OUT/probe_dense_prefix.json.

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
    default_variants = ("base:{\"prefix_blocks\": 0, \"merge_skip_empty\": false};"
                        "skip_empty:{\"prefix_blocks\": 0};"
                        + ";".join(f"p{p}_tm{tm}:{{\"prefix_blocks\": {p}, \"prefix_tile\": {tm}}}"
                                   for p in (16, 24, 32, 40) for tm in (4, 8))
                        + ";p32_tm4_s3:{\"prefix_blocks\": 32, \"prefix_tile\": 4, "
                        "\"prefix_stages\": 3};p32_tm8_s3:{\"prefix_blocks\": 32, "
                        "\"prefix_tile\": 8, \"prefix_stages\": 3};p32_tm8_w4:"
                        "{\"prefix_blocks\": 32, \"prefix_tile\": 8, \"prefix_warps\": 4}")
    variants = [(name, json.loads(tune)) for name, tune in
                (spec.split(":", 1) for spec in
                 filter(None, os.environ.get("VARIANTS", default_variants).split(";")))]
    index_block_topk, block_sparse_attention, src = load_kernels()
    bt = Batch([ctx], 8192, 0, dev)
    sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                           B, TOPK, num_decode_tokens=0)
    first_pos = int(bt.token_pos[0])

    def layout(tune):
        tune = dict(tune)
        prefix = int(tune.pop("prefix_blocks", 0))
        o = torch.empty_like(bt.q)

        def attn():
            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos,
                                   sel, B, D ** -0.5, out=o, block_major=4,
                                   prefix_blocks=prefix, _tune=tune)
        return attn, o

    graphs, kernels, diffs = {}, {}, {}
    base = None
    for name, tune in variants:
        attn, o = layout(tune)
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
               chunk_first_pos=first_pos, rounds=rounds, max_diff_from_base=diffs,
               variants=dict(variants), kernels=kernels,
               **paired_rounds(timer, graphs, rounds, base=variants[0][0]))
    print(json.dumps({k: v for k, v in res.items() if k not in ("us", "kernels")}, indent=1))
    (out_dir / "probe_dense_prefix.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
