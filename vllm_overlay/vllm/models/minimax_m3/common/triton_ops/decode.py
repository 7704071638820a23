# SPDX-License-Identifier: Apache-2.0
"""``sparse_decode``: a batch of decode tokens' index top-k and block-sparse
attention in one persistent launch (``decode_persistent``).

The same results as ``index_block_topk`` followed by ``block_sparse_attention``
(the selected blocks as sets, the output to rounding), without the launches
in between: one kernel scores each token's blocks, selects its top-k and
attends them, the attention of early tokens overlapping the scoring of later
ones.  Capturable in a CUDA graph (grid and buffers depend only on the batch
size and ``max_context``; the sync counters live in a persistent buffer).
"""

import torch

from . import attention as _attention
from . import indexer as _indexer
from ._utils import arrival_counters, cdiv, check_triton, largest_pow2_divisor, next_pow2, num_sms
from .decode_persistent import msa_decode_persistent_kernel

# programs per SM of the persistent grid (each takes work items until none is left)
PROGRAMS_PER_SM = 4


def sparse_decode(
    idx_q: torch.Tensor,
    idx_k_cache: torch.Tensor,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    sparse_block: int,
    topk: int,
    local_blocks: int,
    init_blocks: int,
    scale: float,
    kv_scale_mode: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_scales: torch.Tensor | None = None,
    *,
    idx_k_scales: torch.Tensor | None = None,
    max_context: int | None = None,
    out: torch.Tensor | None = None,
    topk_out: torch.Tensor | None = None,
    _tune: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index top-k and block-sparse attention of decode tokens, one launch.

    Args: as ``index_block_topk`` (idx_q [T, H, DI], idx_k_cache, idx_k_scales,
      sparse_block, topk, local_blocks, init_blocks, max_context) and
      ``block_sparse_attention`` (q [T, H * G, D], kv_cache [pages, 2,
      page_size, H, D], kv_scale_mode / k_scale / v_scale / kv_scales with
      scalar scales folded, scale, out), with index heads == KV heads (H);
      block_table [R, max_pages], token_req / token_pos [T] int32.
      topk_out: optional [T, H, topk] int32 buffer for the selection.
      _tune: benchmark overrides: ``programs_per_sm`` (default
      PROGRAMS_PER_SM) or ``programs`` (the grid), ``blocks_per_prog`` (score item size, default as
      ``index_block_topk``), ``num_splits`` (attention items per token and KV
      head, default as ``block_sparse_attention``), ``rank_select``,
      ``prefetch_rows``, ``num_warps``, ``BLOCK_N`` (attention key tile).
    Returns: (out [T, H * G, D] in q.dtype, the selection [T, H, topk] int32,
      left-packed and -1 padded as ``index_block_topk``'s).
    """
    T, HQ, D = q.shape
    _, _, page_size, HKV, _ = kv_cache.shape
    if idx_q.dim() != 3 or idx_q.shape[0] != T or idx_q.shape[1] != HKV:
        raise ValueError(f"idx_q must be [{T}, {HKV}, index_dim] (one index head per KV head), "
                         f"got {tuple(idx_q.shape)}")
    if topk_out is None:
        topk_out = torch.empty((T, HKV, topk), dtype=torch.int32, device=q.device)
    elif topk_out.shape != (T, HKV, topk) or topk_out.dtype != torch.int32 or not topk_out.is_contiguous():
        raise ValueError(f"topk_out must be a contiguous int32 [{T}, {HKV}, {topk}] tensor")
    _indexer._validate(idx_q, idx_k_cache, block_table, token_req, token_pos, sparse_block,
                       topk, local_blocks, init_blocks, idx_k_scales)
    _attention._validate(q, kv_cache, block_table, token_req, token_pos, topk_out, sparse_block,
                         kv_scale_mode, k_scale, v_scale, kv_scales)
    device = q.device
    check_triton(device)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be {q.dtype} {list(q.shape)} contiguous in the last dim")
    if T == 0:
        return out, topk_out
    tune = _tune or {}
    H, DI = HKV, idx_q.shape[2]
    G = HQ // HKV
    if max_context is None:
        max_context = block_table.shape[1] * page_size
    max_blocks = max(cdiv(max_context, sparse_block), 1)
    sms = num_sms(device)

    # score items: as many blocks per item as index_block_topk's decode programs
    bpp = int(tune.get("blocks_per_prog", 2 if T * max_blocks >= 16384 else 1))
    n_score = cdiv(max_blocks, bpp)
    # attention splits: as block_sparse_attention's per-token kernel
    if "num_splits" in tune:
        splits = max(1, min(int(tune["num_splits"]), topk))
    else:
        splits = 1
        while splits < topk and T * HKV * splits * 2 <= 2 * sms:
            splits *= 2
    slots = cdiv(topk, splits)
    splits = cdiv(topk, slots)
    S_PAD = max(2, next_pow2(splits))

    D_PAD = max(16, next_pow2(D))
    DI_PAD = max(16, next_pow2(DI))
    IDX_BLOCK_N = largest_pow2_divisor(sparse_block, 128)
    BLOCK_N = largest_pow2_divisor(sparse_block, int(tune.get("BLOCK_N", 128 if D_PAD <= 128 else 32)))
    if IDX_BLOCK_N < 16:
        raise ValueError(f"sparse_block ({sparse_block}) must be divisible by 16")
    chunk = min(next_pow2(max_blocks), 2048)
    rank = bool(tune.get("rank_select", chunk <= 64)) and max_blocks <= chunk <= 256

    k_scaled = idx_k_scales is not None
    iks = idx_k_scales if k_scaled else idx_k_cache
    isp, iss = (iks.stride(0), iks.stride(1)) if k_scaled else (0, 0)
    dummy = q
    ks = k_scale if kv_scale_mode == 1 else dummy
    vs = v_scale if kv_scale_mode == 1 else dummy
    kvs = kv_scales if kv_scale_mode == 2 else dummy
    sstr = kv_scales.stride() if kv_scale_mode == 2 else (0, 0, 0, 0)
    scores = torch.empty((T, H, max_blocks), dtype=torch.float32, device=device)
    if splits > 1:
        part_o = torch.empty((T, HQ, splits, D_PAD), dtype=torch.float32, device=device)
        part_lse = torch.empty((T, HQ, splits), dtype=torch.float32, device=device)
    else:
        part_o = part_lse = out
    sync = arrival_counters(device, "persistent_decode", 2 + T + T * H)
    n_items = T * (n_score + H * splits)
    programs = int(tune.get("programs", sms * int(tune.get("programs_per_sm", PROGRAMS_PER_SM))))
    programs = max(1, min(n_items, programs))

    msa_decode_persistent_kernel[(programs,)](
        idx_q, idx_k_cache, iks, scores, topk_out,
        q, kv_cache, out, part_o, part_lse,
        ks, vs, kvs,
        block_table, token_req, token_pos, sync,
        T, max_blocks, float(scale),
        idx_q.stride(0), idx_q.stride(1), idx_k_cache.stride(0), idx_k_cache.stride(1), isp, iss,
        q.stride(0), q.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        sstr[0], sstr[1], sstr[2], sstr[3],
        block_table.stride(0), out.stride(0), out.stride(1),
        H=H, H_PAD=max(16, next_pow2(H)), DI=DI, DI_PAD=DI_PAD,
        G=G, G_PAD=max(16, next_pow2(G)), D=D, D_PAD=D_PAD,
        TOPK=topk, TOPK_PAD=next_pow2(topk), SLOTS=slots, NUM_SPLITS=splits, S_PAD=S_PAD,
        SPARSE_BLOCK=sparse_block, IDX_BLOCK_N=IDX_BLOCK_N, BLOCK_N=BLOCK_N,
        PAGE_SIZE=page_size, LOCAL=local_blocks, INIT=init_blocks,
        BPP=bpp, N_SCORE=n_score, CHUNK=chunk, SINGLE_CHUNK=max_blocks <= chunk,
        RANK=rank, RANK_COLS=min(chunk, max(16, 4096 // chunk)),
        K_SCALED=k_scaled, IEEE_IDX=idx_q.dtype == torch.float32,
        SCALE_MODE=kv_scale_mode, IEEE=q.dtype == torch.float32,
        FP16_MMA=kv_scale_mode != 0 and q.dtype == torch.bfloat16,
        PREFETCH_ROWS=bool(tune.get("prefetch_rows", False)),
        num_warps=int(tune.get("num_warps", 4)),
    )
    return out, topk_out


__all__ = ["sparse_decode", "PROGRAMS_PER_SM"]
