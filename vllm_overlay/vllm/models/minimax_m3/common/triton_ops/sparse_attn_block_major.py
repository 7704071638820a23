# SPDX-License-Identifier: Apache-2.0
"""Block-major block-sparse GQA attention for prefill: each selected block's
K/V is read once per tile of the tokens that selected it.

``sparse_attn_fwd`` reads a block's K/V once per token that selected it (an
8192-token chunk reads about 8.6 GB of K/V through L2), with ``G`` rows per
tile.  ``sparse_attn_tiled`` shares blocks between consecutive tokens but
multiplies every row of the tile with the union of their blocks.  Here the
(token, slot) pairs of the chunk are grouped by (request, KV head, block) on
the device (``attention.block_major_tiles``), and one program takes up to
``CHUNK`` pairs of one group.  It loads the block's K/V once (when the block
is one key tile, ``SPARSE_BLOCK == BLOCK_N``) and walks its pairs ``TM`` at a
time: ``TM * G_PAD`` rows (pair-major: row ``r`` is pair ``s0 + r // G_PAD``,
query head ``kv_head * G + r % G_PAD``) against the keys of that one block,
causal per row (``key position <= token position``).  Every row it computes
is needed: no masked-out work besides padding.

Its result is the softmax of the row over that one block, written as a split
partial at the pair's selection slot, so ``sparse_attn_merge`` with
``S = TOPK`` combines the blocks of each token (slots nobody wrote keep the
``-inf`` the wrapper filled in, and weigh nothing).

PREFETCH_PAIRS: each step's pair rows (slot, position, query rows) are loaded
during the step before, and its pair ids two steps before, so their latency
overlaps the step's math instead of opening it (the kernel runs with one
pipeline stage; Triton's pipeliner waits for all of a step's copies at once).
PREFETCH_QUERY=False keeps the pair ids, slots and positions prefetched but
loads each step's query rows at the top of the step (fewer live registers:
with an fp8 cache the prefetched query rows make ptxas spill).

Scale modes (``SCALE_MODE`` constexpr): as ``sparse_attn_fwd`` (0 none, 1
scalar folded, 2 per token and KV head, 3 scalar unfolded).  With
V_SCALE_IN_MERGE (SCALE_MODE 1) the partials leave v_scale out and the merge
applies it once per output row: one multiply per token instead of one per
(pair, step), and one live register fewer in the step loop (with it ptxas
spills the fp8 kernel's prefetched query rows).  SCALE_HELD_KV (SCALE_MODE 2,
the block held): the per-token-head scales multiply the held K/V once, rounded
to the queries' dtype, instead of every step's score and probability columns.

ONE_TILE_SOFTMAX (the block held): each step is the softmax of its rows over
that one key tile (``attend_one_tile``), not an online-softmax update of an
empty state.  MASK_PARTIAL_ONLY: a program whose pairs' tokens all see the
whole block (every position at or after its last key) runs its steps without
the causal mask; SPLIT_MASKED groups the pairs so (``block_major_group``),
and group ``grp`` is then block group ``grp // 2``.

Layouts (element strides):
  q         [T, Hq, D];  kv_cache [num_pages, 2, page_size, Hkv, D]
  pair_tok, pair_slot [P] int32: pairs sorted by group (token index in
            ``q``, selection slot), ``block_major_group``'s output
  group_start, counts, tile_end [NG] int32: per group (numbered
            ``(req * HKV + kv_head) * MAX_BLOCKS + block``, with SPLIT_MASKED
            twice that plus one for the masked half) its first pair,
            its pair count and the inclusive prefix sum of its program count
            ``cdiv(count, CHUNK)``; program ``i`` takes the group whose
            ``tile_end`` first exceeds ``i`` (found by bisection; none: the
            grid's surplus, nothing to do)
  part_o    [T, Hq, TOPK, D_PAD] (float32 or float16), normalised per slot
  part_lse  [T, Hq, TOPK] float32, log2 of the slot's softmax mass
"""

