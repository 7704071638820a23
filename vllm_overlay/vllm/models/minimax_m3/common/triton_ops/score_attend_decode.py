# SPDX-License-Identifier: Apache-2.0
"""Decode in two launches for small batches over short block tables: every
visible block scored *and* attended at once, the top-k chosen afterwards.

The decode chain (index scores, top-k select, attention over the selected
blocks, split merge) is four dependent launches.  At batch 1-2 with at most
``SELECT_MAX_BLOCKS`` sparse blocks per row (8k context at 128-token blocks)
it keeps most SMs idle and its time is the latency of those launches and of
their dependent loads.  Here:

  score_attend_block_kernel  one program per (sparse block, token, KV head):
                             the block's index score for that head's index
                             query (as ``index_score_decode``: the max fp32
                             dot over the visible keys, +inf for forced
                             blocks) and the attention of the KV head's ``G``
                             query heads over the block's visible keys (the
                             per-token kernel's key-tile update), written as
                             a split partial;
  score_attend_merge_kernel  one program per (token, query head, column
                             chunk): ranks its KV head's score row
                             (``row_ranks``: the slots of the rank select,
                             ties to the lower block) and merges the
                             partials of the chosen blocks by log-sum-exp.

The result is the block-sparse attention over the top-k blocks, as the
chain computes it; the blocks that are not chosen cost work on SMs that
the chain leaves idle (and bytes: all visible K/V instead of top-k of it).

Layouts (element strides, last dims contiguous):
  idx_q [T, H, DI] (H == Hkv index heads); idx_k [num_pages, page_size, DI]
  (model dtype, or fp8 with idx_ks [num_pages, page_size] float32)
  q [T, Hq, D];  kv_cache [num_pages, 2, page_size, Hkv, D]
  scores  [T, H, NB] float32: written for blocks up to the token's own
  part_o  [T, Hq, NB, D_PAD] float32 (float16 for half-precision queries),
          normalised per block (v_scale applied with SCALE_MODE 1)
  part_lse [T, Hq, NB] float32 (log2 of the block's softmax mass); both
          written for blocks up to the own block
  out     [T, Hq, D] (q dtype)
Scale modes (``SCALE_MODE``) as ``sparse_attn_fwd``.

PDL (programmatic dependent launch, CUDA sm90+; the wrapper launches both
kernels with ``launch_pdl``), as the decode chain: each program first lets
the next launch start and reads what was written before the previous launch
began (position, request, queries, scalar scales, and the block-table pages
of its first key tile), then waits for the previous launch to complete
before it reads a cache, a score or a partial, and before it writes
anything.  The merge's launch thus overlaps the
block launch's tail, and the block launch the cache write's.
"""

from ._attend import (attend_key_tile, group_query_rows, load_key_rows, normalized_output,
                      scales_and_operand)
from ._paged import fp16_dot_operand, paged_rows
from ._triton import tl, tl_cuda, triton
from .index_score_decode import _key_scores_at
from .index_topk_select import vector_ranks


