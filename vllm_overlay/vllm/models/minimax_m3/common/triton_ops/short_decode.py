# SPDX-License-Identifier: Apache-2.0
"""``score_attend_decode``: the whole MSA decode step (index scores, top-k,
block-sparse attention) in two launches, for batches that leave most SMs idle
over short block tables; ``score_attend_fits`` says when the backend takes it.
Kernels and layouts: ``score_attend_decode.py``."""

import torch

from ..kv_scale import KVScaleMode
from ._utils import (SELECT_MAX_BLOCKS, cdiv, check_triton, largest_pow2_divisor, launch_tune,
                     next_pow2, use_pdl)
from .attention import attention_output, kv_scale_args, validate_attention_inputs
from .indexer import _validate as validate_index_inputs
from .score_attend_decode import score_attend_block_kernel, score_attend_merge_kernel


# key ranges per sparse block, one attention program each (as the chain's
# ``key_split`` at batch 1-2)
SCORE_ATTEND_KEY_SPLIT = 4
# the merge loads every written partial row with the scores (one round of
# dependent loads) for batches of at most this many tokens, in this many
# column chunks per query head.  H200, 11 paired
# rounds (8k context, one KV head): 11.68 against 12.32 us at batch 1
# (faster in 11 of 11 rounds), 15.23 against 14.72 at batch 2 (0 of 11)
SCORE_ATTEND_ONE_ROUND_TOKENS = 1
SCORE_ATTEND_MERGE_CHUNKS = 4
# the block launch runs 4 warps per program at batch 1, 2 above: at batch 2 x
# 8k (1024 programs) 4 warps made fp8 KV 8% slower than bf16 (15.84 against
# 14.69 us), 2 warps 5% faster (13.98; bf16 14.78, per-token-head 14.59); at
# batch 1, 2 warps cost bf16 2.7% (12.29 against 12.00).  Paired rounds


def score_attend_fits(num_tokens: int, num_kv_heads: int, max_blocks: int, sms: int) -> bool:
    """True when a decode batch of ``num_tokens`` tokens over block tables of
    ``max_blocks`` sparse blocks takes ``score_attend_decode``: rows of at most
    ``SELECT_MAX_BLOCKS`` blocks (the rank select) and one program per
    (block, token, KV head) that all fit the ``sms`` SMs at once (batch 1-2 at
    8k context and one KV head on an H200).  Static sizes only, so a captured
    CUDA graph keeps its path."""
    return (0 < num_tokens and max_blocks <= SELECT_MAX_BLOCKS
            and num_tokens * num_kv_heads * max_blocks <= sms)


