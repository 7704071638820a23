# SPDX-License-Identifier: Apache-2.0
"""Block-sparse GQA attention for a tile of consecutive query tokens.

``sparse_attn_fwd`` reads the K/V of every selected block once per query
token.  In a prefill chunk consecutive tokens select nearly the same blocks
(their own block and the same high-scoring ones), so that kernel reads each
block up to ``TOPK``-times-tokens often and its tiles have only ``G`` rows.
Here one program takes ``TM`` consecutive tokens of one KV head: the tile has
``TM * G_PAD`` rows (token-major: row ``r`` is token ``t0 + r // G_PAD``,
query head ``kv_head * G + r % G_PAD``), and walks the union of the tokens'
selected blocks, reading each distinct (request, block) once.

The union is built in registers before the walk: the tile's candidates
``(token i, slot s)`` form one vector; a candidate counts when its block id is
>= 0 and no earlier candidate (token ``< i``, or token ``i`` and slot ``< s``)
names the same block of the same request; a prefix sum ranks the counted ones,
and the walk takes them in rank order (no data-dependent branches, no scalar
loads inside the loop besides the paged K/V rows).  A row takes part in a block's keys only if its token selected
that block (same request) and, per key, ``key position <= token position``.
Rows of padding heads, tokens past ``T`` and tokens with nothing visible
produce zeros.  Online softmax in base 2, as in ``sparse_attn_fwd``.

Scale modes (``SCALE_MODE`` constexpr): as ``sparse_attn_fwd`` (0 none, 1
scalar folded, 2 per token and KV head, 3 scalar unfolded).

Layouts (element strides):
  q        [T, Hq, D];  kv_cache [num_pages, 2, page_size, Hkv, D]
  topk     [T, Hkv, TOPK] int32 block ids (-1 = empty slot)
  out      [T, Hq, D] (q dtype), written normalised.  No context splits.
"""

from ._attend import attend_sparse_block, normalized_output, scales_and_operand
from ._triton import BATCH_PLACEMENT, tl, triton


@triton.jit(**BATCH_PLACEMENT)
def sparse_attn_tiled_kernel(
    q_ptr, kv_ptr, bt_ptr, req_ptr, pos_ptr, topk_ptr, out_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr,
    sm_scale, T,
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
    tile = tl.program_id(0)
    g = tl.program_id(1)
    t0 = tile * TM

    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    offs_s = tl.arange(0, TOPK_PAD)
    row_tok = offs_r // G_PAD                      # token index in the tile
    row_head = offs_r % G_PAD
    tok = t0 + row_tok
    tvalid = tok < T
    rvalid = tvalid & (row_head < G)
    dmask = offs_d < D
    tok64 = tok.to(tl.int64)
    req_r = tl.load(req_ptr + tok, mask=tvalid, other=-1)
    pos_r = tl.load(pos_ptr + tok, mask=tvalid, other=-1)
    # every row's token's selection: [R, TOPK_PAD] (-1 where absent)
    sel_r = tl.load(topk_ptr + tok64[:, None] * stride_tt + g * stride_th + offs_s[None, :],
                    mask=tvalid[:, None] & (offs_s[None, :] < TOPK), other=-1)

    heads = g * G + row_head
    q = tl.load(q_ptr + tok64[:, None] * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :], mask=rvalid[:, None] & dmask[None, :], other=0.0)
    q, qk_scale, k_elem_scale, v_elem_scale, out_scale = scales_and_operand(
        q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE, IEEE, FP16_MMA)

    k_base = kv_ptr + g * stride_ch
    v_base = kv_ptr + stride_ckv + g * stride_ch

    # the tile's candidates (token i, slot s) as one vector, c = i * TOPK_PAD + s
    C: tl.constexpr = TM * TOPK_PAD
    offs_c = tl.arange(0, C)
    c_tok = t0 + offs_c // TOPK_PAD
    c_ok = (c_tok < T) & (offs_c % TOPK_PAD < TOPK)
    c_blk = tl.load(topk_ptr + c_tok.to(tl.int64) * stride_tt + g * stride_th
                    + offs_c % TOPK_PAD, mask=c_ok, other=-1)
    c_req = tl.load(req_ptr + c_tok, mask=c_ok, other=-1)
    c_ok = c_ok & (c_blk >= 0)
    # first occurrence of each (request, block) in candidate order
    same_c = ((c_blk[:, None] == c_blk[None, :]) & (c_req[:, None] == c_req[None, :])
              & (offs_c[None, :] < offs_c[:, None]) & c_ok[None, :])
    first = c_ok & (tl.max(same_c.to(tl.int32), axis=1) == 0)
    rank = tl.cumsum(first.to(tl.int32), axis=0) - 1   # slot of each first occurrence
    n_unique = tl.sum(first.to(tl.int32), axis=0)

    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, D_PAD], tl.float32)

    for j in range(n_unique):
        pick = first & (rank == j)
        b = tl.sum(tl.where(pick, c_blk, 0), axis=0)
        creq = tl.sum(tl.where(pick, c_req, 0), axis=0)
        same = (sel_r == b) & (req_r == creq)[:, None]          # [R, TOPK_PAD]
        member = (tl.max(same.to(tl.int32), axis=1) > 0) & rvalid  # row's token chose b
        pmax = tl.max(tl.where(member, pos_r, -1), axis=0)
        bt_row = bt_ptr + creq.to(tl.int64) * stride_bt
        m_i, l_i, acc = attend_sparse_block(
            q, b, member, pos_r, pmax, bt_row, k_base, v_base, kvs_ptr, offs_n, offs_d, dmask,
            g, m_i, l_i, acc, qk_scale, k_elem_scale, v_elem_scale,
            stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
            SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, SCALE_MODE, IEEE)

    o = normalized_output(acc, l_i, out_scale, SCALE_MODE)
    optr = out_ptr + tok64[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=rvalid[:, None] & dmask[None, :])
