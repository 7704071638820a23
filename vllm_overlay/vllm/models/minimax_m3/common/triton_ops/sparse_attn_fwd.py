# SPDX-License-Identifier: Apache-2.0
"""Block-sparse GQA attention over selected sparse blocks (prefill + decode).

One program per (query token, KV head, split).  The ``G`` query heads of the
KV head's GQA group form the M dimension of the tile (padded to ``G_PAD``, a
power of two >= 16, padded rows masked), so K/V of each selected block are
read once for the whole group.  Split ``s`` walks selected-block slots
``[s*SLOTS, (s+1)*SLOTS)`` of ``topk_blocks[t, kv_head]`` with an online
softmax (base-2 exponent); -1 slots and keys after ``token_pos`` (causal inside
the own block) are masked.

Scale modes (``SCALE_MODE`` constexpr) for the KV cache:
  0: K/V stored in a float dtype, no scale.
  1: fp8 e4m3 with one scalar k_scale / v_scale per layer (float32 tensors of
     one element): k_scale is folded into the softmax scale and v_scale is
     applied once to the normalised fp32 accumulator.
  2: fp8 e4m3 with per (token, KV head) scales ``kv_scales`` [num_pages, 2,
     page_size, Hkv] float32: k scales multiply the score columns and v scales
     the probabilities fed to P@V -- identical to dequantising every element.
  3: the scalar scales of mode 1 applied to every loaded K and V element
     instead of folded (the pre-folding formulation; kept for A/B benchmarks,
     selected with ``fold_scalar_scales=False``).

Layouts (element strides):
  q        [T, Hq, D];  kv_cache [num_pages, 2, page_size, Hkv, D]
  topk     [T, Hkv, TOPK] int32 block ids (-1 = empty slot)
  NUM_SPLITS == 1: out [T, Hq, D] (q dtype), written normalised
  NUM_SPLITS  > 1: part_o [T, Hq, NUM_SPLITS, D] float32 (normalised per
                   split) and part_lse [T, Hq, NUM_SPLITS] float32 (log2 of
                   the split's softmax mass, -inf if empty), merged by
                   ``sparse_attn_merge``; or, with FUSED_MERGE, by the
                   split program of (token, KV head) that finishes last: it
                   counts arrivals in ``counters[t * Hkv + kv_head]`` (int32,
                   zero before the launch, put back to zero) and writes ``out``
                   (strides ``stride_fot``, ``stride_foh``).  One launch, no
                   merge kernel.
Rows with no visible key produce zeros.
KEY_SPLIT > 1 (decode, few tokens): each selected block is split too, in
``KEY_SPLIT`` ranges of ``SPARSE_BLOCK / KEY_SPLIT`` keys, one per program:
split ``s`` reads keys ``(s % KEY_SPLIT) * KEYS ...`` of the blocks in slots
``[(s // KEY_SPLIT) * SLOTS, ...)``; NUM_SPLITS counts these programs.  More
programs with fewer bytes and conversions each for a batch whose tokens x KV
heads x selected blocks leave most SMs idle.
SELECT_RANK (decode rows of ``SELECT_NB`` <= ``NB_PAD`` sparse blocks): ``topk_ptr``
holds the index's block scores ``[T, Hkv, SELECT_NB]`` float32 (``index_block_topk(
..., return_scores=True)``; +inf = forced, entries after the token's own block
unwritten) instead of block ids, and every program ranks its token's row
itself (``row_ranks``, as the select kernel's rank path): slot i is the block
of rank i, -1 past the chosen ones.  The same slots as the two-launch chain,
without the select launch.
PDL (programmatic dependent launch, CUDA sm90+, decode): the program lets the
next launch start, reads its query, position and request, then waits for the
previous launch (the top-k selection) to complete before anything else.
With an fp8 cache and bf16 queries (FP16_MMA) the tl.dot operands are fp16:
fp8 -> fp16 is exact and cheap, q is O(1..100) after q_norm + RoPE, and P in
[0, 1] keeps more mantissa in fp16 than in bf16.
"""

