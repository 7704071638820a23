# SPDX-License-Identifier: Apache-2.0
"""Block-major prefill's merge with each token's own block attended in it.

Every token selects its own block (position // SPARSE_BLOCK; the released
config forces it), and it is the only block the token sees in part: the causal
diagonal.  With ``own_block_merge`` the grouping leaves those pairs out
(``block_major_rank_kernel`` with SKIP_OWN), so the block-major kernel writes no
partial for them and runs no masked step; this kernel attends them instead,
on chip, and merges the result with the token's partials from the other
blocks, in the launch that merges anyway.  Tokens that did not select their own
block (configs that do not force it) merge their partials only.

One program takes ``TM`` consecutive tokens of one KV head: ``TM * G_PAD``
rows, token-major (row ``r`` is token ``t0 + r // G_PAD``, query head
``kv_head * G + r % G_PAD``).  Consecutive tokens of one request share their
own block but for the tile that straddles a block's (or a request's) end: the
program walks the tile's distinct (request, own block) keys, each row taking
part in its own key's block only (``attend_sparse_block``: per key, key
position <= token position).  The diagonal's (max, mass, unnormalized output)
then join the partials' log-sum-exp weights: out = (acc * 2^(m - M) + sum_s w_s
o_s) / (l * 2^(m - M) + sum_s w_s), with M the largest of the row's
log-sum-exps, and the partials are read only where their weight is not zero.

Layouts (element strides):
  q        [T, Hq, D];  kv_cache [num_pages, 2, page_size, Hkv, D]
  topk     [T, Hkv, TOPK] int32 block ids (-1 = empty slot)
  part_o   [T, Hq, TOPK, D_PAD] float16 (float32 for IEEE runs), each slot
           normalized; part_lse [T, Hq, TOPK] float32, log2 of the slot's
           mass (-inf: empty, and the own block's slot, never written)
  out      [T, Hq, D] (q dtype).
Scale modes as ``sparse_attn_block_major``; with SCALE_MODE 1 the scalar
v_scale multiplies each output row once, and the partials hold it already
unless V_SCALE_IN_MERGE (the default there), so without it only the diagonal's
output is scaled here.
"""

from ._attend import attend_sparse_block, scales_and_operand
from ._triton import tl, triton


