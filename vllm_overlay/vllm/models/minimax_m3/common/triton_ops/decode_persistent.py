# SPDX-License-Identifier: Apache-2.0
"""Decode in one persistent launch: index scoring, block top-k, block-sparse
attention and the split merge of a batch of decode tokens.

A fixed grid of programs takes work items, in order, from a ticket counter
until none is left:
  score items ``[0, T * N_SCORE)``, item (t, c): the per-block max index
      scores of sparse blocks ``[c * BPP, c * BPP + BPP)`` of token t for every
      index head (``score_sparse_block``, as in index_score_decode); the item
      that arrives last for token t selects the token's top-k
      (``select_topk_row``) and marks the token ready;
  attention items ``[T * N_SCORE, T * (N_SCORE + H * NUM_SPLITS))``, item
      (t, g, s): waits until token t is ready, then attends selection slots
      ``[s * SLOTS, s * SLOTS + SLOTS)`` for KV head g (``attend_selected_slots``,
      as in sparse_attn_fwd); the split that arrives last merges the partials
      (``write_split_result``).
Tickets are handed out in order, so by the time a program takes an
attention item every score item is held by a running program, and score
items never wait: every wait ends even when not all programs fit on the GPU
at once.  The attention of early tokens runs while later tokens are still
being scored: no gaps between launches, no tail between the phases.

Layouts (element strides, last dims contiguous): as index_score_decode
(idx_q [T, H, DI], idx_k_cache [pages, page_size, DI] with fp8 scales
idx_k_scales [pages, page_size]; scores [T, H, max_blocks] float32; sel
[T, H, TOPK] int32) and sparse_attn_fwd (q [T, H * G, D], kv_cache
[pages, 2, page_size, H, D], kv_scales, out [T, H * G, D], part_o
[T, H * G, NUM_SPLITS, D_PAD] / part_lse [T, H * G, NUM_SPLITS] float32).
Index heads are KV heads (H of each).
sync [2 + T + T * H] int32, zero before the launch and left zero:
  [0] the next ticket, [1] programs finished,
  [2 + t] token t's score arrivals (READY = N_SCORE + 1 once its top-k is out),
  [2 + T + t * H + g] the split arrivals of (t, g) (zeroed by its merge).
The last program to finish zeroes [0], [1] and the token counters.
"""

from ._attend import attend_selected_slots, scales_and_operand
from ._paged import fp16_dot_operand
from ._triton import tl, triton
from .index_score_decode import score_sparse_block
from .index_topk_select import select_topk_row
from .sparse_attn_fwd import write_split_result


