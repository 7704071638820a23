# SPDX-License-Identifier: Apache-2.0
"""``write_sparse_cache``: store one step's K, V and index keys of a sparse
(MSA) layer into its paged caches (Triton; no host syncs, fixed grid, so it
can be captured in a CUDA graph).

Layouts (element strides passed explicitly):
  k, v:      [T, Hkv, D]      model dtype
  idx_k:     [T, Didx]        model dtype
  kv_cache:  [num_pages, 2, page_size, Hkv, D]   model dtype or fp8 e4m3
  idx_cache: [num_pages, page_size, Didx]        model dtype, or fp8 e4m3 with
  idx_scales [num_pages, page_size] float32 (any strides): the optional fp8
             index-key cache stores clamp(idx_k / s) with s = amax / 448 of
             the token's index key (1.0 for zeros), and s in idx_scales.
  slots:     [T] int64, ``page * page_size + slot``; tokens with a negative
             slot (padding of a CUDA-graph batch) are skipped.
An fp8 kv_cache stores ``clamp(x / scale, -FP8_MAX, FP8_MAX)`` in e4m3 with,
by ``SCALE_MODE``: 1 the scalar ``k_scale``/``v_scale`` (one-element float32
tensors read on the device); 2 a scale per (token, KV head) row, amax / 448,
written to ``kv_scales`` [num_pages, 2, page_size, Hkv] float32 (any strides).
"""

import torch

from ._triton import tl, triton
from ._utils import check_triton, next_pow2