@triton.jit
def own_block_merge_kernel(
    q_ptr, kv_ptr, bt_ptr, req_ptr, pos_ptr, topk_ptr, part_o_ptr, part_lse_ptr, out_ptr,
    k_scale_ptr, v_scale_ptr, kvs_ptr,
    sm_scale, T, MAX_BLOCKS,
    stride_qt, stride_qh,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_bt,
    stride_tt, stride_th,
    stride_ot, stride_oh,
    HQ: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, TM: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, FP16_MMA: tl.constexpr,
    V_SCALE_IN_MERGE: tl.constexpr, MERGE_UNROLL: tl.constexpr = 4,
):
    R: tl.constexpr = TM * G_PAD
    t0 = tl.program_id(0) * TM
    g = tl.program_id(1)
    BIG: tl.constexpr = 2147483647

    # the tile's tokens: their (request, own block) key, BIG where the token is
    # past T or did not select its own block
    offs_t = tl.arange(0, TM)
    offs_s = tl.arange(0, TOPK_PAD)
    ttok = t0 + offs_t
    t_ok = ttok < T
    t_pos = tl.load(pos_ptr + ttok, mask=t_ok, other=0)
    t_req = tl.load(req_ptr + ttok, mask=t_ok, other=0)
    t_own = t_pos // SPARSE_BLOCK
    t_sel = tl.load(topk_ptr + ttok.to(tl.int64)[:, None] * stride_tt + g * stride_th
                    + offs_s[None, :], mask=t_ok[:, None] & (offs_s[None, :] < TOPK), other=-1)
    t_has_own = tl.max((t_sel == t_own[:, None]).to(tl.int32), axis=1) > 0
    t_key = tl.where(t_ok & t_has_own, t_req * MAX_BLOCKS + t_own, BIG)
    earlier_same = (t_key[:, None] == t_key[None, :]) & (offs_t[None, :] < offs_t[:, None])
    first = (t_key < BIG) & (tl.max(earlier_same.to(tl.int32), axis=1) == 0)
    n_keys = tl.sum(first.to(tl.int32), axis=0)

    # the same per row
    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    tok = t0 + offs_r // G_PAD
    head_r = offs_r % G_PAD
    tvalid = tok < T
    rvalid = tvalid & (head_r < G)
    dmask = offs_d < D
    tok64 = tok.to(tl.int64)
    heads = g * G + head_r
    pos_r = tl.load(pos_ptr + tok, mask=tvalid, other=-1)
    req_r = tl.load(req_ptr + tok, mask=tvalid, other=0)
    sel_r = tl.load(topk_ptr + tok64[:, None] * stride_tt + g * stride_th + offs_s[None, :],
                    mask=tvalid[:, None] & (offs_s[None, :] < TOPK), other=-1)
    own_r = pos_r // SPARSE_BLOCK
    has_own_r = tl.max((sel_r == own_r[:, None]).to(tl.int32), axis=1) > 0
    key_r = tl.where(rvalid & has_own_r, req_r * MAX_BLOCKS + own_r, BIG)

    q = tl.load(q_ptr + tok64[:, None] * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :], mask=rvalid[:, None] & dmask[None, :], other=0.0)
    q, qk_scale, k_elem_scale, v_elem_scale, out_scale = scales_and_operand(
        q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE, IEEE, FP16_MMA)
    k_base = kv_ptr + g * stride_ch
    v_base = kv_ptr + stride_ckv + g * stride_ch

    m_i = tl.full([R], float("-inf"), tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, D_PAD], tl.float32)
    cur = tl.zeros([], tl.int32) - 1
    for _ in range(n_keys):  # the distinct keys in increasing order
        cur = tl.min(tl.where(t_key > cur, t_key, BIG), axis=0)
        creq = cur // MAX_BLOCKS
        b = cur - creq * MAX_BLOCKS
        member = key_r == cur
        pmax = tl.max(tl.where(member, pos_r, -1), axis=0)
        m_i, l_i, acc = attend_sparse_block(
            q, b, member, pos_r, pmax, bt_ptr + creq.to(tl.int64) * stride_bt, k_base, v_base,
            kvs_ptr, offs_n, offs_d, dmask, g, m_i, l_i, acc, qk_scale, k_elem_scale,
            v_elem_scale, stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
            SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, SCALE_MODE, IEEE)
    if SCALE_MODE == 1 and not V_SCALE_IN_MERGE:  # the partials hold v_scale already
        acc = acc * out_scale

    # log-sum-exp weights of the partials and the diagonal, relative to the
    # row's largest (the diagonal's: m + log2(l), l >= 1 where it saw a key)
    ph = (tok64 * HQ + heads) * TOPK
    lse = tl.load(part_lse_ptr + ph[:, None] + offs_s[None, :],
                  mask=rvalid[:, None] & (offs_s[None, :] < TOPK), other=float("-inf"))
    lse_own = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    top = tl.maximum(tl.max(lse, axis=1), lse_own)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse - top[:, None])  # 0 for empty slots
    own_w = tl.exp2(m_i - top)  # 0 where the row saw no key of its own block
    mass = tl.sum(w, axis=1) + l_i * own_w
    res = acc * own_w[:, None]
    # a runtime loop over the slots, MERGE_UNROLL slots' loads issued together
    for s0 in range(0, TOPK, MERGE_UNROLL):
        for u in tl.static_range(MERGE_UNROLL):
            w_s = tl.sum(tl.where(offs_s[None, :] == s0 + u, w, 0.0), axis=1)
            o_s = tl.load(part_o_ptr + (ph + s0 + u)[:, None] * D_PAD + offs_d[None, :],
                          mask=(rvalid & (w_s > 0.0))[:, None], other=0.0)
            res += o_s.to(tl.float32) * w_s[:, None]
    res = res * (1.0 / tl.where(mass > 0.0, mass, 1.0))[:, None]
    if SCALE_MODE == 1 and V_SCALE_IN_MERGE:
        res = res * out_scale
    tl.store(out_ptr + tok64[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             res.to(out_ptr.dtype.element_ty), mask=rvalid[:, None] & dmask[None, :])
