# SPDX-License-Identifier: Apache-2.0
"""Probe: where a long-context decode index step's time goes (the scan, the
top-k select), the select by a bitwise threshold search
(``_tune={"radix_select": True}``) against the default arg-max rounds, and
what reading the step's bytes costs at best at b32 x 128k.

Per case (batch x context, bf16 or fp8 index cache, bf16 KV):
  * index+top-k and the whole chain (+ attention), CUDA-graph replay, L2
    flushed (write), for the default and the radix select at 1/2/4/8 warps;
    each variant's selections compared with the default's as sets per row;
  * each launch's device time (profiler);
  * the scan alone (the select launch skipped) and the select alone on rows
    of random scores (the decode row length, +inf at the own block).
Then ``sweep_read_ceiling`` at READ_CEILING_MIB (default 32,528,1024) chained
as READ_CEILING_CHAINS (default 528+32: b32 x 128k fp8 index keys, then the
selected K/V; 1024+32 the same with the bf16 index).
Results: $OUT/probe_decode_select.json.

  PYTHONPATH=<stub vllm> python ci/probe_decode_select.py
"""

import json
import os
import sys

import torch

from bench_msa import (B, D, HIDX, TOPK, Batch, kernel_times, load_kernels, probe_setup,
                       same_selection, sweep_read_ceiling)

CASES = ((32, 131072, True), (32, 131072, False), (1, 131072, False), (32, 32768, False),
         (1, 32768, False), (32, 32768, True))


class _NoLaunch:
    """Stands in for a Triton kernel whose launch is to be skipped."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main():
    out_dir, dev, timer = probe_setup()
    index_block_topk, block_sparse_attention, src = load_kernels()
    idx_mod = sys.modules[index_block_topk.__module__]
    res = dict(src=src, cases=[])
    only = os.environ.get("PROBE_CASES")  # e.g. "0,1": a subset of CASES
    cases = [CASES[int(i)] for i in only.split(",")] if only else CASES
    for batch, ctx, fp8 in cases:
        bt = Batch([ctx] * batch, 1, 0, dev, idx_fp8=fp8)
        k, ks = (bt.idx_k8, bt.idx_s) if fp8 else (bt.idx_k, None)
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        o = torch.empty_like(bt.q)

        def index(tune=None, bt=bt, k=k, ks=ks, sel=sel):
            index_block_topk(bt.idx_q, k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                             out=sel, num_decode_tokens=bt.T, idx_k_scales=ks, _tune=tune)

        def attn(bt=bt, sel=sel, o=o):
            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel,
                                   B, D ** -0.5, 0, bt.k_scale, bt.v_scale, None, out=o)

        row = dict(batch=batch, context=ctx, fp8_index=fp8, variants={})
        index()
        ref = sel.clone()
        variants = {"default": None}
        for w in (1, 2, 4, 8):
            variants[f"radix_w{w}"] = dict(radix_select=True, rank_select=False, select_warps=w)
        for name, tune in variants.items():
            sel.fill_(-7)
            try:
                index(tune)
                v = dict(ids_equal_default=same_selection(sel, ref),
                         index_us=timer.time_fn(lambda tune=tune: index(tune)),
                         chain_us=timer.time_fn(lambda tune=tune: (index(tune), attn())),
                         kernels=kernel_times(lambda tune=tune: index(tune), timer))
            except Exception as e:  # noqa: BLE001
                v = dict(error=repr(e)[:300])
            row["variants"][name] = v
            print(f"[probe] {batch} x {ctx} fp8={fp8} {name}: {v}", flush=True)
        row["attention_us"] = timer.time_fn(attn)

        real = idx_mod.block_topk_select_kernel
        idx_mod.block_topk_select_kernel = _NoLaunch()
        try:
            row["scan_only_us"] = timer.time_fn(index)
        finally:
            idx_mod.block_topk_select_kernel = real

        max_blocks = ctx // B
        scores = torch.randn(bt.T, HIDX, max_blocks, device=dev)
        scores[torch.arange(bt.T, device=dev), :, (bt.token_pos // B).long()] = float("inf")
        chunk = min(idx_mod.next_pow2(max_blocks), 2048)
        out = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        select_only = {}
        for name, radix, warps in [("default", False, idx_mod._select_warps(chunk))] + [
                (f"radix_w{w}", True, w) for w in (1, 2, 4, 8)]:
            def select(radix=radix, warps=warps):
                real[(bt.T, HIDX)](
                    scores, scores, bt.token_pos, out, 0, max_blocks,
                    scores.stride(0), scores.stride(1), out.stride(0), out.stride(1),
                    TOPK=TOPK, TOPK_PAD=TOPK, CHUNK=chunk, SPARSE_BLOCK=B, HAS_IDS=False,
                    VALID_FROM_POS=True, SINGLE_CHUNK=max_blocks <= chunk, RANK=False,
                    RANK_COLS=16, RADIX=radix, num_warps=warps)
            select_only[name] = timer.time_fn(select)
        row["select_only_us"] = select_only
        print(f"[probe] {batch} x {ctx} fp8={fp8}: attention {row['attention_us']:.1f}, "
              f"scan only {row['scan_only_us']:.1f}, select only {select_only}", flush=True)
        res["cases"].append(row)
        del bt, scores
        torch.cuda.empty_cache()
        (out_dir / "probe_decode_select.json").write_text(json.dumps(res, indent=1))

    os.environ.setdefault("READ_CEILING_MIB", "32,528,1024")
    os.environ.setdefault("READ_CEILING_CHAINS", "528+32,1024+32")
    if os.environ.get("READ_CEILING", "1") == "1":
        res["read_ceiling"] = sweep_read_ceiling(timer, dev, index_block_topk,
                                                 block_sparse_attention)
    (out_dir / "probe_decode_select.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