@triton.jit
def _store_rows(x_ptr, stride_xt, stride_xh, t64, dst, s_dst, stride_ch, stride_sh,
                scalar_ptr, offs_h, offs_d, HKV: tl.constexpr, D: tl.constexpr,
                SCALE_MODE: tl.constexpr, FP8_MAX: tl.constexpr):
    """One token's [HKV, D] rows of K or V -> ``dst`` (the cache row of KV head
    0); quantised per SCALE_MODE, mode 2 also writes the row scales at s_dst."""
    hmask = offs_h < HKV
    mask = hmask[:, None] & (offs_d[None, :] < D)
    x = tl.load(x_ptr + t64 * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :],
                mask=mask, other=0.0)
    if SCALE_MODE == 1:
        x = tl.clamp(x.to(tl.float32) / tl.load(scalar_ptr), -FP8_MAX, FP8_MAX)
    if SCALE_MODE == 2:
        amax = tl.max(tl.abs(x.to(tl.float32)), axis=1)
        s = tl.where(amax > 0.0, amax / FP8_MAX, 1.0)
        x = tl.clamp(x.to(tl.float32) / s[:, None], -FP8_MAX, FP8_MAX)
        tl.store(s_dst + offs_h * stride_sh, s, mask=hmask)
    tl.store(dst + offs_h[:, None] * stride_ch + offs_d[None, :],
             x.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def sparse_cache_write_kernel(
    k_ptr, v_ptr, ik_ptr, kv_ptr, ic_ptr, slot_ptr, k_scale_ptr, v_scale_ptr, kvs_ptr, is_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_it,
    stride_cp, stride_ckv, stride_cs, stride_ch,
    stride_sp, stride_skv, stride_ss, stride_sh,
    stride_ip, stride_is,
    stride_isp, stride_iss,
    HKV: tl.constexpr, HKV_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    DI: tl.constexpr, DI_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SCALE_MODE: tl.constexpr, FP8_MAX: tl.constexpr,
    IDX_FP8: tl.constexpr = False, IDX_FP8_MAX: tl.constexpr = 448.0,
):
    """One program per token: K and V rows of every KV head, and the index key."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE_SIZE
    in_page = slot - page * PAGE_SIZE
    t64 = t.to(tl.int64)
    offs_h = tl.arange(0, HKV_PAD)
    offs_d = tl.arange(0, D_PAD)
    row = kv_ptr + page * stride_cp + in_page * stride_cs
    srow = kvs_ptr + page * stride_sp + in_page * stride_ss
    _store_rows(k_ptr, stride_kt, stride_kh, t64, row, srow, stride_ch, stride_sh,
                k_scale_ptr, offs_h, offs_d, HKV, D, SCALE_MODE, FP8_MAX)
    _store_rows(v_ptr, stride_vt, stride_vh, t64, row + stride_ckv, srow + stride_skv,
                stride_ch, stride_sh, v_scale_ptr, offs_h, offs_d, HKV, D, SCALE_MODE, FP8_MAX)

    offs_i = tl.arange(0, DI_PAD)
    imask = offs_i < DI
    ik = tl.load(ik_ptr + t64 * stride_it + offs_i, mask=imask, other=0.0)
    if IDX_FP8:
        amax = tl.max(tl.abs(ik.to(tl.float32)), axis=0)
        s = tl.where(amax > 0.0, amax / IDX_FP8_MAX, 1.0)
        ik = tl.clamp(ik.to(tl.float32) / s, -IDX_FP8_MAX, IDX_FP8_MAX)
        tl.store(is_ptr + page * stride_isp + in_page * stride_iss, s)
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
    kv_scales: torch.Tensor | None = None,
    idx_scales: torch.Tensor | None = None,
) -> None:
    """Write K/V and index keys of ``slots.shape[0]`` tokens (module doc). An
    fp8 ``kv_cache`` is scaled with ``k_scale``/``v_scale`` (one-element
    float32), or per (token, KV head) when ``kv_scales`` [num_pages, 2,
    page_size, Hkv] float32 is given: scale = amax / 448 of the row (1.0 for
    zeros), stored there, exactly as ``sparse_ops.write_sparse_cache``. An fp8
    ``idx_cache`` needs ``idx_scales`` [num_pages, page_size] float32 (one
    scale per token, computed here)."""
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
    fp8 = kv_cache.dtype in (torch.float8_e4m3fn, getattr(torch, "float8_e4m3fnuz", None))
    if kv_scales is not None:
        mode = 2
        if not fp8 or kv_scales.dtype != torch.float32 or tuple(kv_scales.shape) != (
                kv_cache.shape[0], 2, page_size, hkv):
            raise ValueError(f"kv_scales must be float32 [{kv_cache.shape[0]}, 2, {page_size}, "
                             f"{hkv}] with an fp8 kv_cache, got {tuple(kv_scales.shape)} "
                             f"{kv_scales.dtype} (cache {kv_cache.dtype})")
    elif fp8:
        mode = 1
        if k_scale is None or v_scale is None:
            raise ValueError("an fp8 kv_cache needs k_scale and v_scale (one-element float32) "
                             "or per-token-head kv_scales")
    else:
        mode = 0
    idx_fp8 = idx_cache.dtype in (torch.float8_e4m3fn, getattr(torch, "float8_e4m3fnuz", None))
    if idx_fp8 != (idx_scales is not None) or (idx_fp8 and (
            idx_scales.dtype != torch.float32
            or tuple(idx_scales.shape) != tuple(idx_cache.shape[:2]))):
        raise ValueError(
            "an fp8 idx_cache needs idx_scales float32 [num_pages, page_size] "
            f"{list(idx_cache.shape[:2])} and only an fp8 one takes them; got idx_cache "
            f"{idx_cache.dtype}, idx_scales "
            f"{None if idx_scales is None else (idx_scales.dtype, tuple(idx_scales.shape))}")
    if (k.stride(2), v.stride(2), idx_k.stride(1), kv_cache.stride(4), idx_cache.stride(2)) != (1,) * 5:
        raise ValueError("k, v, idx_k and the caches must be contiguous in their last dim")
    if T == 0:
        return
    check_triton(k.device)
    ks = k_scale if mode == 1 else slots
    vs = v_scale if mode == 1 else slots
    kvs = kv_scales if mode == 2 else slots
    sstr = kv_scales.stride() if mode == 2 else (0, 0, 0, 0)
    istr = idx_scales.stride() if idx_fp8 else (0, 0)
    sparse_cache_write_kernel[(T,)](
        k, v, idx_k, kv_cache, idx_cache, slots, ks, vs, kvs,
        idx_scales if idx_fp8 else slots,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), idx_k.stride(0),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        sstr[0], sstr[1], sstr[2], sstr[3],
        idx_cache.stride(0), idx_cache.stride(1),
        istr[0], istr[1],
        HKV=hkv, HKV_PAD=next_pow2(hkv), D=d, D_PAD=next_pow2(d), DI=idx_k.shape[1],
        DI_PAD=next_pow2(idx_k.shape[1]), PAGE_SIZE=page_size,
        SCALE_MODE=mode, FP8_MAX=float(torch.finfo(kv_cache.dtype).max) if fp8 else 0.0,
        IDX_FP8=idx_fp8,
        IDX_FP8_MAX=float(torch.finfo(idx_cache.dtype).max) if idx_fp8 else 448.0,
        num_warps=4,
    )


__all__ = ["write_sparse_cache"]