from ._attend import (attend_key_tile, group_query_rows, key_tile_rows, load_key_rows,
                      load_key_tile, scales_and_operand)
from ._triton import BATCH_PLACEMENT, tl, tl_cuda, triton
from .index_topk_select import row_ranks


@triton.jit(**BATCH_PLACEMENT)
def sparse_attn_fwd_kernel(
    q_ptr, kv_ptr, bt_ptr, req_ptr, pos_ptr, topk_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr, cnt_ptr,
    sm_scale,
    stride_qt, stride_qh,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_bt,
    stride_tt, stride_th,
    stride_ot, stride_oh,
    stride_fot, stride_foh,
    G: tl.constexpr, G_PAD: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr,
    TOPK: tl.constexpr, SLOTS: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, FP16_MMA: tl.constexpr,
    FUSED_MERGE: tl.constexpr = False, S_PAD: tl.constexpr = 2,
    PREFETCH_ROWS: tl.constexpr = False, PDL: tl.constexpr = False,
    SELECT_RANK: tl.constexpr = False, SELECT_NB: tl.constexpr = 1, NB_PAD: tl.constexpr = 16,
    RANK_COLS: tl.constexpr = 16, KEY_SPLIT: tl.constexpr = 1,
):
    if PDL:
        tl_cuda.gdc_launch_dependents()
    KEYS: tl.constexpr = SPARSE_BLOCK // KEY_SPLIT  # keys of each block this program reads
    t = tl.program_id(0)
    g = tl.program_id(1)
    split = tl.program_id(2)
    t64 = t.to(tl.int64)
    req = tl.load(req_ptr + t)
    pos = tl.load(pos_ptr + t)

    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    dmask = offs_d < D
    q, heads, mmask = group_query_rows(q_ptr, t64, g, offs_d, dmask, stride_qt, stride_qh,
                                       G, G_PAD)
    # the scales too are loaded now, not after the key walk
    q, qk_scale, k_elem_scale, v_elem_scale, out_scale = scales_and_operand(
        q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE, IEEE, FP16_MMA)
    if PDL:  # q, position, request and scales were written before the previous
        tl_cuda.gdc_wait()  # launch began; the selection (and cache) are complete now

    bt_row = bt_ptr + req.to(tl.int64) * stride_bt
    k_base = kv_ptr + g * stride_ch
    v_base = kv_ptr + stride_ckv + g * stride_ch
    topk_row = topk_ptr + t64 * stride_tt + g * stride_th

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)

    slot_lo = (split // KEY_SPLIT) * SLOTS
    key_lo = (split % KEY_SPLIT) * KEYS
    slot_hi = tl.minimum(slot_lo + SLOTS, TOPK)
    if PREFETCH_ROWS:
        # one loop over key tiles; the next tile's selection and block-table
        # loads are issued before this tile's K/V loads and math
        it_lo = slot_lo * (SPARSE_BLOCK // BLOCK_N)
        it_hi = slot_hi * (SPARSE_BLOCK // BLOCK_N)
        row, srow, kvalid = key_tile_rows(
            topk_row, bt_row, it_lo, it_hi, pos, offs_n, stride_cp, stride_cs,
            stride_sp, stride_ss, SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, SCALE_MODE)
        for it in range(it_lo, it_hi):
            row_n, srow_n, kvalid_n = key_tile_rows(
                topk_row, bt_row, it + 1, it_hi, pos, offs_n, stride_cp, stride_cs,
                stride_sp, stride_ss, SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, SCALE_MODE)
            k, v, ksc, vsc = load_key_rows(
                k_base, v_base, kvs_ptr, row, srow, kvalid, offs_d, dmask, g,
                k_elem_scale, v_elem_scale, stride_skv, stride_sh, SCALE_MODE)
            m_i, l_i, acc = attend_key_tile(q, k, v, kvalid[None, :], m_i, l_i, acc, qk_scale,
                                            ksc, vsc, SCALE_MODE, IEEE)
            row, srow, kvalid = row_n, srow_n, kvalid_n
    else:
        if SELECT_RANK:  # this token's top-k slots from its block scores
            n_valid = tl.minimum(pos // SPARSE_BLOCK + 1, SELECT_NB)
            rank, chosen = row_ranks(topk_ptr, t64 * stride_tt + g * stride_th, n_valid,
                                     SELECT_NB, TOPK, NB_PAD, RANK_COLS, False)
            rank = tl.where(chosen, rank, -1)
            blk1 = tl.arange(0, NB_PAD) + 1  # block id + 1: 0 marks an empty slot
        for i in range(slot_lo, slot_hi):
            if SELECT_RANK:
                b = tl.sum(tl.where(rank == i, blk1, 0), axis=0) - 1
            else:
                b = tl.load(topk_row + i)
            for n0 in tl.static_range(0, KEYS, BLOCK_N):
                kp = b * SPARSE_BLOCK + key_lo + n0 + offs_n
                kvalid = (kp <= pos) & (b >= 0)
                k, v, ksc, vsc = load_key_tile(
                    k_base, v_base, kvs_ptr, bt_row, kp, kvalid, offs_d, dmask, g,
                    k_elem_scale, v_elem_scale, stride_cp, stride_cs,
                    stride_sp, stride_skv, stride_ss, stride_sh, PAGE_SIZE, SCALE_MODE)
                m_i, l_i, acc = attend_key_tile(q, k, v, kvalid[None, :], m_i, l_i, acc,
                                                qk_scale, ksc, vsc, SCALE_MODE, IEEE)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if SCALE_MODE == 1:
        o = o * out_scale
    omask = mmask[:, None] & dmask[None, :]
    if NUM_SPLITS == 1:
        optr = out_ptr + t64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        # part_o: [T, Hq, NUM_SPLITS, D_PAD] contiguous; part_lse: [T, Hq, NUM_SPLITS]
        ph = t64 * stride_ot + heads  # stride_ot = Hq for the partial buffers
        tl.store(part_o_ptr + (ph[:, None] * NUM_SPLITS + split) * D_PAD + offs_d[None, :], o,
                 mask=omask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + ph * NUM_SPLITS + split, lse, mask=mmask)
        if FUSED_MERGE:
            tl.debug_barrier()  # every thread's partial stores precede the release
            cnt = cnt_ptr + t64 * tl.num_programs(1) + g
            arrived = tl.atomic_add(cnt, 1, sem="acq_rel")
            if arrived == NUM_SPLITS - 1:
                # log-sum-exp merge of the NUM_SPLITS partials (uncached reads:
                # other programs of this launch wrote them)
                offs_s = tl.arange(0, S_PAD)
                lse_all = tl.load(part_lse_ptr + ph[:, None] * NUM_SPLITS + offs_s[None, :],
                                  mask=mmask[:, None] & (offs_s[None, :] < NUM_SPLITS),
                                  other=float("-inf"), volatile=True)
                mx = tl.max(lse_all, axis=1)
                mx = tl.where(mx == float("-inf"), 0.0, mx)
                w_sum = tl.sum(tl.exp2(lse_all - mx[:, None]), axis=1)
                w_sum = tl.where(w_sum > 0.0, w_sum, 1.0)
                res = tl.zeros([G_PAD, D_PAD], tl.float32)
                for s_i in tl.static_range(NUM_SPLITS):
                    lse_s = tl.load(part_lse_ptr + ph * NUM_SPLITS + s_i, mask=mmask,
                                    other=float("-inf"), volatile=True)
                    w = tl.exp2(lse_s - mx) / w_sum  # 0 for empty splits
                    o_s = tl.load(part_o_ptr + (ph[:, None] * NUM_SPLITS + s_i) * D_PAD
                                  + offs_d[None, :], mask=omask & (w[:, None] > 0.0),
                                  other=0.0, volatile=True)
                    res += o_s * w[:, None]
                fptr = out_ptr + t64 * stride_fot + heads[:, None] * stride_foh + offs_d[None, :]
                tl.store(fptr, res.to(out_ptr.dtype.element_ty), mask=omask)
                tl.atomic_xchg(cnt, 0)
