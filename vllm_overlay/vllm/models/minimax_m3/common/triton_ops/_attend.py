# SPDX-License-Identifier: Apache-2.0
"""The pieces of block-sparse attention shared by ``sparse_attn_fwd`` (one
query token per program) and ``sparse_attn_tiled`` (a tile of tokens per
program): the dot operand dtype and softmax scales, the load of one paged
key tile, and the online-softmax update with it (base 2)."""

from ._paged import paged_rows
from ._triton import tl, triton


@triton.jit
def softmax_scales(sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE: tl.constexpr):
    """The score scale ``sm_scale * log2(e)`` (x k_scale with SCALE_MODE 1), the
    per-element K/V scales of SCALE_MODE 3 and the output scale (v_scale) of
    SCALE_MODE 1 (unused stand-ins otherwise); all fp32 scalars.  Kernels
    call it at their start, so the scale loads are not waited for after the
    key walk (a decode program would wait a whole memory latency there)."""
    qk_scale = sm_scale * 1.4426950408889634
    k_elem_scale = qk_scale  # stand-ins (fp32 scalars) unless SCALE_MODE 3
    v_elem_scale = qk_scale
    out_scale = qk_scale  # stand-in unless SCALE_MODE 1
    if SCALE_MODE == 1:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
        out_scale = tl.load(v_scale_ptr)
    if SCALE_MODE == 3:
        k_elem_scale = tl.load(k_scale_ptr)
        v_elem_scale = tl.load(v_scale_ptr)
    return qk_scale, k_elem_scale, v_elem_scale, out_scale


@triton.jit
def dot_operand(q, IEEE: tl.constexpr, FP16_MMA: tl.constexpr):
    """q in the tl.dot operand dtype: fp32 for IEEE runs; fp16 with an fp8
    cache and bf16 queries (fp8 -> fp16 is one exact conversion)."""
    if IEEE:
        q = q.to(tl.float32)
    if FP16_MMA:
        q = q.to(tl.float16)
    return q


@triton.jit
def widen_to(x, dtype: tl.constexpr):
    """``x`` (fp8 or 16-bit) in ``dtype`` (bf16 / fp16), through float32.  On
    sm_90 fp8 -> bf16 directly is a 16-bit unpack and one F2F per element, on
    the conversion unit (16 per clock per SM); through float32 it is the
    unpack, HADD2.F32 widenings and F2FP packs, all on the FMA pipes.  Exact
    either way (fp8 and bf16 values are exact in float32)."""
    if x.dtype.is_fp8():
        x = x.to(tl.float32)
    return x.to(dtype)


@triton.jit
def scales_and_operand(q, sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE: tl.constexpr,
                       IEEE: tl.constexpr, FP16_MMA: tl.constexpr):
    """``dot_operand(q)`` and ``softmax_scales``: (q, qk_scale, k_elem_scale,
    v_elem_scale, out_scale)."""
    qk_scale, k_elem_scale, v_elem_scale, out_scale = softmax_scales(
        sm_scale, k_scale_ptr, v_scale_ptr, SCALE_MODE)
    return dot_operand(q, IEEE, FP16_MMA), qk_scale, k_elem_scale, v_elem_scale, out_scale


@triton.jit
def group_query_rows(q_ptr, t64, g, offs_d, dmask, stride_qt, stride_qh,
                     G: tl.constexpr, G_PAD: tl.constexpr):
    """The query rows [G_PAD, D_PAD] of token ``t64``'s GQA group ``g`` (the
    rows past G and the columns past ``dmask`` zero): (q, heads [G_PAD],
    row mask [G_PAD])."""
    offs_m = tl.arange(0, G_PAD)
    mmask = offs_m < G
    heads = g * G + offs_m
    q = tl.load(q_ptr + t64 * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mmask[:, None] & dmask[None, :], other=0.0)
    return q, heads, mmask


@triton.jit
def load_key_tile(k_base, v_base, kvs_ptr, bt_row, kp, kload, offs_d, dmask, kv_head,
                  k_elem_scale, v_elem_scale,
                  stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
                  PAGE_SIZE: tl.constexpr, SCALE_MODE: tl.constexpr):
    """K and V rows [N, D_PAD] of key positions ``kp`` [N] (loaded where
    ``kload``) from the request's pages, scaled per element with SCALE_MODE 3,
    and with SCALE_MODE 2 their per-key scales [N] (else ``k_elem_scale``,
    unused)."""
    row, srow = paged_rows(bt_row, kp, kload, stride_cp, stride_cs, stride_sp, stride_ss,
                           PAGE_SIZE, SCALE_MODE == 2)
    return load_key_rows(k_base, v_base, kvs_ptr, row, srow, kload, offs_d, dmask, kv_head,
                         k_elem_scale, v_elem_scale, stride_skv, stride_sh, SCALE_MODE)


