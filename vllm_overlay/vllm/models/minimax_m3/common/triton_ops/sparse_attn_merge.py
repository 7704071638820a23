# SPDX-License-Identifier: Apache-2.0
"""Log-sum-exp merge of split block-sparse attention partials.

One program per (query token, query head).  Layouts:
  part_o   [T, Hq, S, D_PAD] float32 (or float16), each split already normalised
  part_lse [T, Hq, S] float32, log2 of each split's softmax mass (-inf empty)
  out      [T, Hq, D] (output dtype); rows whose splits are all empty get 0.
  v_scale  [1] float32, read only with V_SCALE: the scalar fp8 v_scale, applied
           once to each merged fp32 row (``sparse_attn_block_major`` leaves it
           out of its partials).
"""

from ._triton import tl, tl_cuda, triton


@triton.jit
def sparse_attn_merge_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, v_scale_ptr,
    stride_ot, stride_oh,
    HQ: tl.constexpr, S: tl.constexpr, S_PAD: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr, PDL: tl.constexpr = False,
    V_SCALE: tl.constexpr = False, SKIP_EMPTY: tl.constexpr = False,
    ROW_ORDER: tl.constexpr = False,
):
    """Partials and weights are loaded side by side (an empty split's partial
    is loaded too and weighs nothing: ``where``, never a product with what an
    unwritten slot holds).  SKIP_EMPTY: the partials are loaded after the
    weights, only those of non-empty splits (block-major's tokens that see
    fewer blocks than top-k leave slots empty).  ROW_ORDER: a 1-D grid of T * HQ
    programs, program ``i`` merging row ``i`` = (token, head), so consecutive
    programs read consecutive partials (else the grid is (T, HQ))."""
    if PDL:  # launched early: wait for the attention partials
        tl_cuda.gdc_wait()
    if ROW_ORDER:
        t = (tl.program_id(0) // HQ).to(tl.int64)
        h = tl.program_id(0) % HQ
    else:
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    smask = offs_s < S
    row = t * HQ + h
    lse = tl.load(part_lse_ptr + row * S + offs_s, mask=smask, other=float("-inf"))
    omask = smask & (lse > float("-inf")) if SKIP_EMPTY else smask
    o = tl.load(part_o_ptr + (row * S + offs_s[:, None]) * D_PAD + offs_d[None, :],
                mask=omask[:, None], other=0.0)
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)  # 0 for empty splits
    w_sum = tl.sum(w, axis=0)
    w = w / tl.where(w_sum > 0.0, w_sum, 1.0)
    res = tl.sum(tl.where(w[:, None] > 0.0, o.to(tl.float32) * w[:, None], 0.0), axis=0)
    if V_SCALE:
        res = res * tl.load(v_scale_ptr)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d,
             res.to(out_ptr.dtype.element_ty), mask=offs_d < D)
