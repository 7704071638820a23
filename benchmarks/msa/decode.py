# SPDX-License-Identifier: Apache-2.0
"""The decode table: batch x context x KV cache, index + top-k, attention and the
engine's whole step (chain or score-attend), its one-launch, PDL and fp8-index
variants, against the HBM floor and dense SDPA."""

import traceback

import torch

from .checks import Batch, overlap, same_selection
from .harness import (B, D, DIDX, HIDX, HKV, KV_KINDS, TOPK, engine_takes_score_attend,
                      score_attend_step, sdpa_dense_decode)


def decode_rows(timer, dev, kernels, batches, ctxs, bw):
    """One row per (batch, context, KV cache); ``kernels`` = (index_block_topk,
    block_sparse_attention); ``bw`` the copy bandwidth (bytes/s) for the floor."""
    index_block_topk, block_sparse_attention = kernels
    dec = []
    for batch in batches:
        for ctx in ctxs:
            for kv_name, kv_mode in KV_KINDS:
                row = dict(batch=batch, context=ctx, kv=kv_name)
                try:
                    bt = Batch([ctx] * batch, 1, kv_mode, dev, idx_fp8=True)
                    sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
                    o = torch.empty_like(bt.q)

                    def idx():
                        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                         bt.token_pos, B, TOPK, out=sel,
                                         num_decode_tokens=bt.T)

                    def attn():
                        block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                               bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                               bt.k_scale, bt.v_scale, bt.kv_scales, out=o)

                    def total():
                        idx()
                        attn()

                    idx()
                    torch.cuda.synchronize()
                    g_idx, g_attn, g_tot = timer.graph(idx), timer.graph(attn), timer.graph(total)
                    row["index_topk_us"] = timer.time_graph(g_idx)
                    row["attention_us"] = timer.time_graph(g_attn)
                    row["total_us"] = timer.time_graph(g_tot)
                    row["total_warm_us"] = timer.time_graph(g_tot, flush=False)
                    row["index_topk_clean_us"] = timer.time_graph(g_idx, "read")
                    row["attention_clean_us"] = timer.time_graph(g_attn, "read")
                    row["total_clean_us"] = timer.time_graph(g_tot, "read")
                    # the engine's path: the chain above, or for batch 1-2 over at most
                    # 64 blocks the two launches of score_attend_decode ("total" is the
                    # engine's; "total chain" the four launches)
                    row["total_chain_us"] = row["total_us"]
                    row["total_chain_clean_us"] = row["total_clean_us"]
                    row["path"] = "chain"
                    if engine_takes_score_attend(block_sparse_attention, bt, dev):
                        o_sa = torch.full_like(o, float("nan"))
                        sa = score_attend_step(block_sparse_attention, bt, kv_mode, o_sa)
                        sa()
                        attn()
                        torch.cuda.synchronize()
                        row["score_attend_max_diff"] = float((o_sa.float() - o.float())
                                                             .abs().max())
                        g_sa = timer.graph(sa)
                        row["path"] = "score_attend"
                        row["total_us"] = timer.time_graph(g_sa)
                        row["total_warm_us"] = timer.time_graph(g_sa, flush=False)
                        row["total_clean_us"] = timer.time_graph(g_sa, "read")
                    # the one-launch decode index (fused select): same ids, own timing
                    sel_f = torch.full_like(sel, -7)

                    def idx_fused():
                        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                         bt.token_pos, B, TOPK, out=sel_f,
                                         num_decode_tokens=bt.T, fused_select=True)

                    o_f = torch.empty_like(o)

                    def attn_fused():
                        block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                               bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                               bt.k_scale, bt.v_scale, bt.kv_scales, out=o_f,
                                               fused_merge=True)

                    def total_fused():
                        idx_fused()
                        attn_fused()
                    idx_fused()
                    torch.cuda.synchronize()
                    row["fused_select_equal"] = same_selection(sel_f, sel)
                    attn()
                    attn_fused()
                    torch.cuda.synchronize()
                    row["fused_merge_max_diff"] = float((o_f.float() - o.float()).abs().max())
                    row["attention_fused_us"] = timer.time_graph(timer.graph(attn_fused))
                    row["index_topk_fused_us"] = timer.time_graph(timer.graph(idx_fused))
                    row["total_fused_us"] = timer.time_graph(timer.graph(total_fused))
                    # programmatic dependent launch through the decode chain (each
                    # kernel starts while the one before it finishes): same ids and
                    # output, own timing
                    sel_p = torch.full_like(sel, -7)
                    o_p = torch.empty_like(o)

                    def idx_pdl():
                        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                         bt.token_pos, B, TOPK, out=sel_p,
                                         num_decode_tokens=bt.T, _tune=dict(pdl=True))

                    def attn_pdl():
                        block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                               bt.token_pos, sel_p, B, D ** -0.5, kv_mode,
                                               bt.k_scale, bt.v_scale, bt.kv_scales, out=o_p,
                                               _tune=dict(pdl=True))

                    def total_pdl():
                        idx_pdl()
                        attn_pdl()
                    total_pdl()
                    torch.cuda.synchronize()
                    row["pdl_select_equal"] = same_selection(sel_p, sel)
                    row["pdl_max_diff"] = float((o_p.float() - o.float()).abs().max())
                    row["index_topk_pdl_us"] = timer.time_graph(timer.graph(idx_pdl))
                    row["attention_pdl_us"] = timer.time_graph(timer.graph(attn_pdl))
                    g_pdl = timer.graph(total_pdl)
                    row["total_pdl_us"] = timer.time_graph(g_pdl)
                    row["total_pdl_warm_us"] = timer.time_graph(g_pdl, flush=False)
                    row["total_pdl_clean_us"] = timer.time_graph(g_pdl, "read")
                    if kv_mode == 1:  # seed 002's A/B at kernel level: scalar scales unfolded
                        row["attention_unfolded_us"] = timer.time_graph(timer.graph(
                            lambda: block_sparse_attention(
                                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                                D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales,
                                out=o_f, fold_scalar_scales=False)))
                    # K and V rows (and with per-token-head scales their fp32 scales)
                    row_bytes = 2 * D * (2 if kv_mode == 0 else 1) + (8 if kv_mode == 2 else 0)
                    kv_bytes = B * row_bytes * HKV * min(TOPK, ctx // B)
                    byt = batch * (ctx * DIDX * 2 + kv_bytes)
                    row["floor_us"] = byt / bw * 1e6
                    if bt.idx_k8 is not None:  # the fp8 index cache, with this KV cache
                        sel8 = torch.empty_like(sel)

                        def idx8():
                            index_block_topk(bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req,
                                             bt.token_pos, B, TOPK, idx_k_scales=bt.idx_s,
                                             out=sel8, num_decode_tokens=bt.T)
                        g8 = timer.graph(idx8)
                        row["index_topk_fp8idx_us"] = timer.time_graph(g8)
                        row["index_topk_fp8idx_clean_us"] = timer.time_graph(g8, "read")
                        row["floor_fp8idx_us"] = batch * (ctx * (DIDX + 4) + kv_bytes) / bw * 1e6
                        # the whole step with the fp8 index (the issue's "decode batch 32
                        # at 128k at most 160 us" is this total, not the index alone)
                        o8 = torch.empty_like(o)

                        def total8():
                            idx8()
                            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                                   bt.token_pos, sel8, B, D ** -0.5, kv_mode,
                                                   bt.k_scale, bt.v_scale, bt.kv_scales,
                                                   out=o8)
                        g8t = timer.graph(total8)
                        row["total_fp8idx_us"] = timer.time_graph(g8t)
                        row["total_fp8idx_clean_us"] = timer.time_graph(g8t, "read")
                    if kv_mode == 0:
                        idx()
                        idx8()
                        row["fp8idx_topk_overlap"] = overlap(sel8, sel)
                        row["dense_us"] = timer.time_fn(sdpa_dense_decode(bt))
                    del bt
                except Exception:  # noqa: BLE001
                    row["error"] = traceback.format_exc()
                    print(row["error"], flush=True)
                torch.cuda.empty_cache()
                print(f"[decode] {row}", flush=True)
                dec.append(row)
    return dec