@triton.jit
def load_key_rows(k_base, v_base, kvs_ptr, row, srow, kload, offs_d, dmask, kv_head,
                  k_elem_scale, v_elem_scale, stride_skv, stride_sh,
                  SCALE_MODE: tl.constexpr):
    """``load_key_tile`` from cache row offsets already resolved through the
    block table: ``row`` [N] into the KV cache, ``srow`` [N] into the scale
    cache (SCALE_MODE 2 only)."""
    ld_mask = kload[:, None] & dmask[None, :]
    k = tl.load(k_base + row[:, None] + offs_d[None, :], mask=ld_mask, other=0.0)
    v = tl.load(v_base + row[:, None] + offs_d[None, :], mask=ld_mask, other=0.0)
    if SCALE_MODE == 3:
        k = k.to(tl.float32) * k_elem_scale
        v = v.to(tl.float32) * v_elem_scale
    if SCALE_MODE == 2:
        ksc = tl.load(kvs_ptr + srow + kv_head * stride_sh, mask=kload, other=0.0)
        vsc = tl.load(kvs_ptr + stride_skv + srow + kv_head * stride_sh, mask=kload, other=0.0)
    else:
        ksc = k_elem_scale
        vsc = k_elem_scale
    return k, v, ksc, vsc


@triton.jit
def key_tile_rows(topk_row, bt_row, it, it_hi, pos, offs_n,
                  stride_cp, stride_cs, stride_sp, stride_ss,
                  SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                  PAGE_SIZE: tl.constexpr, SCALE_MODE: tl.constexpr):
    """Cache row offsets of key tile ``it`` of a program's walk (tile ``it``
    is keys ``(it % NT) * BLOCK_N ...`` of the block in selection slot
    ``it // NT``, NT = SPARSE_BLOCK // BLOCK_N): (row [N], srow [N], visible
    [N]); nothing is visible when ``it >= it_hi`` or the slot holds -1.
    Issued one tile ahead, the selection and block-table loads of the next
    tile overlap this tile's math (``PREFETCH_ROWS``)."""
    NT: tl.constexpr = SPARSE_BLOCK // BLOCK_N
    live = it < it_hi
    b = tl.load(topk_row + it // NT, mask=live, other=-1)
    kp = b * SPARSE_BLOCK + (it % NT) * BLOCK_N + offs_n
    kvalid = (kp <= pos) & (b >= 0)
    row, srow = paged_rows(bt_row, kp, kvalid, stride_cp, stride_cs, stride_sp, stride_ss,
                           PAGE_SIZE, SCALE_MODE == 2)
    return row, srow, kvalid


@triton.jit
def tile_mma(a, b, IEEE: tl.constexpr):
    """``a @ b`` (operands of one dtype); for IEEE runs (float32 operands) with
    IEEE float32 products."""
    if IEEE:
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def attend_key_tile(q, k, v, visible, m_i, l_i, acc, qk_scale, k_col_scale, v_col_scale,
                    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr):
    """Fold one tile of keys into the running softmax of every query row.

    q [M, D_PAD] (the tl.dot operand dtype); k, v [N, D_PAD] as loaded (fp8
    or float); visible [M, N] or [1, N] bool; m_i, l_i [M] float32 (running
    max and mass, log2 units); acc [M, D_PAD] float32; qk_scale: softmax
    scale x log2(e) (with SCALE_MODE 1 also x k_scale).  SCALE_MODE 2 only:
    k_col_scale / v_col_scale [N] per-key scales of K and V (else unused).
    Returns the updated (m_i, l_i, acc).
    """
    cdt = q.dtype
    s = tile_mma(q, tl.trans(k.to(cdt)), IEEE) * qk_scale
    if SCALE_MODE == 2:
        s = s * k_col_scale[None, :]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if SCALE_MODE == 2:
        p = p * v_col_scale[None, :]
    pv = tile_mma(p.to(cdt), v.to(cdt), IEEE)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def attend_one_tile(q, k, v, visible, qk_scale, k_col_scale, v_col_scale,
                    SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):
    """The softmax of every query row over one tile of keys, with no running
    state to fold into: ``attend_key_tile`` from an empty (m, l, acc), without
    its rescaling of the empty state.  The score scale rides in the
    exponent's multiply-add (``exp2(s * qk_scale - m)``; qk_scale > 0, so the
    max of the raw scores scales to the max of the scaled ones), and with
    MASKED=False no key is masked: the caller knows every row sees every key
    (rows it does not store may then hold any finite values).

    Arguments as ``attend_key_tile``; returns (m [M], l [M], acc [M, D_PAD]):
    the row max in log2 units (a row that sees no key: 0, with mass 0), the
    mass and the unnormalized output, float32."""
    cdt = q.dtype
    s = tile_mma(q, tl.trans(k.to(cdt)), IEEE)
    return softmax_one_tile(s, v, visible, qk_scale, k_col_scale, v_col_scale, cdt,
                            SCALE_MODE, IEEE, MASKED)


@triton.jit
def softmax_one_tile(s, v, visible, qk_scale, k_col_scale, v_col_scale, cdt: tl.constexpr,
                     SCALE_MODE: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):
    """``attend_one_tile`` from the raw scores ``s`` [M, N] float32 (q k^T, not
    scaled) on: softmax and the probabilities times ``v`` in ``cdt``."""
    if SCALE_MODE == 2:
        s = s * (qk_scale * k_col_scale)[None, :]  # per-key scales: scaled first
        if MASKED:
            s = tl.where(visible, s, float("-inf"))
        m = tl.max(s, axis=1)
        if MASKED:
            m = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp2(s - m[:, None])
    else:
        if MASKED:
            s = tl.where(visible, s, float("-inf"))
        m = tl.max(s, axis=1) * qk_scale
        if MASKED:
            m = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp2(s * qk_scale - m[:, None])
    l_i = tl.sum(p, axis=1)
    if SCALE_MODE == 2:
        p = p * v_col_scale[None, :]
    return m, l_i, tile_mma(p.to(cdt), v.to(cdt), IEEE)


@triton.jit
def attend_sparse_block(q, b, rows_ok, pos_r, pmax, bt_row, k_base, v_base, kvs_ptr,
                        offs_n, offs_d, dmask, kv_head, m_i, l_i, acc,
                        qk_scale, k_elem_scale, v_elem_scale,
                        stride_cp, stride_cs, stride_sp, stride_skv, stride_ss, stride_sh,
                        SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                        PAGE_SIZE: tl.constexpr, SCALE_MODE: tl.constexpr,
                        IEEE: tl.constexpr):
    """Fold all keys of sparse block ``b`` (key tiles of BLOCK_N) into the
    running softmax of the rows where ``rows_ok`` [M], each row seeing keys at
    or before its position ``pos_r`` [M]; keys after ``pmax`` (the largest
    such position) are not loaded.  Returns the updated (m_i, l_i, acc)."""
    for n0 in tl.static_range(0, SPARSE_BLOCK, BLOCK_N):
        kp = b * SPARSE_BLOCK + n0 + offs_n
        kload = kp <= pmax
        k, v, ksc, vsc = load_key_tile(
            k_base, v_base, kvs_ptr, bt_row, kp, kload, offs_d, dmask, kv_head,
            k_elem_scale, v_elem_scale, stride_cp, stride_cs,
            stride_sp, stride_skv, stride_ss, stride_sh, PAGE_SIZE, SCALE_MODE)
        vis = rows_ok[:, None] & (kp[None, :] <= pos_r[:, None])
        m_i, l_i, acc = attend_key_tile(q, k, v, vis, m_i, l_i, acc, qk_scale, ksc, vsc,
                                        SCALE_MODE, IEEE)
    return m_i, l_i, acc


@triton.jit
def normalized_output(acc, l_i, out_scale, SCALE_MODE: tl.constexpr):
    """acc / l per row (rows with no mass stay 0), times ``out_scale`` (v_scale,
    from ``softmax_scales``) with SCALE_MODE 1: the scalar v_scale applied once
    to the fp32 result."""
    # one reciprocal per row, then a multiply per element (a division per
    # element is a range-checked sequence of several instructions)
    o = acc * (1.0 / tl.where(l_i > 0.0, l_i, 1.0))[:, None]
    if SCALE_MODE == 1:
        o = o * out_scale
    return o