from ._attend import (attend_key_tile, attend_one_tile, attend_sparse_block, dot_operand,
                      load_key_tile, normalized_output, softmax_scales,
                      tile_mma, widen_to)
from ._triton import BATCH_PLACEMENT, tl, triton


@triton.jit
def program_group(tile_end_ptr, NG, prog):
    """The group of program ``prog``: the first whose ``tile_end`` exceeds it
    (bisection; ``NG`` for none, the grid's surplus).  Shared with the sm_90
    kernel."""
    lo = 0
    hi = NG
    while lo < hi:
        mid = (lo + hi) // 2
        up = tl.load(tile_end_ptr + mid) > prog
        hi = tl.where(up, mid, hi)
        lo = tl.where(up, lo, mid + 1)
    return lo


@triton.jit
def group_share(tile_end_ptr, group_start_ptr, counts_ptr, pair_tok_ptr, req_ptr, bt_ptr,
                grp, prog, MAX_BLOCKS, stride_bt, HKV: tl.constexpr, CHUNK: tl.constexpr,
                SPLIT_MASKED: tl.constexpr):
    """Program ``prog``'s share of its group ``grp``: (its first pair, its pair
    count (at most ``CHUNK``), the group's block and KV head, and the block
    table row of the group's request)."""
    r = prog - tl.load(tile_end_ptr + grp - 1, mask=grp > 0, other=0)
    first = tl.load(group_start_ptr + grp) + r * CHUNK
    n = tl.minimum(tl.load(counts_ptr + grp) - r * CHUNK, CHUNK)
    key = grp // 2 if SPLIT_MASKED else grp
    b = key % MAX_BLOCKS
    g = (key // MAX_BLOCKS) % HKV
    req = tl.load(req_ptr + tl.load(pair_tok_ptr + first))  # one request per group
    return first, n, b, g, bt_ptr + req.to(tl.int64) * stride_bt


@triton.jit
def query_rows(q_ptr, tok, rvalid, heads, offs_d, dmask, stride_qt, stride_qh):
    """The query rows [R, D_PAD] of tokens ``tok`` [R], heads ``heads`` [R]."""
    return tl.load(q_ptr + tok.to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh
                   + offs_d[None, :], mask=rvalid[:, None] & dmask[None, :], other=0.0)


@triton.jit
def pair_rows(q_ptr, pair_slot_ptr, pos_ptr, tok, first, s0, n, row_pair, head_valid, heads,
              offs_d, dmask, stride_qt, stride_qh, LOAD_Q: tl.constexpr):
    """The rows of one step, pairs ``s0 + row_pair`` of the program's ``n``
    (tokens ``tok`` [R], already loaded): the row validity, the pairs'
    selection slots and positions [R], and the query rows [R, D_PAD] (with
    LOAD_Q; else a scalar stand-in, the caller loads them with ``query_rows``)."""
    pvalid = s0 + row_pair < n
    rvalid = pvalid & head_valid
    slot = tl.load(pair_slot_ptr + first + s0 + row_pair, mask=pvalid, other=0)
    pos_r = tl.load(pos_ptr + tok, mask=pvalid, other=-1)
    if LOAD_Q:
        q = query_rows(q_ptr, tok, rvalid, heads, offs_d, dmask, stride_qt, stride_qh)
    else:
        q = 0.0
    return rvalid, slot, pos_r, q


@triton.jit(**BATCH_PLACEMENT)
def sparse_attn_block_major_kernel(
    q_ptr, kv_ptr, bt_ptr, req_ptr, pos_ptr,
    pair_tok_ptr, pair_slot_ptr,
    group_start_ptr, counts_ptr, tile_end_ptr, NG, MAX_BLOCKS,
    part_o_ptr, part_lse_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr,
    sm_scale,
    stride_qt, stride_qh,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_bt,
    HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, TM: tl.constexpr,
    CHUNK: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr, TOPK: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, FP16_MMA: tl.constexpr,
    HOLD_KV: tl.constexpr = True, PREFETCH_PAIRS: tl.constexpr = False,
    PREFETCH_QUERY: tl.constexpr = True, V_SCALE_IN_MERGE: tl.constexpr = False,
    SCALE_HELD_KV: tl.constexpr = False, ONE_TILE_SOFTMAX: tl.constexpr = True,
    MASK_PARTIAL_ONLY: tl.constexpr = True, SPLIT_MASKED: tl.constexpr = False,
):
    QUERY_AT_STEP: tl.constexpr = PREFETCH_PAIRS and not PREFETCH_QUERY
    # the whole block is one key tile: load it once into registers for all the
    # program's pairs (HOLD_KV; else every step loads it again, from L2, through
    # the loop's software pipeline into shared memory)
    ONE_KEY_TILE: tl.constexpr = HOLD_KV and SPARSE_BLOCK == BLOCK_N
    tile = tl.program_id(0)
    grp = program_group(tile_end_ptr, NG, tile)
    if grp < NG:
        first, n, b, g, bt_row = group_share(
            tile_end_ptr, group_start_ptr, counts_ptr, pair_tok_ptr, req_ptr, bt_ptr, grp, tile,
            MAX_BLOCKS, stride_bt, HKV, CHUNK, SPLIT_MASKED)
        k_base = kv_ptr + g * stride_ch
        v_base = kv_ptr + stride_ckv + g * stride_ch
        qk_scale, k_elem_scale, v_elem_scale, out_scale = softmax_scales(
            sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE)  # once, not every step

        offs_d = tl.arange(0, D_PAD)
        offs_n = tl.arange(0, BLOCK_N)
        dmask = offs_d < D
        # keys after the program's last query position are never loaded
        offs_c = tl.arange(0, CHUNK)
        cvalid = offs_c < n
        ctok = tl.load(pair_tok_ptr + first + offs_c, mask=cvalid, other=0)
        cpos = tl.load(pos_ptr + ctok, mask=cvalid, other=-1)
        pmax_all = tl.max(cpos, axis=0)
        # every pair's token sees the whole block (it lies before them all): no
        # key of any step needs the causal mask (MASK_PARTIAL_ONLY)
        see_all = (tl.min(tl.where(cvalid, cpos, pmax_all), axis=0)
                   >= b * SPARSE_BLOCK + SPARSE_BLOCK - 1)
        if ONE_KEY_TILE:
            kp = b * SPARSE_BLOCK + offs_n
            k, v, ksc, vsc = load_key_tile(
                k_base, v_base, kvs_ptr, bt_row, kp, kp <= pmax_all, offs_d, dmask, g,
                1.0, 1.0, stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
                PAGE_SIZE, 2 if SCALE_MODE == 2 else 0)
            # in the MMA's dtype once before the walk, not in every step (fp8 ->
            # fp16 or bf16 is exact)
            if SCALE_HELD_KV:
                # per-token-head scales applied to the held block once, rounded to
                # the queries' dtype (a dequantized cache in that dtype); the steps
                # then scale no score or probability columns
                tl.static_assert(SCALE_MODE == 2 and not FP16_MMA)
                k = (k.to(tl.float32) * ksc[:, None]).to(q_ptr.dtype.element_ty)
                v = (v.to(tl.float32) * vsc[:, None]).to(q_ptr.dtype.element_ty)
            elif FP16_MMA:
                k = k.to(tl.float16)
                v = v.to(tl.float16)
            elif not IEEE:  # fp8 or bf16 -> the queries' dtype, through fp32
                k = widen_to(k, q_ptr.dtype.element_ty)
                v = widen_to(v, q_ptr.dtype.element_ty)
        else:  # stand-ins: the steps load the block themselves
            k = 0.0
            v = 0.0
            ksc = 0.0
            vsc = 0.0
            kp = offs_n
        # the steps, without the causal mask where every pair sees the whole
        # block: the loop is compiled once per mask mode (so neither copy carries
        # the other's registers) and the program runs the copy that fits it
        MASK_BY_PROGRAM: tl.constexpr = ONE_KEY_TILE and ONE_TILE_SOFTMAX and MASK_PARTIAL_ONLY
        if MASK_BY_PROGRAM and see_all:
            walk_pairs(q_ptr, pos_ptr, pair_tok_ptr, pair_slot_ptr, part_o_ptr, part_lse_ptr,
                       kvs_ptr, bt_row, k_base, v_base, first, n, b, g,
                       k, v, ksc, vsc, kp, qk_scale, k_elem_scale, v_elem_scale, out_scale,
                       stride_qt, stride_qh, stride_cp, stride_cs,
                       stride_sp, stride_skv, stride_ss, stride_sh,
                       HQ, G, G_PAD, TM, D, D_PAD, TOPK, SPARSE_BLOCK, BLOCK_N, PAGE_SIZE,
                       SCALE_MODE, IEEE, FP16_MMA, ONE_KEY_TILE, PREFETCH_PAIRS,
                       QUERY_AT_STEP, V_SCALE_IN_MERGE, SCALE_HELD_KV, True, False)
        else:
            walk_pairs(q_ptr, pos_ptr, pair_tok_ptr, pair_slot_ptr, part_o_ptr, part_lse_ptr,
                       kvs_ptr, bt_row, k_base, v_base, first, n, b, g,
                       k, v, ksc, vsc, kp, qk_scale, k_elem_scale, v_elem_scale, out_scale,
                       stride_qt, stride_qh, stride_cp, stride_cs,
                       stride_sp, stride_skv, stride_ss, stride_sh,
                       HQ, G, G_PAD, TM, D, D_PAD, TOPK, SPARSE_BLOCK, BLOCK_N, PAGE_SIZE,
                       SCALE_MODE, IEEE, FP16_MMA, ONE_KEY_TILE, PREFETCH_PAIRS,
                       QUERY_AT_STEP, V_SCALE_IN_MERGE, SCALE_HELD_KV,
                       ONE_KEY_TILE and ONE_TILE_SOFTMAX, True)


@triton.jit
def walk_pairs(q_ptr, pos_ptr, pair_tok_ptr, pair_slot_ptr, part_o_ptr, part_lse_ptr, kvs_ptr,
               bt_row, k_base, v_base, first, n, b, g,
               k, v, ksc, vsc, kp, qk_scale, k_elem_scale, v_elem_scale, out_scale,
               stride_qt, stride_qh, stride_cp, stride_cs,
               stride_sp, stride_skv, stride_ss, stride_sh,
               HQ: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, TM: tl.constexpr,
               D: tl.constexpr, D_PAD: tl.constexpr, TOPK: tl.constexpr,
               SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
               SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, FP16_MMA: tl.constexpr,
               ONE_KEY_TILE: tl.constexpr, PREFETCH_PAIRS: tl.constexpr,
               QUERY_AT_STEP: tl.constexpr, V_SCALE_IN_MERGE: tl.constexpr,
               SCALE_HELD_KV: tl.constexpr, ONE_TILE_SOFTMAX: tl.constexpr,
               MASKED: tl.constexpr):
    """The steps of one program: its ``n`` pairs from ``first``, ``TM`` at a
    time, against block ``b`` of KV head ``g`` (with ONE_KEY_TILE held in
    ``k``, ``v``, its per-key scales ``ksc``, ``vsc`` and positions ``kp``;
    else loaded by each step), each step's partials stored.  MASKED=False
    (ONE_TILE_SOFTMAX only): no causal mask, every pair sees every key."""
    R: tl.constexpr = TM * G_PAD
    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    dmask = offs_d < D
    row_pair = offs_r // G_PAD
    row_head = offs_r % G_PAD
    heads = g * G + row_head
    # the first step's pairs (and with PREFETCH_PAIRS the second step's tokens)
    tok = tl.load(pair_tok_ptr + first + row_pair, mask=row_pair < n, other=0)
    rvalid, slot, pos_r, q = pair_rows(
        q_ptr, pair_slot_ptr, pos_ptr, tok, first, 0, n, row_pair, row_head < G, heads,
        offs_d, dmask, stride_qt, stride_qh, not QUERY_AT_STEP)
    if PREFETCH_PAIRS:
        tok_n = tl.load(pair_tok_ptr + first + TM + row_pair, mask=TM + row_pair < n,
                        other=0)
    for s0 in range(0, n, TM):
        if PREFETCH_PAIRS:
            # the next step's rows are loaded before this step's math (which
            # hides their latency), its tokens one step earlier still
            tok_nn = tl.load(pair_tok_ptr + first + s0 + 2 * TM + row_pair,
                             mask=s0 + 2 * TM + row_pair < n, other=0)
            rvalid_n, slot_n, pos_n, q_n = pair_rows(
                q_ptr, pair_slot_ptr, pos_ptr, tok_n, first, s0 + TM, n, row_pair,
                row_head < G, heads, offs_d, dmask, stride_qt, stride_qh,
                not QUERY_AT_STEP)
        if QUERY_AT_STEP:
            q_step = query_rows(q_ptr, tok, rvalid, heads, offs_d, dmask, stride_qt,
                                stride_qh)
        else:
            q_step = q
        tok64 = tok.to(tl.int64)
        qo = dot_operand(q_step, IEEE, FP16_MMA)
        m_i = tl.full([R], float("-inf"), tl.float32)
        l_i = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, D_PAD], tl.float32)
        if ONE_KEY_TILE:
            if SCALE_MODE == 3:  # unfolded scalar scales: per element, as loaded
                k_t = k.to(tl.float32) * k_elem_scale
                v_t = v.to(tl.float32) * v_elem_scale
            else:
                k_t = k
                v_t = v
            vis = rvalid[:, None] & (kp[None, :] <= pos_r[:, None])
            tile_mode: tl.constexpr = 0 if SCALE_HELD_KV else SCALE_MODE
            if ONE_TILE_SOFTMAX:
                m_i, l_i, acc = attend_one_tile(qo, k_t, v_t, vis, qk_scale, ksc, vsc,
                                                tile_mode, IEEE, MASKED)
            else:
                m_i, l_i, acc = attend_key_tile(qo, k_t, v_t, vis, m_i, l_i, acc,
                                                qk_scale, ksc, vsc, tile_mode, IEEE)
        else:
            pmax = tl.max(tl.where(rvalid, pos_r, -1), axis=0)
            m_i, l_i, acc = attend_sparse_block(
                qo, b, rvalid, pos_r, pmax, bt_row, k_base, v_base, kvs_ptr, offs_n,
                offs_d, dmask, g, m_i, l_i, acc, qk_scale, k_elem_scale, v_elem_scale,
                stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
                SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, SCALE_MODE, IEEE)

        o = normalized_output(acc, l_i, out_scale,
                              0 if V_SCALE_IN_MERGE else SCALE_MODE)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)),
                       float("-inf"))
        # part_o [T, HQ, TOPK, D_PAD], part_lse [T, HQ, TOPK]
        ph = (tok64 * HQ + heads) * TOPK + slot
        tl.store(part_o_ptr + ph[:, None] * D_PAD + offs_d[None, :],
                 o.to(part_o_ptr.dtype.element_ty), mask=rvalid[:, None] & dmask[None, :])
        tl.store(part_lse_ptr + ph, lse, mask=rvalid)
        if PREFETCH_PAIRS:
            tok, rvalid, slot, pos_r, q = tok_n, rvalid_n, slot_n, pos_n, q_n
            tok_n = tok_nn
        else:
            tok = tl.load(pair_tok_ptr + first + s0 + TM + row_pair,
                          mask=s0 + TM + row_pair < n, other=0)
            rvalid, slot, pos_r, q = pair_rows(
                q_ptr, pair_slot_ptr, pos_ptr, tok, first, s0 + TM, n, row_pair,
                row_head < G, heads, offs_d, dmask, stride_qt, stride_qh, True)
