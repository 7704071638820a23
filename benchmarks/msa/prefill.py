# SPDX-License-Identifier: Apache-2.0
"""The prefill table: an 8192-token chunk at the end of each context, bf16 / fp8 KV:
index + top-k, attention in the engine's layout, the whole step, dense SDPA, and the
token-tile / block-major / prefill-like-selection variants."""

import traceback

import torch

from .checks import Batch
from .harness import (B, D, DIDX, HIDX, HQ, KV_KINDS, TOPK, default_layout, distinct_per_tile,
                      sdpa_dense_prefill)

CHUNK = 8192


def prefill_rows(timer, dev, kernels, ctxs, chunk=CHUNK):
    """One row per (context, KV cache); ``kernels`` = (index_block_topk,
    block_sparse_attention)."""
    index_block_topk, block_sparse_attention = kernels
    pre = []
    for ctx in ctxs:
        for kv_name, kv_mode in KV_KINDS:
            row = dict(chunk=chunk, context=ctx, kv=kv_name)
            try:
                bt = Batch([ctx], chunk, kv_mode, dev)
                sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
                o = torch.empty_like(bt.q)

                def idx():
                    index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                     bt.token_pos, B, TOPK, out=sel, num_decode_tokens=0)

                # the engine's launch shape: block-major for long chunks, else
                # token tiles by the context-length rule
                layout = default_layout(block_sparse_attention, chunk, ctx, kv_mode != 0)
                row["layout"] = layout

                def attn(tm=None):
                    kw = layout if tm is None else dict(token_tile=tm)
                    block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                           bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                           bt.k_scale, bt.v_scale, bt.kv_scales, out=o, **kw)

                def total():
                    idx()
                    attn()

                idx()
                row["index_topk_ms"] = timer.time_fn(idx) / 1e3
                row["attention_ms"] = timer.time_fn(attn) / 1e3
                row["attention_per_token_ms"] = timer.time_fn(lambda: attn(0)) / 1e3
                row["total_ms"] = timer.time_fn(total) / 1e3
                flops = 4 * HQ * D * (sel >= 0).sum().item() * B  # upper bound (full blocks)
                row["attention_TFLOPs"] = flops / (row["attention_ms"] * 1e-3) / 1e12
                if kv_mode == 0:
                    row["dense_ms"] = timer.time_fn(sdpa_dense_prefill(chunk, ctx, dev)) / 1e3
                    if ctx == chunk:  # the whole context: plain causal, flash kernels
                        row["dense_flash_ms"] = timer.time_fn(
                            sdpa_dense_prefill(chunk, ctx, dev, flash=True)) / 1e3
                try:  # variants: a failure here keeps the row's main numbers
                    # token tiles: one program per TM consecutive tokens, each distinct
                    # selected block of the tile read once (sparse_attn_tiled)
                    for tm in (2, 4, 8):
                        o_t = torch.full_like(o, float("nan"))

                        def attn_tiled(tm=tm, o_t=o_t):
                            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                                   bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                                   bt.k_scale, bt.v_scale, bt.kv_scales, out=o_t,
                                                   token_tile=tm)
                        attn_tiled()
                        attn()
                        torch.cuda.synchronize()
                        row[f"tiled{tm}_max_diff"] = float((o_t.float() - o.float()).abs().max())
                        row[f"attention_tiled{tm}_ms"] = timer.time_fn(attn_tiled) / 1e3
                    row["tile4_distinct_blocks"] = distinct_per_tile(sel, 4)
                    # block-major: pairs grouped by block on the device, up to BM
                    # (token, slot) pairs of one block per program, merged per token
                    for bm in (4, 8):
                        o_b = torch.full_like(o, float("nan"))

                        def attn_bm(bm=bm, o_b=o_b):
                            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                                   bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                                   bt.k_scale, bt.v_scale, bt.kv_scales,
                                                   out=o_b, block_major=bm)
                        try:
                            attn_bm()
                            attn(0)
                            torch.cuda.synchronize()
                            row[f"block_major{bm}_max_diff"] = float(
                                (o_b.float() - o.float()).abs().max())
                            row[f"attention_block_major{bm}_ms"] = timer.time_fn(attn_bm) / 1e3
                        except Exception:  # noqa: BLE001 -- kernels that predate it
                            row[f"block_major{bm}_error"] = traceback.format_exc()[-400:]
                    # prefill-like selections: index queries shared by 256-token windows
                    # (plus noise), so neighbouring tokens choose mostly the same blocks,
                    # as real text does; random index queries (above) are the worst case
                    win = 256
                    base = torch.randn(-(-bt.T // win), HIDX, DIDX, device=dev)
                    qc = (base.repeat_interleave(win, 0)[:bt.T]
                          + 0.3 * torch.randn(bt.T, HIDX, DIDX, device=dev)).to(bt.idx_q.dtype)
                    selc = index_block_topk(qc, bt.idx_k, bt.block_table, bt.token_req,
                                            bt.token_pos, B, TOPK, num_decode_tokens=0)
                    row["corr_tile4_distinct_blocks"] = distinct_per_tile(selc, 4)
                    row["attention_corr_ms"] = timer.time_fn(lambda: block_sparse_attention(
                        bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, selc, B,
                        D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o)) / 1e3
                    for tm in (4, 8):
                        row[f"attention_corr_tiled{tm}_ms"] = timer.time_fn(
                            lambda tm=tm: block_sparse_attention(
                                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, selc, B,
                                D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o,
                                token_tile=tm)) / 1e3
                    if kv_mode == 1:  # scalar scales unfolded (seed 002's A/B)
                        row["attention_unfolded_ms"] = timer.time_fn(lambda: block_sparse_attention(
                            bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                            D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o,
                            fold_scalar_scales=False)) / 1e3
                except Exception:  # noqa: BLE001
                    row["variant_error"] = traceback.format_exc()
                    print(row["variant_error"], flush=True)
                del bt
            except Exception:  # noqa: BLE001
                row["error"] = traceback.format_exc()
                print(row["error"], flush=True)
            torch.cuda.empty_cache()
            print(f"[prefill] {row}", flush=True)
            pre.append(row)
    return pre
