# SPDX-License-Identifier: Apache-2.0
"""Prefill sweeps: index tiles and splits, token tiles, block-major, fp8 index keys."""

import json
import os

import torch

from .checks import Batch, overlap, same_selection
from .harness import (B, D, HIDX, HQ, PAGE, TOPK, checked_time, default_token_tile,
                      distinct_per_tile, env_shapes, kernel_times)


def sweep_prefill_index(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index tile shapes and prefetch_rows."""
    out = []
    # prefill index: an 8192-token chunk at the end of 32k and 128k contexts;
    # the default launch, then the causal mask skipped on fully visible
    # blocks, more stages, and more context splits (programs per SM)
    for ctx in (131072, 32768):
        bt = Batch([ctx], 8192, 0, dev)
        ref = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                               B, TOPK, num_decode_tokens=0)
        for splits, tune in ((None, None), (None, dict(skip_full_mask=True)),
                             (None, dict(num_stages=3)),
                             (None, dict(skip_full_mask=True, num_stages=3)),
                             (2, None), (4, None), (8, None),
                             (4, dict(skip_full_mask=True)), (8, dict(skip_full_mask=True)),
                             (4, dict(skip_full_mask=True, num_stages=3))):
            def run():
                return index_block_topk(
                    bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                    num_decode_tokens=0, context_splits=splits, _tune=tune)
            same, t = checked_time(
                timer, run,
                lambda: same_selection(run(), ref))
            out.append(dict(kind="prefill_index", context=ctx, context_splits=splits,
                            tune=tune, ids_equal_default=same, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_index_split(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index, 8192-token chunk at the end of 8k / 32k / 128k contexts:
    each tile's splits dividing the blocks its rows see (the default) against fixed
    context ranges (``split_visible=False``), with the block table as wide as
    the context and as wide as a 128k-token engine's (``table`` 131072: the
    fixed ranges are then sized by the table, not the context)."""
    out = []
    for ctx in (8192, 32768, 131072):
        bt = Batch([ctx], 8192, 0, dev)
        tables = {ctx: bt.block_table}
        if ctx < 131072:
            wide = torch.zeros(1, 131072 // PAGE, dtype=torch.int32, device=dev)
            wide[:, :bt.block_table.shape[1]] = bt.block_table
            tables[131072] = wide
        ref = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                               B, TOPK, num_decode_tokens=0, _tune=dict(split_visible=False))
        variants = [("visible", None), ("fixed", dict(split_visible=False))]
        # INDEX_SPLIT_TUNES: more variants, "name:json _tune" joined by ";"
        variants += [(name, json.loads(tune)) for name, tune in
                     (spec.split(":", 1) for spec in
                      filter(None, os.environ.get("INDEX_SPLIT_TUNES", "").split(";")))]
        for width, table in tables.items():
            for name, tune in variants[:2] if width != ctx else variants:
                def run():
                    return index_block_topk(bt.idx_q, bt.idx_k, table, bt.token_req,
                                            bt.token_pos, B, TOPK, num_decode_tokens=0,
                                            _tune=tune)
                same, t = checked_time(
                    timer, run,
                    lambda: bool(torch.equal(run().sort(-1).values, ref.sort(-1).values)))
                try:  # each kernel's device time (profiler), the table as wide as the context
                    kt = kernel_times(run, timer, reps=10) if width == ctx else None
                except Exception as e:  # noqa: BLE001
                    kt = repr(e)[:200]
                out.append(dict(kind="prefill_index_split", context=ctx, table=width,
                                splits=name, tune=tune, ids_equal_fixed=same, us=t, kernels=kt))
                print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_index_wide(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index with 256 query rows per program (each key tile feeds
    twice the rows) against the default 128, 8192-token chunk at 128k / 32k."""
    out = []
    for ctx in (131072, 32768):
        bt = Batch([ctx], 8192, 0, dev)
        ref = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                               B, TOPK, num_decode_tokens=0)
        for tune in (None, dict(BLOCK_M=256, num_warps=8), dict(BLOCK_M=256, num_warps=4),
                     dict(BLOCK_M=128, num_warps=8), dict(BLOCK_M=128, num_warps=4, num_stages=1)):
            def run():
                return index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                        bt.token_pos, B, TOPK, num_decode_tokens=0, _tune=tune)
            same, t = checked_time(
                timer, run,
                lambda: same_selection(run(), ref))
            out.append(dict(kind="prefill_index_wide", context=ctx, tune=tune,
                            ids_equal_default=same, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_index_shapes(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index tile shapes and prefetch_rows (run 7's sweep)."""
    out = []
    for ctx in (32768, 131072):
        bt = Batch([ctx], 8192, 0, dev)
        for tune in (dict(BLOCK_M=64, num_warps=4), dict(BLOCK_M=64, num_warps=8),
                     dict(BLOCK_M=128, num_warps=4), dict(BLOCK_M=128, num_warps=8),
                     dict(BLOCK_M=128, num_warps=8, num_stages=2),
                     dict(BLOCK_M=64, num_warps=4, num_stages=2),
                     dict(BLOCK_M=128, num_warps=4, prefetch_rows=True),
                     dict(BLOCK_M=64, num_warps=4, prefetch_rows=True)):
            _, t = checked_time(timer, lambda: index_block_topk(
                bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                num_decode_tokens=0, _tune=tune))
            out.append(dict(kind="prefill_index", context=ctx, tune=tune, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_tiles(timer, dev, index_block_topk, block_sparse_attention):
    """Token tiles of the prefill attention by context length (the rule's
    threshold): an 8192-token chunk at the end of 8k-64k contexts, the
    index's own selections, bf16 and fp8 KV, TM 0 (one token per program),
    2, 4, 8."""
    out = []
    for ctx in (8192, 16384, 32768, 65536):
        for kv_mode in (0, 1):
            bt = Batch([ctx], 8192, kv_mode, dev)
            sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                   bt.token_pos, B, TOPK, num_decode_tokens=0)
            o = torch.empty_like(bt.q)
            for tm in (0, 2, 4, 8):
                t = timer.time_fn(lambda tm=tm: block_sparse_attention(
                    bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B, D ** -0.5,
                    kv_mode, bt.k_scale, bt.v_scale, None, out=o, token_tile=tm))
                out.append(dict(kind="prefill_tiles", kv_mode=kv_mode, context=ctx,
                                token_tile=tm, rule=default_token_tile(
                                    block_sparse_attention, ctx, kv_mode != 0),
                                distinct_per_4=distinct_per_tile(sel, 4), us=t))
                print(f"[sweep] {out[-1]}", flush=True)
            del bt
    return out


def sweep_block_major(timer, dev, index_block_topk, block_sparse_attention):
    """Block-major prefill attention (``block_major`` pairs per program, warps)
    against one token per program and the context-length rule, an 8192-token
    chunk at the end of 8k-128k contexts, the index's own selections, bf16 and
    fp8 KV; each variant's output is compared with one token per program's.
    ``BLOCK_MAJOR_VARIANTS`` (comma-separated names) times only those
    variants, without the side launches and the short chunks;
    ``BLOCK_MAJOR_KV_MODES`` picks the KV scale modes (default ``0,1``; 2 = fp8
    with per-token-head scales)."""
    out = []
    only = {v for v in os.environ.get("BLOCK_MAJOR_VARIANTS", "").split(",") if v}
    kv_modes = [int(m) for m in os.environ.get("BLOCK_MAJOR_KV_MODES", "0,1").split(",")]
    for ctx in (8192, 32768, 131072):
        for kv_mode in kv_modes:
            bt = Batch([ctx], 8192, kv_mode, dev)
            sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                   bt.token_pos, B, TOPK, num_decode_tokens=0)
            ref = torch.empty_like(bt.q)
            o = torch.empty_like(bt.q)
            rule = default_token_tile(block_sparse_attention, ctx, kv_mode != 0)
            for name, kw in (("per_token", dict(token_tile=0)),
                             ("rule", dict(token_tile=rule)),
                             ("bm4", dict(block_major=4)), ("bm8", dict(block_major=8)),
                             ("bm4_c128", dict(block_major=4,
                                               _tune=dict(pairs_per_program=128))),
                             ("bm4_mw2", dict(block_major=4, _tune=dict(merge_warps=2))),
                             # the default is one stage since run 10
                             ("bm4_s2", dict(block_major=4, _tune=dict(num_stages=2))),
                             ("bm4_c32", dict(block_major=4,
                                              _tune=dict(pairs_per_program=32))),
                             ("bm4_w8", dict(block_major=4, _tune=dict(num_warps=8))),
                             ("bm2", dict(block_major=2)),
                             ("bm8_w4", dict(block_major=8, _tune=dict(num_warps=4))),
                             # each step's rows loaded during the step before (the
                             # default unless the cache is fp8), forced on and off
                             ("bm4_pf", dict(block_major=4, _tune=dict(prefetch_pairs=True))),
                             ("bm4_nopf", dict(block_major=4,
                                               _tune=dict(prefetch_pairs=False))),
                             # fp8 cache: the held block in bf16, the MMA in bf16 (with
                             # and without the prefetch); the same as bm4 for bf16
                             ("bm4_qmma", dict(block_major=4, _tune=dict(
                                 query_mma=True, prefetch_query=True))),
                             # prefetch without the query rows (loaded at the step's top)
                             ("bm4_pfnoq", dict(block_major=4, _tune=dict(
                                 prefetch_pairs=True, prefetch_query=False))),
                             ("bm4_qmma_pfnoq", dict(block_major=4, _tune=dict(
                                 query_mma=True, prefetch_pairs=True, prefetch_query=False))),
                             # the fp8 default before run 11 (fp16 MMA, no prefetch)
                             ("bm4_fp16_nopf", dict(block_major=4, _tune=dict(
                                 query_mma=False, prefetch_pairs=False))),
                             ("bm4_qmma_nopf", dict(block_major=4, _tune=dict(
                                 query_mma=True, prefetch_pairs=False))),
                             # scalar fp8 scales: v_scale in the kernel's partials (and
                             # then, to avoid spills, no query prefetch: the default
                             # before run 17), or in the merge without the query prefetch
                             ("bm4_vkern", dict(block_major=4, _tune=dict(
                                 v_scale_in_merge=False))),
                             ("bm4_vmerge_noq", dict(block_major=4, _tune=dict(
                                 prefetch_query=False))),
                             # per-token-head scales (BLOCK_MAJOR_KV_MODES=2) multiplied
                             # into the held block once, both prefetches (the default
                             # since run 19), or at each step in an fp16 MMA without
                             # prefetch (the default before)
                             ("bm4_m2held", dict(block_major=4, _tune=dict(
                                 scale_held_kv=True))),
                             ("bm4_m2step", dict(block_major=4, _tune=dict(
                                 scale_held_kv=False))),
                             # the chunk in slices of at most this many MiB of partial
                             # outputs (default 512: one slice for 8192 tokens x 16
                             # heads x top-16 in fp16), so each slice's partials may
                             # still be in L2 (60 MiB) when its merge reads them
                             *((f"bm4_pb{mib}", dict(block_major=4, _tune=dict(
                                 partial_bytes=mib << 20))) for mib in (32, 64, 128, 256)),
                             # the grouping's counters added once per pair instead
                             # of once per group and program (the default, whose
                             # programs sort their pairs by group)
                             ("bm4_per_pair_ranks", dict(block_major=4, _tune=dict(
                                 aggregate_ranks=False)))):
                if only and name not in only and name != "per_token":
                    continue

                def run(o=o, kw=kw):
                    return block_sparse_attention(
                        bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                        D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o, **kw)
                try:
                    if name == "per_token":
                        run(o=ref)
                    o.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    diff = float((o.float() - ref.float()).abs().max())
                    t = timer.time_fn(run)
                except Exception as e:  # noqa: BLE001
                    diff, t = None, repr(e)[:200]
                out.append(dict(kind="block_major", context=ctx, kv_mode=kv_mode, variant=name,
                                max_diff=diff, us=t))
                print(f"[sweep] {out[-1]}", flush=True)
            if not only:
                out.extend(block_major_parts(timer, bt, sel, ctx, kv_mode))
            del bt
    if only:
        return out
    # short chunks: where the grouping's fixed cost stops paying
    for n in (256, 512, 1024, 2048, 4096):
        for kv_mode in (0, 1):
            bt = Batch([32768], n, kv_mode, dev)
            sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                   bt.token_pos, B, TOPK, num_decode_tokens=0)
            o = torch.empty_like(bt.q)
            for name, kw in (("per_token", dict(token_tile=0)), ("bm4", dict(block_major=4))):
                t = timer.time_fn(lambda kw=kw: block_sparse_attention(
                    bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                    D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, None, out=o, **kw))
                out.append(dict(kind="block_major", context=32768, tokens=n, kv_mode=kv_mode,
                                variant=name, us=t))
                print(f"[sweep] {out[-1]}", flush=True)
            del bt
    return out


def block_major_parts(timer, bt, sel, ctx, kv_mode):
    """The block-major path's two side launches alone: the device-side
    grouping of the pairs (64 per program) and the per-token merge of the
    TOPK per-block partials (fp16, as for a bf16 model) by warps, with its
    read bandwidth."""
    from vllm.models.minimax_m3.common.triton_ops.attention import block_major_tiles
    from vllm.models.minimax_m3.common.triton_ops.sparse_attn_merge import (
        sparse_attn_merge_kernel)
    T = bt.q.shape[0]
    max_blocks = bt.block_table.shape[1] * bt.kv.shape[2] // B
    res = []
    t = timer.time_fn(lambda: block_major_tiles(bt.token_req, sel, bt.block_table.shape[0],
                                                max_blocks, 64))
    res.append(dict(kind="block_major", context=ctx, kv_mode=kv_mode, variant="grouping_only",
                    us=t))
    part_o = torch.randn((T, HQ, TOPK, D), dtype=torch.float16, device=bt.q.device)
    part_lse = torch.randn((T, HQ, TOPK), dtype=torch.float32, device=bt.q.device)
    o = torch.empty_like(bt.q)
    for warps in (1, 2):
        t = timer.time_fn(lambda: sparse_attn_merge_kernel[(T, HQ)](
            part_o, part_lse, o, part_lse, o.stride(0), o.stride(1), HQ=HQ, S=TOPK,
            S_PAD=TOPK, D=D, D_PAD=D, num_warps=warps))
        res.append(dict(kind="block_major", context=ctx, kv_mode=kv_mode,
                        variant=f"merge_only_w{warps}", us=t,
                        gb_s=(part_o.numel() * 2 + part_lse.numel() * 4) / t / 1e3))
    for r in res:
        print(f"[sweep] {r}", flush=True)
    return res


def sweep_prefill_attn(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill attention key tiles, warps, stages and prefetch_rows."""
    out = []
    for kv_mode in (0, 1):
        bt = Batch([32768], 8192, kv_mode, dev)
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        o = torch.empty_like(bt.q)
        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B,
                         TOPK, out=sel, num_decode_tokens=0)
        for tune in (dict(BLOCK_N=64, num_warps=4), dict(BLOCK_N=128, num_warps=4),
                     dict(BLOCK_N=128, num_warps=8), dict(BLOCK_N=32, num_warps=4),
                     dict(BLOCK_N=64, num_warps=4, num_stages=3),
                     dict(BLOCK_N=128, num_warps=8, num_stages=3),
                     dict(BLOCK_N=128, num_warps=4, prefetch_rows=True),
                     dict(BLOCK_N=64, num_warps=4, prefetch_rows=True)):
            _, t = checked_time(timer, lambda: block_sparse_attention(
                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B, D ** -0.5,
                kv_mode, bt.k_scale, bt.v_scale, None, out=o, _tune=tune))
            out.append(dict(kind="prefill_attn", kv_mode=kv_mode, context=32768, tune=tune, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_fp8_index(timer, dev, index_block_topk, block_sparse_attention):
    """Decode index over the fp8 index-key cache: blocks per program, software
    pipelining and warps (half the bytes of bf16 per block, the same chain of
    dependent loads, so the best launch shape may differ); every variant's
    selection is checked against the default's."""
    out = []
    for batch, ctx in ((32, 131072), (32, 32768), (32, 8192), (4, 131072), (1, 8192)):
        bt = Batch([ctx] * batch, 1, 0, dev, idx_fp8=True)
        ref = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        sel = torch.empty_like(ref)
        index_block_topk(bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req, bt.token_pos, B,
                         TOPK, idx_k_scales=bt.idx_s, out=ref, num_decode_tokens=bt.T)
        for bpp, tune in ((None, None), (1, None), (2, None), (4, None), (8, None),
                          (2, dict(decode_stages=2)), (4, dict(decode_stages=2)),
                          (4, dict(decode_stages=3)), (8, dict(decode_stages=3)),
                          (8, dict(decode_stages=4)), (16, dict(decode_stages=4)),
                          (4, dict(decode_warps=2)), (4, dict(decode_stages=3, decode_warps=8))):
            def run():
                return index_block_topk(
                    bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                    idx_k_scales=bt.idx_s, out=sel, num_decode_tokens=bt.T,
                    blocks_per_prog=bpp, _tune=tune)
            def same_as_ref():
                run()
                return same_selection(sel, ref)
            same, t = checked_time(timer, run, same_as_ref)
            out.append(dict(kind="fp8_index_decode", batch=batch, context=ctx,
                            blocks_per_prog=bpp, tune=tune, ids_equal_default=same, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_index_tiles(timer, dev, index_block_topk, block_sparse_attention):
    """Decode index scoring several sparse blocks per key load (``tile_blocks``),
    bf16 and fp8 index keys, against each kind's default launch; every variant's
    selection is checked against the default's.  INDEX_TILE_SHAPES narrows it."""
    variants = {
        False: ((None, None), (2, dict(tile_blocks=2)), (4, dict(tile_blocks=2)),
                (4, dict(tile_blocks=2, decode_stages=2)), (8, dict(tile_blocks=4))),
        True: ((None, None), (4, dict(tile_blocks=2)), (4, dict(tile_blocks=2, decode_stages=3)),
               (8, dict(tile_blocks=2, decode_stages=3)), (8, dict(tile_blocks=2, decode_stages=2)),
               (4, dict(tile_blocks=2, decode_stages=2, decode_warps=8)),
               (8, dict(tile_blocks=4, decode_stages=2)), (16, dict(tile_blocks=4, decode_stages=3)),
               (8, dict(tile_blocks=4)), (16, dict(tile_blocks=2, decode_stages=2)),
               (16, dict(tile_blocks=2, decode_stages=3)), (8, dict(tile_blocks=2, decode_stages=4)),
               (8, dict(tile_blocks=2, decode_stages=2, decode_warps=2))),
    }
    return _sweep_index_variants(timer, dev, index_block_topk, variants, "index_tiles")


def _sweep_index_variants(timer, dev, index_block_topk, variants, kind):
    """Times each (blocks_per_prog, _tune) of ``variants[fp8_index]`` at the
    INDEX_TILE_SHAPES; its ids against the default launch's (equal, overlap).
    (Run 50 timed two more decode dot forms here, the keys as the MMA's left
    operand and the dot in e4m3; neither was faster: 2026-12-02-gpu-h200-run50.md.)"""
    out = []
    for batch, ctx in env_shapes("INDEX_TILE_SHAPES", "32x131072,32x32768,32x8192,1x8192"):
        bt = Batch([ctx] * batch, 1, 0, dev, idx_fp8=True)
        for fp8 in (False, True):
            keys = dict(idx_k_scales=bt.idx_s) if fp8 else {}
            k = bt.idx_k8 if fp8 else bt.idx_k
            ref = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
            sel = torch.empty_like(ref)
            index_block_topk(bt.idx_q, k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                             out=ref, num_decode_tokens=bt.T, **keys)
            for bpp, tune in variants[fp8]:
                def run(bpp=bpp, tune=tune):
                    return index_block_topk(
                        bt.idx_q, k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                        out=sel, num_decode_tokens=bt.T, blocks_per_prog=bpp, _tune=tune, **keys)
                ov = {}

                def same_as_ref(run=run, ov=ov):
                    run()
                    ov["overlap"] = overlap(sel, ref)
                    return same_selection(sel, ref)
                same, t = checked_time(timer, run, same_as_ref)
                out.append(dict(kind=kind, batch=batch, context=ctx, fp8_index=fp8,
                                blocks_per_prog=bpp, tune=tune, ids_equal_default=same,
                                overlap_default=ov.get("overlap"), us=t))
                print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out

