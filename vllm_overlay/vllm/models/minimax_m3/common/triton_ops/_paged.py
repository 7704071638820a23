# SPDX-License-Identifier: Apache-2.0
"""Paged-cache addressing and dot-operand helpers shared by the MSA kernels."""

from ._triton import tl, triton


@triton.jit
def paged_row_offsets(bt_row_ptr, key_pos, key_mask, PAGE_SIZE: tl.constexpr,
                      stride_page, stride_slot):
    """Element offsets of the cache rows holding absolute key positions.

    bt_row_ptr: pointer to the request's block-table row (int32 page ids).
    key_pos:    [N] int32 absolute key positions (token index in the request).
    key_mask:   [N] bool; masked keys get offset 0 (callers mask the load).
    Returns [N] int64 offsets ``page * stride_page + slot * stride_slot``
    (in elements of the cache tensor).
    """
    page_slot = key_pos // PAGE_SIZE
    page = tl.load(bt_row_ptr + page_slot, mask=key_mask, other=0).to(tl.int64)
    in_page = (key_pos - page_slot * PAGE_SIZE).to(tl.int64)
    return page * stride_page + in_page * stride_slot


@triton.jit
def fp16_dot_operand(x):
    """``x`` as an fp16 tl.dot operand for products with fp8 (e4m3) keys,
    clamped to fp16's finite range: e4m3 -> fp16 is one exact conversion per
    two elements on NVIDIA GPUs, e4m3 -> bf16 goes through fp16 and costs
    three. bf16 inputs keep their 8 significant bits (fp16 has 11); values
    below 6e-5 in magnitude lose precision, negligible in a dot product."""
    return tl.clamp(x.to(tl.float32), -65504.0, 65504.0).to(tl.float16)


@triton.jit
def e4m3_to_fp16(x, INLINE_PTX: tl.constexpr):
    """fp8 e4m3 tile ``x`` (as loaded, any shape) -> fp16.

    INLINE_PTX=False is a plain cast, which Triton moves past the layout
    change to the tl.dot operand so that 8-bit values cross shared memory:
    Hopper's ldmatrix has no 8-bit transposing form, and the operand is
    gathered with byte loads and permutes.  INLINE_PTX=True converts with
    ``cvt.rn.f16x2.e4m3x2`` in an inline-asm op marked impure, which Triton
    keeps where it is, in the load's layout: the tile crosses shared memory as
    fp16 (twice the bytes) and reaches the MMA through ldmatrix.  NVIDIA only
    (sm_89+) and not under the interpreter; the launchers choose."""
    if INLINE_PTX:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [x.to(tl.int8, bitcast=True)], dtype=tl.float16,
            is_pure=False, pack=4)
    else:
        return x.to(tl.float16)