def score_attend_decode(
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
    kv_scale_mode: KVScaleMode = KVScaleMode.NONE,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_scales: torch.Tensor | None = None,
    *,
    idx_k_scales: torch.Tensor | None = None,
    fold_scalar_scales: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode tokens (each its request's next token; a graph batch's padding
    repeats request 0): ``block_sparse_attention`` over the blocks
    ``index_block_topk`` selects (same arguments as the two; rows of at most
    ``SELECT_MAX_BLOCKS`` blocks), by scoring and attending every visible
    block and merging the top-k.  Launch overrides (benchmarks only,
    ``launch_overrides("score_attend", ...)``):
      ``num_warps``        of the block launch (default 4 at one token, else 2);
      ``merge_warps``      of the merge launch;
      ``key_split``        key ranges per block (``SCORE_ATTEND_KEY_SPLIT``);
      ``merge_one_round``, ``merge_chunks``: the merge's rounds of loads and
                           column chunks (``SCORE_ATTEND_ONE_ROUND_TOKENS``);
      ``f32_partials``     float32 partials for half-precision queries too;
      ``pdl``              programmatic dependent launch of both kernels
                           (default as the decode chain, ``VLLM_MINIMAX_M3_PDL``).
    Returns [T, Hq, D] in q.dtype."""
    validate_index_inputs(idx_q, idx_k_cache, block_table, token_req, token_pos, sparse_block,
                          topk, local_blocks, init_blocks, idx_k_scales)
    validate_attention_inputs(q, kv_cache, block_table, token_req, token_pos, sparse_block,
                              kv_scale_mode, k_scale, v_scale, kv_scales)
    device = q.device
    check_triton(device)
    T, HQ, D = q.shape
    _, _, page_size, HKV, _ = kv_cache.shape
    DI = idx_q.shape[2]
    if idx_q.shape[:2] != (T, HKV):
        raise ValueError(f"idx_q must be [{T}, {HKV}, index_dim] (one index head per KV head, "
                         f"one row per token of q), got {tuple(idx_q.shape)}")
    if idx_k_cache.shape[1] != page_size:
        raise ValueError(f"the index cache page size ({idx_k_cache.shape[1]}) must equal the KV "
                         f"cache's ({page_size}): both are paged by one block table")
    NB = max(1, cdiv(block_table.shape[1] * page_size, sparse_block))
    if NB > SELECT_MAX_BLOCKS:
        raise ValueError(f"score_attend_decode ranks rows of at most {SELECT_MAX_BLOCKS} sparse "
                         f"blocks; the block table holds {NB} (use index_block_topk and "
                         f"block_sparse_attention)")
    out = attention_output(q, out)
    if T == 0:
        return out
    tune = launch_tune("score_attend")
    G = HQ // HKV
    G_PAD = max(16, next_pow2(G))
    D_PAD = max(16, next_pow2(D))
    # each block's keys in KEY_SPLIT ranges of whole 16-key tiles, one program each
    key_split = int(tune.get("key_split", SCORE_ATTEND_KEY_SPLIT))
    while key_split > 1 and sparse_block % (16 * key_split):
        key_split //= 2
    BLOCK_N = largest_pow2_divisor(sparse_block // key_split, 128 if D_PAD <= 128 else 32)
    IDX_BLOCK_N = largest_pow2_divisor(sparse_block // key_split, 128)
    if min(BLOCK_N, IDX_BLOCK_N) < 16:
        raise ValueError(f"sparse_block ({sparse_block}) must be divisible by 16")
    ieee = q.dtype == torch.float32
    pdl = use_pdl(device, tune, T)
    pdl_kw = {"launch_pdl": True} if pdl else {}
    k_scaled = idx_k_scales is not None
    iks = idx_k_scales if k_scaled else idx_k_cache  # dummy pointer when unused
    is_str = idx_k_scales.stride() if k_scaled else (0, 0)
    ks, vs, kvs, sstr, kernel_mode, fp16_mma = kv_scale_args(
        q, kv_scale_mode, k_scale, v_scale, kv_scales, fold_scalar_scales)

    scores = torch.empty((T, HKV, NB * key_split), dtype=torch.float32, device=device)
    # float16 partials for half-precision queries (as the block-major prefill's):
    # a normalised per-range output is a convex mix of V rows; half the bytes
    part_dtype = torch.float32 if ieee or tune.get("f32_partials") else torch.float16
    part_o = torch.empty((T, HQ, NB * key_split, D_PAD), dtype=part_dtype, device=device)
    part_lse = torch.empty((T, HQ, NB * key_split), dtype=torch.float32, device=device)
    score_attend_block_kernel[(NB, T, HKV * 2 * key_split)](
        idx_q, idx_k_cache, iks, q, kv_cache, block_table, token_req, token_pos,
        scores, part_o, part_lse, ks, vs, kvs, float(scale), NB,
        idx_q.stride(0), idx_q.stride(1), idx_k_cache.stride(0), idx_k_cache.stride(1),
        is_str[0], is_str[1],
        q.stride(0), q.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        sstr[0], sstr[1], sstr[2], sstr[3],
        block_table.stride(0), scores.stride(0), scores.stride(1),
        HQ=HQ, G=G, G_PAD=G_PAD, D=D, D_PAD=D_PAD, DI=DI, DI_PAD=max(16, next_pow2(DI)),
        SPARSE_BLOCK=sparse_block, IDX_BLOCK_N=IDX_BLOCK_N, KEY_SPLIT=key_split,
        BLOCK_N=BLOCK_N,
        PAGE_SIZE=page_size, LOCAL=local_blocks, INIT=init_blocks, K_SCALED=k_scaled,
        SCALE_MODE=kernel_mode, IEEE=ieee, FP16_MMA=fp16_mma, PDL=pdl,
        num_warps=tune.get("num_warps", 4 if T == 1 else 2), **pdl_kw,
    )
    nb_pad = max(16, next_pow2(NB))
    one_round = bool(tune.get("merge_one_round", T <= SCORE_ATTEND_ONE_ROUND_TOKENS))
    chunks = min(int(tune.get("merge_chunks", SCORE_ATTEND_MERGE_CHUNKS if one_round else 1)),
                 D_PAD // 16)
    score_attend_merge_kernel[(T, HQ, chunks)](
        scores, part_o, part_lse, token_pos, out, NB,
        scores.stride(0), scores.stride(1), out.stride(0), out.stride(1),
        HQ=HQ, G=G, TOPK=topk, TOPK_PAD=max(2, next_pow2(topk)), NB_PAD=nb_pad,
        KEY_SPLIT=key_split, SPARSE_BLOCK=sparse_block, D=D, D_PAD=D_PAD,
        DC=D_PAD // chunks, ONE_ROUND=one_round, PDL=pdl,
        num_warps=tune.get("merge_warps", 4), **pdl_kw,
    )
    return out


__all__ = ["score_attend_decode", "score_attend_fits"]
