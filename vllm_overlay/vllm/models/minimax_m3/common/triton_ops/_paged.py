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
def paged_rows(bt_row_ptr, key_pos, key_mask, stride_page, stride_slot, stride_scale_page,
               stride_scale_slot, PAGE_SIZE: tl.constexpr, SCALED: tl.constexpr):
    """``paged_row_offsets`` into a cache and, when SCALED, into its scale
    cache (strides ``stride_scale_page`` / ``stride_scale_slot``): (row [N],
    scale row [N]; without SCALED the scale row is ``row`` again, unused)."""
    row = paged_row_offsets(bt_row_ptr, key_pos, key_mask, PAGE_SIZE, stride_page, stride_slot)
    if SCALED:
        srow = paged_row_offsets(bt_row_ptr, key_pos, key_mask, PAGE_SIZE, stride_scale_page,
                                 stride_scale_slot)
    else:
        srow = row
    return row, srow


@triton.jit
def fp16_dot_operand(x):
    """``x`` as an fp16 tl.dot operand for products with fp8 (e4m3) keys,
    clamped to fp16's finite range: e4m3 -> fp16 is one exact conversion per
    two elements on NVIDIA GPUs, e4m3 -> bf16 goes through fp16 and costs
    three. bf16 inputs keep their 8 significant bits (fp16 has 11); values
    below 6e-5 in magnitude lose precision, negligible in a dot product."""
    return tl.clamp(x.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
