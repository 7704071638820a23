# SPDX-License-Identifier: Apache-2.0
"""Block-major block-sparse GQA attention for prefill: each selected block's
K/V is read once per tile of the tokens that selected it.

``sparse_attn_fwd`` reads a block's K/V once per token that selected it (an
8192-token chunk reads about 8.6 GB of K/V through L2), with ``G`` rows per
tile.  ``sparse_attn_tiled`` shares blocks between consecutive tokens but
multiplies every row of the tile with the union of their blocks.  Here the
(token, slot) pairs of the chunk are grouped by (request, KV head, block) on
the device (``attention.block_major_tiles``), and one program takes up to
``TM`` pairs of one group: ``TM * G_PAD`` rows (pair-major: row ``r`` is pair
``first + r // G_PAD``, query head ``kv_head * G + r % G_PAD``) against the
keys of that one block, causal per row (``key position <= token position``).
Every row it computes is needed: no masked-out work besides padding.

Its result is the softmax of the row over that one block, written as a split
partial at the pair's selection slot, so ``sparse_attn_merge`` with
``S = TOPK`` combines the blocks of each token (slots nobody wrote keep the
``-inf`` the wrapper filled in, and weigh nothing).

Scale modes (``SCALE_MODE`` constexpr): as ``sparse_attn_fwd`` (0 none, 1
scalar folded, 2 per token and KV head, 3 scalar unfolded).

Layouts (element strides):
  q         [T, Hq, D];  kv_cache [num_pages, 2, page_size, Hkv, D]
  pair_tok, pair_slot [P] int32: pairs sorted by group (token index in
            ``q``, selection slot)
  tile_first, tile_count, tile_group_block, tile_group_head [num_tiles] int32:
            first pair, pair count (0: nothing to do), block id and KV head
            of each tile
  part_o    [T, Hq, TOPK, D_PAD] (float32 or float16), normalised per slot
  part_lse  [T, Hq, TOPK] float32, log2 of the slot's softmax mass
"""

from ._attend import attend_sparse_block, normalized_output, scales_and_operand
from ._triton import tl, triton


@triton.jit
def sparse_attn_block_major_kernel(
    q_ptr, kv_ptr, bt_ptr, req_ptr, pos_ptr,
    pair_tok_ptr, pair_slot_ptr,
    tile_first_ptr, tile_count_ptr, tile_block_ptr, tile_head_ptr,
    part_o_ptr, part_lse_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr,
    sm_scale,
    stride_qt, stride_qh,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_bt,
    HQ: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, TM: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr, TOPK: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, FP16_MMA: tl.constexpr,
):
    R: tl.constexpr = TM * G_PAD
    tile = tl.program_id(0)
    n = tl.load(tile_count_ptr + tile)
    if n > 0:
        first = tl.load(tile_first_ptr + tile)
        b = tl.load(tile_block_ptr + tile)
        g = tl.load(tile_head_ptr + tile)

        offs_r = tl.arange(0, R)
        offs_d = tl.arange(0, D_PAD)
        offs_n = tl.arange(0, BLOCK_N)
        row_pair = offs_r // G_PAD
        row_head = offs_r % G_PAD
        pvalid = row_pair < n
        rvalid = pvalid & (row_head < G)
        dmask = offs_d < D
        tok = tl.load(pair_tok_ptr + first + row_pair, mask=pvalid, other=0)
        slot = tl.load(pair_slot_ptr + first + row_pair, mask=pvalid, other=0)
        pos_r = tl.load(pos_ptr + tok, mask=pvalid, other=-1)
        req = tl.load(req_ptr + tl.load(pair_tok_ptr + first))  # one request per group
        tok64 = tok.to(tl.int64)
        heads = g * G + row_head

        q = tl.load(q_ptr + tok64[:, None] * stride_qt + heads[:, None] * stride_qh
                    + offs_d[None, :], mask=rvalid[:, None] & dmask[None, :], other=0.0)
        q, qk_scale, k_elem_scale, v_elem_scale = scales_and_operand(
            q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE, IEEE, FP16_MMA)

        k_base = kv_ptr + g * stride_ch
        v_base = kv_ptr + stride_ckv + g * stride_ch
        bt_row = bt_ptr + req.to(tl.int64) * stride_bt
        pmax = tl.max(tl.where(rvalid, pos_r, -1), axis=0)

        m_i = tl.full([R], float("-inf"), tl.float32)
        l_i = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, D_PAD], tl.float32)
        m_i, l_i, acc = attend_sparse_block(
            q, b, rvalid, pos_r, pmax, bt_row, k_base, v_base, kvs_ptr, offs_n, offs_d, dmask,
            g, m_i, l_i, acc, qk_scale, k_elem_scale, v_elem_scale,
            stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
            SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, SCALE_MODE, IEEE)

        o = normalized_output(acc, l_i, v_scale_ptr, SCALE_MODE)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        # part_o [T, HQ, TOPK, D_PAD], part_lse [T, HQ, TOPK]
        ph = (tok64 * HQ + heads) * TOPK + slot
        tl.store(part_o_ptr + ph[:, None] * D_PAD + offs_d[None, :],
                 o.to(part_o_ptr.dtype.element_ty), mask=rvalid[:, None] & dmask[None, :])
        tl.store(part_lse_ptr + ph, lse, mask=rvalid)
