# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""PyTorch versions of MiniMax-M3's fused CUDA ops, for builds without them.

vLLM's CPU build has neither ``_C.fused_minimax_m3_qknorm_rope_kv_insert`` nor
flashinfer's Gemma RMSNorm. These functions compute the same results with
torch ops (in fp32, rounded to the model dtype where the fused kernels round),
so the upstream MiniMax-M3 model runs, slowly, wherever torch runs.
"""

import torch


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma RMSNorm: ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` in fp32, in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def _norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
               sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Per-head Gemma RMSNorm then NeoX RoPE on the first ``rotary_dim`` channels.

    x: [N, H, D]; cos/sin: [N, 1, rotary_dim // 2] fp32. Returns x's dtype; the
    normalised value is rounded to that dtype before the rotation, as the fused
    kernel does."""
    y = gemma_rms_norm(x, weight, eps).float()
    half = rotary_dim // 2
    x1, x2 = y[..., :half], y[..., half:rotary_dim]
    rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rot, y[..., rotary_dim:]), dim=-1).to(x.dtype)


def _store(cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` converted to the cache's storage: fp8 caches (uint8 storage or an
    fp8 dtype) take e4m3 with unit scale, saturated to its finite range."""
    if cache.dtype == torch.uint8 or cache.dtype == torch.float8_e4m3fn:
        fp8 = rows.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return fp8.view(torch.uint8) if cache.dtype == torch.uint8 else fp8
    return rows.to(cache.dtype)


def qknorm_rope_kv_insert(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    rotary_dim: int,
    eps: float,
    index_q_norm_weight: torch.Tensor | None = None,
    index_k_norm_weight: torch.Tensor | None = None,
    num_index_heads: int = 0,
    slot_mapping: torch.Tensor | None = None,
    index_slot_mapping: torch.Tensor | None = None,
    kv_cache: torch.Tensor | None = None,
    index_cache: torch.Tensor | None = None,
    block_size: int = 0,
    q_out: torch.Tensor | None = None,
    index_q_out: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
    skip_index_branch: bool = False,
) -> None:
    """The semantics of ``_C.fused_minimax_m3_qknorm_rope_kv_insert`` in torch ops.

    ``qkv`` [N, (Hq + 2 Hkv) * D (+ (Hidx + 1) * Didx)] is normalised and rotated in
    place (q, k, and the index branch; v is untouched); q / index_q go to
    ``q_out`` / ``index_q_out`` when given. With ``kv_cache``, k and v are stored at
    ``slot_mapping`` into the paged cache (logical [pages, Hkv, page, 2 D]: K then
    V per row) and the index key at ``index_slot_mapping`` into ``index_cache``
    [pages, page, Didx]; negative slots are skipped. fp8 caches store with unit scale.
    """
    n = qkv.shape[0]
    head = q_norm_weight.shape[-1]
    q_size, kv_size = num_heads * head, num_kv_heads * head
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    q = qkv[:, :q_size].view(n, num_heads, head)
    k = qkv[:, q_size:q_size + kv_size].view(n, num_kv_heads, head)
    v = qkv[:, q_size + kv_size:q_size + 2 * kv_size].view(n, num_kv_heads, head)
    q_new = _norm_rope(q, q_norm_weight, eps, cos, sin, rotary_dim)
    k.copy_(_norm_rope(k, k_norm_weight, eps, cos, sin, rotary_dim))
    if q_out is not None:
        q_out.view(n, num_heads, head).copy_(q_new.to(q_out.dtype))
    else:
        q.copy_(q_new)
    idx_k = None
    if num_index_heads and not skip_index_branch:
        base = q_size + 2 * kv_size
        idx_dim = index_q_norm_weight.shape[-1]
        iq = qkv[:, base:base + num_index_heads * idx_dim].view(n, num_index_heads, idx_dim)
        ik = qkv[:, base + num_index_heads * idx_dim:base + (num_index_heads + 1) * idx_dim]
        iq_new = _norm_rope(iq, index_q_norm_weight, eps, cos, sin, rotary_dim)
        ik.copy_(_norm_rope(ik.view(n, 1, idx_dim), index_k_norm_weight, eps, cos, sin,
                            rotary_dim).view(n, idx_dim))
        if index_q_out is not None:
            fp8_out = index_q_out.dtype in (torch.uint8, torch.float8_e4m3fn)
            index_q_out.view(n, num_index_heads, idx_dim).copy_(
                _store(index_q_out, iq_new) if fp8_out else iq_new.to(index_q_out.dtype))
        else:
            iq.copy_(iq_new)
        idx_k = ik
    if kv_cache is None:
        return
    slots = slot_mapping[:n].long()
    keep = slots >= 0
    page, off = slots // block_size, slots % block_size
    rows = torch.cat((k, v), dim=-1)                        # [N, Hkv, 2 D]
    kv_cache[page[keep], :, off[keep], :] = _store(kv_cache, rows[keep])
    if idx_k is not None and index_cache is not None:
        islots = (slot_mapping if index_slot_mapping is None else index_slot_mapping)[:n].long()
        ikeep = islots >= 0
        ipage, ioff = islots // block_size, islots % block_size
        index_cache[ipage[ikeep], ioff[ikeep]] = _store(index_cache, idx_k[ikeep])
