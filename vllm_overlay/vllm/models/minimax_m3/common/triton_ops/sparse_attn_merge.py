# SPDX-License-Identifier: Apache-2.0
"""Log-sum-exp merge of split block-sparse attention partials.

One program per (query token, query head).  Layouts:
  part_o   [T, Hq, S, D_PAD] float32 (or float16), each split already normalised
  part_lse [T, Hq, S] float32, log2 of each split's softmax mass (-inf empty)
  out      [T, Hq, D] (output dtype); rows whose splits are all empty get 0.
  v_scale  [1] float32, read only with V_SCALE: the scalar fp8 v_scale, applied
           once to each merged fp32 row (``sparse_attn_block_major`` leaves it
           out of its partials).

``sparse_attn_merge_slices_kernel``: the same merge, overlapped with the
block-major kernel that writes the partials (launched beside it, on another
stream).  That kernel's programs are ordered by slices of the tokens
(``block_major_tiles(token_slices=...)``) and count themselves done per slice
(``done`` [slices] int32, a release add after their stores); a fixed number of
programs walk the slices in order, wait (acquire reads) until every program
of a slice has counted itself, then merge a share of the slice's rows.  The
grid is bounded (a few programs per SM, one warp each), so the spinning
programs never take every SM's room from the attention's programs: those
always progress, and the wait always ends.
"""

from ._triton import tl, tl_cuda, triton


@triton.jit
def sparse_attn_merge_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, v_scale_ptr,
    stride_ot, stride_oh,
    HQ: tl.constexpr, S: tl.constexpr, S_PAD: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr, PDL: tl.constexpr = False,
    V_SCALE: tl.constexpr = False, SKIP_EMPTY: tl.constexpr = False,
):
    """Partials and weights are loaded side by side (an empty split's partial
    is loaded too and weighs nothing: ``where``, never a product with what an
    unwritten slot holds).  SKIP_EMPTY: the partials are loaded after the
    weights, only those of non-empty splits (block-major's tokens that see
    fewer blocks than top-k leave slots empty)."""
    if PDL:  # launched early: wait for the attention partials
        tl_cuda.gdc_wait()
    merge_row(part_o_ptr, part_lse_ptr, out_ptr, v_scale_ptr, tl.program_id(0).to(tl.int64),
              tl.program_id(1), stride_ot, stride_oh, HQ, S, S_PAD, D, D_PAD, V_SCALE,
              SKIP_EMPTY)


@triton.jit
def merge_row(part_o_ptr, part_lse_ptr, out_ptr, v_scale_ptr, t, h, stride_ot, stride_oh,
              HQ: tl.constexpr, S: tl.constexpr, S_PAD: tl.constexpr, D: tl.constexpr,
              D_PAD: tl.constexpr, V_SCALE: tl.constexpr, SKIP_EMPTY: tl.constexpr):
    """Merge the ``S`` partials of token ``t`` (int64), head ``h`` into its
    output row."""
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


@triton.jit
def sparse_attn_merge_slices_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, v_scale_ptr, done_ptr, tile_end_ptr,
    stride_ot, stride_oh, T, slices, slice_tokens, groups_per_slice,
    HQ: tl.constexpr, S: tl.constexpr, S_PAD: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr,
    V_SCALE: tl.constexpr = False, SKIP_EMPTY: tl.constexpr = False,
):
    """Slice ``j``'s programs are ``tile_end[(j + 1) * groups_per_slice - 1] -
    tile_end[j * groups_per_slice - 1]`` (its groups' programs); its rows are
    ``(t, h)`` for ``t`` in ``[j * slice_tokens, (j + 1) * slice_tokens)``,
    taken by the programs in turn."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for j in range(0, slices):
        lo = tl.load(tile_end_ptr + j * groups_per_slice - 1, mask=j > 0, other=0)
        need = tl.load(tile_end_ptr + (j + 1) * groups_per_slice - 1) - lo
        done = tl.atomic_add(done_ptr + j, 0, sem="acquire", scope="gpu")
        while done < need:
            done = tl.atomic_add(done_ptr + j, 0, sem="acquire", scope="gpu")
        r_end = tl.minimum((j + 1) * slice_tokens, T) * HQ
        for r in range(j * slice_tokens * HQ + pid, r_end, nprog):
            t = r // HQ + tl.zeros([], tl.int64)  # int64 row offsets
            merge_row(part_o_ptr, part_lse_ptr, out_ptr, v_scale_ptr, t, r % HQ, stride_ot,
                      stride_oh, HQ, S, S_PAD, D, D_PAD, V_SCALE, SKIP_EMPTY)
