# SPDX-License-Identifier: Apache-2.0
"""Block-sparse GQA attention for the first tokens of a request.

A token at position ``p`` sees ``p // SPARSE_BLOCK + 1`` blocks; while that
is at most top-k the index selects every one of them, so the first
``TOPK * SPARSE_BLOCK`` tokens of a request attend densely (causally).
Block-major attention still writes one partial per (token, block) for them
and merges them.  Here one program takes ``TM`` consecutive tokens of one KV
head -- a tile of ``TM * G_PAD`` rows, token-major (row ``r`` is token
``t0 + r // G_PAD``, query head ``kv_head * G + r % G_PAD``) -- and walks
the keys of every block they see as dense causal attention does: a runtime
loop over ``BLOCK_N``-key tiles, which Triton software-pipelines, first the
tiles every row sees in full (no causal mask), then the diagonal ones.  A
row takes part in a tile's keys only if its token selected the tile's block
(so the result is exact for any selection), and per key only if ``key
position <= token position``.  The output is written normalised: no
partials, no merge.  Programs run the tiles from the last one down, so the
longest walks start first.

Only rows whose token sees fewer than ``max_blocks`` blocks (``position //
SPARSE_BLOCK < max_blocks``, at most 64: a token's selection is kept as a
64-bit mask) are computed and stored; the others are left to another layout
(a tile with none of them ends at once).  Rows of padding heads and tokens
past ``T`` are not stored.  Rows of a tile may belong to different requests
(the tile loops over the requests present in it).  Online softmax in base 2,
as in ``sparse_attn_fwd``.

Scale modes (``SCALE_MODE`` constexpr): as ``sparse_attn_fwd`` (0 none, 1
scalar folded, 2 per token and KV head, 3 scalar unfolded).

Layouts (element strides):
  q        [T, Hq, D];  kv_cache [num_pages, 2, page_size, Hkv, D]
  topk     [T, Hkv, TOPK] int32 block ids (-1 = empty slot)
  out      [T, Hq, D] (q dtype), written normalised for the prefix rows only.
"""

from ._attend import attend_key_tile, load_key_tile, normalized_output, scales_and_operand
from ._triton import tl, triton

# a token's selection is a bit mask of the blocks it sees
PREFIX_MAX_BLOCKS = 64


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def sparse_attn_prefix_kernel(
    q_ptr, kv_ptr, bt_ptr, req_ptr, pos_ptr, topk_ptr, out_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr,
    sm_scale, T, max_blocks,
    stride_qt, stride_qh,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_bt,
    stride_tt, stride_th,
    stride_ot, stride_oh,
    G: tl.constexpr, G_PAD: tl.constexpr, TM: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr,
    TOPK: tl.constexpr, TOPK_PAD: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, FP16_MMA: tl.constexpr,
):
    R: tl.constexpr = TM * G_PAD
    # the last tile first: the longest walks start first, the short ones fill the tail
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    g = tl.program_id(1)

    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    offs_s = tl.arange(0, TOPK_PAD)
    row_head = offs_r % G_PAD
    tok = tile * TM + offs_r // G_PAD
    tvalid = tok < T
    dmask = offs_d < D
    tok64 = tok.to(tl.int64)
    req_r = tl.load(req_ptr + tok, mask=tvalid, other=-1)
    pos_r = tl.load(pos_ptr + tok, mask=tvalid, other=-1)
    rvalid = tvalid & (row_head < G) & (pos_r >= 0) & (pos_r // SPARSE_BLOCK < max_blocks)
    if tl.max(rvalid.to(tl.int32), axis=0) == 0:
        return

    # every row's token's selection as a mask of block ids (all < max_blocks <= 64)
    sel = tl.load(topk_ptr + tok64[:, None] * stride_tt + g * stride_th + offs_s[None, :],
                  mask=rvalid[:, None] & (offs_s[None, :] < TOPK), other=-1)
    one = tl.full([R, TOPK_PAD], 1, tl.int64)
    bits = tl.where((sel >= 0) & (sel < 64), one << sel.to(tl.int64), 0)
    sel_bits = tl.reduce(bits, 1, _bit_or)

    heads = g * G + row_head
    q = tl.load(q_ptr + tok64[:, None] * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :], mask=rvalid[:, None] & dmask[None, :], other=0.0)
    q, qk_scale, k_elem_scale, v_elem_scale, out_scale = scales_and_operand(
        q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE, IEEE, FP16_MMA)
    k_base = kv_ptr + g * stride_ch
    v_base = kv_ptr + stride_ckv + g * stride_ch

    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, D_PAD], tl.float32)

    r_lo = tl.min(tl.where(rvalid, req_r, 2147483647), axis=0)
    r_hi = tl.max(tl.where(rvalid, req_r, -1), axis=0)
    for r in range(r_lo, r_hi + 1):
        act = rvalid & (req_r == r)
        pos_a = tl.where(act, pos_r, -1)
        pmax = tl.max(pos_a, axis=0)
        pmin = tl.min(tl.where(act, pos_r, 2147483647), axis=0)
        bt_row = bt_ptr + r * stride_bt
        # key tiles that every active row sees in full: no causal mask
        n_full = tl.where(pmax >= 0, (pmin + 1) // BLOCK_N * BLOCK_N, 0)
        for n0 in range(0, n_full, BLOCK_N):
            kp = n0 + offs_n
            k, v, ksc, vsc = load_key_tile(
                k_base, v_base, kvs_ptr, bt_row, kp, kp >= 0, offs_d, dmask, g,
                k_elem_scale, v_elem_scale, stride_cp, stride_cs,
                stride_sp, stride_skv, stride_ss, stride_sh, PAGE_SIZE, SCALE_MODE)
            member = act & (((sel_bits >> (n0 // SPARSE_BLOCK)) & 1) != 0)
            m_i, l_i, acc = attend_key_tile(q, k, v, member[:, None], m_i, l_i, acc,
                                            qk_scale, ksc, vsc, SCALE_MODE, IEEE)
        # the diagonal tiles: keys up to the last row's position, causal per row
        for n0 in range(n_full, pmax + 1, BLOCK_N):
            kp = n0 + offs_n
            k, v, ksc, vsc = load_key_tile(
                k_base, v_base, kvs_ptr, bt_row, kp, kp <= pmax, offs_d, dmask, g,
                k_elem_scale, v_elem_scale, stride_cp, stride_cs,
                stride_sp, stride_skv, stride_ss, stride_sh, PAGE_SIZE, SCALE_MODE)
            member = act & (((sel_bits >> (n0 // SPARSE_BLOCK)) & 1) != 0)
            vis = member[:, None] & (kp[None, :] <= pos_a[:, None])
            m_i, l_i, acc = attend_key_tile(q, k, v, vis, m_i, l_i, acc,
                                            qk_scale, ksc, vsc, SCALE_MODE, IEEE)

    o = normalized_output(acc, l_i, out_scale, SCALE_MODE)
    optr = out_ptr + tok64[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=rvalid[:, None] & dmask[None, :])