@triton.jit
def score_attend_block_kernel(
    idx_q_ptr, idx_k_ptr, idx_ks_ptr, q_ptr, kv_ptr, bt_ptr, req_ptr, pos_ptr,
    scores_ptr, part_o_ptr, part_lse_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr,
    sm_scale, NB,
    stride_iqt, stride_iqh, stride_ikp, stride_iks, stride_isp, stride_iss,
    stride_qt, stride_qh,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_bt, stride_st, stride_sth,
    HQ: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr, DI: tl.constexpr, DI_PAD: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, IDX_BLOCK_N: tl.constexpr, KEY_SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    LOCAL: tl.constexpr, INIT: tl.constexpr,
    K_SCALED: tl.constexpr, SCALE_MODE: tl.constexpr, IEEE: tl.constexpr,
    FP16_MMA: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (block b, token t, role): for KV head ``g = role // (2 *
    KEY_SPLIT)`` and ``r = role % (2 * KEY_SPLIT)``, r < KEY_SPLIT scores key
    range r (``SPARSE_BLOCK / KEY_SPLIT`` keys) of block b with head g's index
    query (its max, to ``scores[t, g, b * KEY_SPLIT + r]``); r >= KEY_SPLIT
    attends key range ``r - KEY_SPLIT`` for the group's query heads (partial
    ``b * KEY_SPLIT + r - KEY_SPLIT``).  Programs with few bytes each: at
    batch 1 the launch lasts as long as one program waits."""
    if PDL:
        tl_cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    t = tl.program_id(1)
    role = tl.program_id(2)
    g = role // (2 * KEY_SPLIT)
    r = role % (2 * KEY_SPLIT)
    KEYS: tl.constexpr = SPARSE_BLOCK // KEY_SPLIT
    t64 = t.to(tl.int64)
    req = tl.load(req_ptr + t)
    pos = tl.load(pos_ptr + t)
    own = pos // SPARSE_BLOCK
    bt_row = bt_ptr + req.to(tl.int64) * stride_bt
    if r < KEY_SPLIT:
        if b <= own:  # later blocks hold no key of this token
            # head g's index query as row 0 of a 16-row tile (the dot's smallest M)
            offs_h = tl.arange(0, 16)
            offs_di = tl.arange(0, DI_PAD)
            dimask = offs_di < DI
            qi = tl.load(idx_q_ptr + t64 * stride_iqt + (g + offs_h)[:, None] * stride_iqh
                         + offs_di[None, :], mask=(offs_h < 1)[:, None] & dimask[None, :],
                         other=0.0)
            if K_SCALED and not IEEE:
                qi = fp16_dot_operand(qi)
            key_lo = b * SPARSE_BLOCK + r * KEYS
            offs_n = tl.arange(0, IDX_BLOCK_N)
            kp = key_lo + offs_n
            row, srow = paged_rows(bt_row, kp, kp <= pos, stride_ikp, stride_iks, stride_isp,
                                  stride_iss, PAGE_SIZE, K_SCALED)
            if PDL:
                tl_cuda.gdc_wait()  # the cache write before this launch is complete
            best = tl.full([16], float("-inf"), tl.float32)
            for n0 in tl.static_range(0, KEYS, IDX_BLOCK_N):
                if n0 > 0:
                    kp = key_lo + n0 + offs_n
                    row, srow = paged_rows(bt_row, kp, kp <= pos, stride_ikp, stride_iks,
                                          stride_isp, stride_iss, PAGE_SIZE, K_SCALED)
                si = _key_scores_at(qi, idx_k_ptr, idx_ks_ptr, row, srow, kp <= pos, offs_di,
                                    dimask, K_SCALED, IEEE)
                best = tl.maximum(best, tl.max(si, axis=1))
            # forced blocks (own, LOCAL - 1 before it, the first INIT): +inf
            best = tl.where((b > own - LOCAL) | (b < INIT), float("inf"), best)
            tl.store(scores_ptr + t64 * stride_st + (g + offs_h) * stride_sth
                     + b * KEY_SPLIT + r, best, mask=offs_h < 1)
    else:
        r -= KEY_SPLIT
        key_lo = b * SPARSE_BLOCK + r * KEYS
        if key_lo <= pos:  # else no visible key in this range (nor a partial)
            offs_d = tl.arange(0, D_PAD)
            offs_n = tl.arange(0, BLOCK_N)
            dmask = offs_d < D
            q, heads, mmask = group_query_rows(q_ptr, t64, g, offs_d, dmask, stride_qt,
                                               stride_qh, G, G_PAD)
            q, qk_scale, k_elem_scale, v_elem_scale, out_scale = scales_and_operand(
                q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE, IEEE, FP16_MMA)
            k_base = kv_ptr + g * stride_ch
            v_base = kv_ptr + stride_ckv + g * stride_ch
            m_i = tl.full([G_PAD], float("-inf"), tl.float32)
            l_i = tl.zeros([G_PAD], tl.float32)
            acc = tl.zeros([G_PAD, D_PAD], tl.float32)
            kp = key_lo + offs_n
            row, srow = paged_rows(bt_row, kp, kp <= pos, stride_cp, stride_cs, stride_sp,
                                  stride_ss, PAGE_SIZE, SCALE_MODE == 2)
            if PDL:
                tl_cuda.gdc_wait()
            for n0 in tl.static_range(0, KEYS, BLOCK_N):
                if n0 > 0:
                    kp = key_lo + n0 + offs_n
                    row, srow = paged_rows(bt_row, kp, kp <= pos, stride_cp, stride_cs,
                                          stride_sp, stride_ss, PAGE_SIZE, SCALE_MODE == 2)
                kvalid = kp <= pos
                k, v, ksc, vsc = load_key_rows(
                    k_base, v_base, kvs_ptr, row, srow, kvalid, offs_d, dmask, g,
                    k_elem_scale, v_elem_scale, stride_skv, stride_sh, SCALE_MODE)
                m_i, l_i, acc = attend_key_tile(q, k, v, kvalid[None, :], m_i, l_i, acc,
                                                qk_scale, ksc, vsc, SCALE_MODE, IEEE)
            o = normalized_output(acc, l_i, out_scale, SCALE_MODE)
            # the range's first key is visible, so l_i > 0 on real rows
            lse = m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0))
            ph = (t64 * HQ + heads) * (NB * KEY_SPLIT) + b * KEY_SPLIT + r
            tl.store(part_o_ptr + ph[:, None] * D_PAD + offs_d[None, :],
                     o.to(part_o_ptr.dtype.element_ty),
                     mask=mmask[:, None] & dmask[None, :])
            tl.store(part_lse_ptr + ph, lse, mask=mmask)


@triton.jit
def score_attend_merge_kernel(
    scores_ptr, part_o_ptr, part_lse_ptr, pos_ptr, out_ptr, NB,
    stride_st, stride_sth, stride_ot, stride_oh,
    HQ: tl.constexpr, G: tl.constexpr, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr,
    NB_PAD: tl.constexpr, KEY_SPLIT: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, DC: tl.constexpr,
    ONE_ROUND: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (token, query head, column chunk of DC): ranks the token's
    block scores (as ``row_ranks``: ties to the lower block) and merges the
    partials of the chosen blocks' key ranges that hold a visible key (only
    those were written: masked loads, and ``where``, never a product, with
    what the rest hold).  ONE_ROUND loads every written partial row with the
    scores, before the ranks are known (one round of dependent loads, all of
    the rows' bytes); otherwise only the chosen rows, after the ranks."""
    if PDL:
        tl_cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_c = tl.program_id(2) * DC + tl.arange(0, DC)
    t64 = t.to(tl.int64)
    pos = tl.load(pos_ptr + t)
    if PDL:
        tl_cuda.gdc_wait()  # the block launch's scores and partials are complete
    n_valid = tl.minimum(pos // SPARSE_BLOCK + 1, NB)
    # block scores: the max of their key ranges' (all written up to the own block)
    offs_b = tl.arange(0, NB_PAD)
    offs_r = tl.arange(0, KEY_SPLIT)
    sc = tl.load(scores_ptr + t64 * stride_st + (h // G) * stride_sth
                 + offs_b[:, None] * KEY_SPLIT + offs_r[None, :],
                 mask=(offs_b < NB)[:, None], other=float("-inf"))
    row0 = (t64 * HQ + h) * (NB * KEY_SPLIT)
    if ONE_ROUND:  # rows [block, key range] flattened
        P: tl.constexpr = NB_PAD * KEY_SPLIT
        offs_p = tl.arange(0, P)
        written = offs_p * (SPARSE_BLOCK // KEY_SPLIT) <= pos
        lse = tl.load(part_lse_ptr + row0 + offs_p, mask=written, other=float("-inf"))
        o = tl.load(part_o_ptr + (row0 + offs_p)[:, None] * D_PAD + offs_c[None, :],
                    mask=written[:, None], other=0.0).to(tl.float32)
        sc = tl.where((offs_b < n_valid)[:, None], sc, float("-inf"))
        _, chosen = vector_ranks(tl.max(sc, axis=1), TOPK)
        take = tl.reshape(tl.broadcast_to(chosen[:, None], [NB_PAD, KEY_SPLIT]), [P]) & written
    else:  # rows [slot, key range] flattened
        sc = tl.where((offs_b < n_valid)[:, None], sc, float("-inf"))
        rank, chosen = vector_ranks(tl.max(sc, axis=1), TOPK)
        # slot i: the block of rank i (block id + 1 summed, so 0 marks an empty slot)
        offs_k = tl.arange(0, TOPK_PAD)
        hit = (rank[None, :] == offs_k[:, None]) & chosen[None, :]
        ids = tl.sum(tl.where(hit, tl.arange(0, NB_PAD)[None, :] + 1, 0), axis=1) - 1
        P2: tl.constexpr = TOPK_PAD * KEY_SPLIT
        offs_p = tl.arange(0, P2)
        blk = tl.reshape(tl.broadcast_to(ids[:, None], [TOPK_PAD, KEY_SPLIT]), [P2])
        rng = offs_p % KEY_SPLIT
        take = (blk >= 0) & (blk * SPARSE_BLOCK + rng * (SPARSE_BLOCK // KEY_SPLIT) <= pos)
        prow = row0 + blk * KEY_SPLIT + rng
        lse = tl.load(part_lse_ptr + prow, mask=take, other=float("-inf"))
        o = tl.load(part_o_ptr + prow[:, None] * D_PAD + offs_c[None, :], mask=take[:, None],
                    other=0.0).to(tl.float32)
    lse = tl.where(take, lse, float("-inf"))
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(take, tl.exp2(lse - m_safe), 0.0)
    w = w / tl.where(tl.sum(w, axis=0) > 0.0, tl.sum(w, axis=0), 1.0)
    res = tl.sum(tl.where(take[:, None], o * w[:, None], 0.0), axis=0)
    tl.store(out_ptr + t64 * stride_ot + h * stride_oh + offs_c,
             res.to(out_ptr.dtype.element_ty), mask=offs_c < D)