@triton.jit
def msa_decode_persistent_kernel(
    iq_ptr, ik_ptr, iks_ptr, score_ptr, sel_ptr,
    q_ptr, kv_ptr, out_ptr, part_o_ptr, part_lse_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr,
    bt_ptr, req_ptr, pos_ptr, sync_ptr,
    T, max_blocks, sm_scale,
    stride_iqt, stride_iqh, stride_ikp, stride_iks, stride_isp, stride_iss,
    stride_qt, stride_qh,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_bt, stride_ot, stride_oh,
    H: tl.constexpr, H_PAD: tl.constexpr, DI: tl.constexpr, DI_PAD: tl.constexpr,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, SLOTS: tl.constexpr,
    NUM_SPLITS: tl.constexpr, S_PAD: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, IDX_BLOCK_N: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, LOCAL: tl.constexpr, INIT: tl.constexpr,
    BPP: tl.constexpr, N_SCORE: tl.constexpr,
    CHUNK: tl.constexpr, SINGLE_CHUNK: tl.constexpr, RANK: tl.constexpr,
    RANK_COLS: tl.constexpr, K_SCALED: tl.constexpr, IEEE_IDX: tl.constexpr,
    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, FP16_MMA: tl.constexpr,
    PREFETCH_ROWS: tl.constexpr,
):
    n_score = T * N_SCORE
    n_items = n_score + T * (H * NUM_SPLITS)
    tok_cnt = sync_ptr + 2
    offs_h = tl.arange(0, H_PAD)
    offs_di = tl.arange(0, DI_PAD)
    offs_ni = tl.arange(0, IDX_BLOCK_N)
    offs_m = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    hmask = offs_h < H
    dimask = offs_di < DI
    mmask = offs_m < G
    dmask = offs_d < D

    item = tl.atomic_add(sync_ptr, 1)
    while item < n_items:
        if item < n_score:
            t = item // N_SCORE
            b0 = (item - t * N_SCORE) * BPP
            t64 = t.to(tl.int64)
            req = tl.load(req_ptr + t)
            pos = tl.load(pos_ptr + t)
            own = pos // SPARSE_BLOCK
            nb = tl.minimum(own - b0 + 1, BPP)  # <= 0: nothing visible here
            qi = tl.load(iq_ptr + t64 * stride_iqt + offs_h[:, None] * stride_iqh
                         + offs_di[None, :], mask=hmask[:, None] & dimask[None, :], other=0.0)
            if K_SCALED and not IEEE_IDX:
                qi = fp16_dot_operand(qi)
            bt_row = bt_ptr + req.to(tl.int64) * stride_bt
            score_row = score_ptr + t64 * (H * max_blocks) + offs_h * max_blocks
            for i in range(0, nb):
                score_sparse_block(qi, ik_ptr, iks_ptr, bt_row, score_row, b0 + i, pos, own,
                                   offs_ni, offs_di, dimask, hmask, H_PAD,
                                   stride_ikp, stride_iks, stride_isp, stride_iss,
                                   SPARSE_BLOCK, IDX_BLOCK_N, PAGE_SIZE, LOCAL, INIT,
                                   K_SCALED, IEEE_IDX)
            # acq_rel: this item's score stores are released with the count, and
            # the last arriver acquires the others'
            tl.debug_barrier()
            arrived = tl.atomic_add(tok_cnt + t, 1, sem="acq_rel")
            if arrived == N_SCORE - 1:
                n_valid = tl.minimum(own + 1, max_blocks)
                for h in range(H):
                    select_topk_row(score_ptr, score_ptr, t64 * (H * max_blocks) + h * max_blocks,
                                    n_valid, sel_ptr + (t64 * H + h) * TOPK,
                                    TOPK, TOPK_PAD, CHUNK, False, SINGLE_CHUNK, True,
                                    RANK, RANK_COLS)
                tl.debug_barrier()  # every thread's selection stores precede the release
                tl.atomic_xchg(tok_cnt + t, N_SCORE + 1, sem="release")
        else:
            a = item - n_score
            t = a // (H * NUM_SPLITS)
            r = a - t * (H * NUM_SPLITS)
            g = r // NUM_SPLITS
            split = r - g * NUM_SPLITS
            t64 = t.to(tl.int64)
            req = tl.load(req_ptr + t)
            pos = tl.load(pos_ptr + t)
            heads = g * G + offs_m
            q = tl.load(q_ptr + t64 * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                        mask=mmask[:, None] & dmask[None, :], other=0.0)
            q, qk_scale, k_elem_scale, v_elem_scale = scales_and_operand(
                q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE, IEEE, FP16_MMA)
            # wait for the token's top-k (written by another program of this launch)
            ready = tl.atomic_add(tok_cnt + t, 0, sem="acquire")
            while ready != N_SCORE + 1:
                ready = tl.atomic_add(tok_cnt + t, 0, sem="acquire")
            bt_row = bt_ptr + req.to(tl.int64) * stride_bt
            m_i, l_i, acc = attend_selected_slots(
                q, sel_ptr + (t64 * H + g) * TOPK, bt_row, kv_ptr + g * stride_ch,
                kv_ptr + stride_ckv + g * stride_ch, kvs_ptr,
                split * SLOTS, tl.minimum(split * SLOTS + SLOTS, TOPK), pos, g,
                qk_scale, k_elem_scale, v_elem_scale,
                stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
                G_PAD, D, D_PAD, SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, SCALE_MODE, IEEE,
                PREFETCH_ROWS, True)
            write_split_result(
                acc, m_i, l_i, t64, heads, mmask, split, out_ptr, stride_ot, stride_oh,
                part_o_ptr, part_lse_ptr, H * G, sync_ptr + 2 + T + t64 * H + g, v_scale_ptr,
                D, D_PAD, NUM_SPLITS, S_PAD, G_PAD, SCALE_MODE, True)
        item = tl.atomic_add(sync_ptr, 1)

    # the last program out puts the queue and the token counters back to zero
    tl.debug_barrier()
    done = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel")
    if done == tl.num_programs(0) - 1:
        for t0 in range(0, T, 1024):
            offs = t0 + tl.arange(0, 1024)
            tl.store(tok_cnt + offs, tl.zeros([1024], tl.int32), mask=offs < T)
        tl.atomic_xchg(sync_ptr + 1, 0)
        tl.atomic_xchg(sync_ptr, 0)
