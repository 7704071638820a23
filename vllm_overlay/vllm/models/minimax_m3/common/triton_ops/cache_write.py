# SPDX-License-Identifier: Apache-2.0
"""``write_sparse_cache``: store one step's K, V and index keys of a sparse
(MSA) layer into its paged caches (Triton; no host syncs, fixed grid, so it
can be captured in a CUDA graph).

Layouts (element strides passed explicitly):
  k, v:      [T, Hkv, D]      model dtype
  idx_k:     [T, Didx]        model dtype
  kv_cache:  [num_pages, 2, page_size, Hkv, D]   model dtype or fp8 e4m3
  idx_cache: [num_pages, page_size, Didx]        model dtype
  slots:     [T] int64, ``page * page_size + slot``; tokens with a negative
             slot (padding of a CUDA-graph batch) are skipped.
With ``QUANT`` (an fp8 kv_cache with scalar scales) K and V are stored as
``clamp(x / scale, -FP8_MAX, FP8_MAX)`` in e4m3; ``k_scale``/``v_scale`` are
one-element float32 tensors read on the device.
"""

import torch

from ._triton import tl, triton
from ._utils import check_triton, next_pow2


@triton.jit
def sparse_cache_write_kernel(
    k_ptr, v_ptr, ik_ptr, kv_ptr, ic_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_it,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_ip, stride_is,
    HKV: tl.constexpr, D: tl.constexpr, HD_PAD: tl.constexpr,
    DI: tl.constexpr, DI_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
    QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """One program per token: K and V rows of every KV head, and the index key."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE_SIZE
    in_page = slot - page * PAGE_SIZE
    t64 = t.to(tl.int64)

    offs = tl.arange(0, HD_PAD)
    mask = offs < HKV * D
    head = offs // D
    dim = offs - head * D
    k = tl.load(k_ptr + t64 * stride_kt + head * stride_kh + dim, mask=mask, other=0.0)
    v = tl.load(v_ptr + t64 * stride_vt + head * stride_vh + dim, mask=mask, other=0.0)
    if QUANT:
        k = tl.clamp(k.to(tl.float32) / tl.load(k_scale_ptr), -FP8_MAX, FP8_MAX)
        v = tl.clamp(v.to(tl.float32) / tl.load(v_scale_ptr), -FP8_MAX, FP8_MAX)
    dst = kv_ptr + page * stride_cp + in_page * stride_cs + head * stride_ch + dim
    tl.store(dst, k.to(kv_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_ckv, v.to(kv_ptr.dtype.element_ty), mask=mask)

    offs_i = tl.arange(0, DI_PAD)
    imask = offs_i < DI
    ik = tl.load(ik_ptr + t64 * stride_it + offs_i, mask=imask, other=0.0)
    tl.store(ic_ptr + page * stride_ip + in_page * stride_is + offs_i,
             ik.to(ic_ptr.dtype.element_ty), mask=imask)


def write_sparse_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    idx_k: torch.Tensor,
    kv_cache: torch.Tensor,
    idx_cache: torch.Tensor,
    slots: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write K/V (quantised to fp8 with the scalar scales when ``kv_cache`` is
    fp8) and index keys of ``slots.shape[0]`` tokens; see the module doc."""
    T = slots.shape[0]
    if k.dim() != 3 or v.shape != k.shape or k.shape[0] < T:
        raise ValueError(f"k and v must be [>= {T}, Hkv, D] of one shape, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    _, two, page_size, hkv, d = kv_cache.shape
    if two != 2 or (hkv, d) != tuple(k.shape[1:]):
        raise ValueError(f"kv_cache must be [pages, 2, page_size, {k.shape[1]}, {k.shape[2]}], "
                         f"got {tuple(kv_cache.shape)}")
    if idx_cache.dim() != 3 or idx_k.dim() != 2 or idx_cache.shape[2] != idx_k.shape[1]:
        raise ValueError(f"idx_cache [pages, page_size, Didx] and idx_k [T, Didx] disagree: "
                         f"{tuple(idx_cache.shape)} vs {tuple(idx_k.shape)}")
    quant = kv_cache.dtype in (torch.float8_e4m3fn, getattr(torch, "float8_e4m3fnuz", None))
    if quant and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 kv_cache needs k_scale and v_scale (one-element float32)")
    if (k.stride(2), v.stride(2), idx_k.stride(1), kv_cache.stride(4), idx_cache.stride(2)) != (1,) * 5:
        raise ValueError("k, v, idx_k and the caches must be contiguous in their last dim")
    if T == 0:
        return
    check_triton(k.device)
    ks = k_scale if quant else slots
    vs = v_scale if quant else slots
    sparse_cache_write_kernel[(T,)](
        k, v, idx_k, kv_cache, idx_cache, slots, ks, vs,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), idx_k.stride(0),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        idx_cache.stride(0), idx_cache.stride(1),
        HKV=hkv, D=d, HD_PAD=next_pow2(hkv * d), DI=idx_k.shape[1],
        DI_PAD=next_pow2(idx_k.shape[1]), PAGE_SIZE=page_size,
        QUANT=quant, FP8_MAX=float(torch.finfo(kv_cache.dtype).max) if quant else 0.0,
        num_warps=4,
    )


__all__ = ["write_sparse_cache"]
