# SPDX-License-Identifier: Apache-2.0
"""``block_sparse_attention``: MiniMax-M3 MSA block-sparse GQA attention (Triton).

Query head h uses KV head ``h // (Hq // Hkv)`` and that KV head's selected
sparse blocks ``topk_blocks[t, kv_head]``; a key at position j of a selected
block is visible iff ``j <= token_pos[t]``.  Softmax in fp32 with ``scale``.
Decode-sized batches split the selected blocks over several programs and merge
the partial results by log-sum-exp; the split count depends only on static
sizes (CUDA-graph capturable, no host syncs).
"""

import torch

from ..kv_scale import KVScaleMode
from ._utils import (SELECT_MAX_BLOCKS, arrival_counters, cdiv, check_block_table,
                     check_int32_vector, check_triton, is_rocm, largest_pow2_divisor,
                     launch_tune, next_pow2, num_sms, use_pdl)
from .block_major_group import block_major_rank_kernel, block_major_scatter_kernel
from .sparse_attn_block_major import sparse_attn_block_major_kernel
from .sparse_attn_fwd import sparse_attn_fwd_kernel
from .sparse_attn_merge import sparse_attn_merge_kernel
from .sparse_attn_tiled import sparse_attn_tiled_kernel

try:  # Gluon (Triton's explicit-layout dialect) for the sm_90 block-major kernel
    from .sparse_attn_block_major_sm90 import (NUM_WARPS as SM90_NUM_WARPS,
                                               sm90_block_major_supported,
                                               sparse_attn_block_major_sm90_kernel)
except Exception:  # pragma: no cover - a Triton without Gluon (or its Hopper ops)
    sparse_attn_block_major_sm90_kernel = None

_FP8_DTYPES = tuple(
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))


def _validate(q, kv_cache, block_table, token_req, token_pos, topk_blocks, sparse_block,
              kv_scale_mode, k_scale, v_scale, kv_scales, select_topk=0):
    validate_attention_inputs(q, kv_cache, block_table, token_req, token_pos, sparse_block,
                              kv_scale_mode, k_scale, v_scale, kv_scales)
    T, HKV = q.shape[0], kv_cache.shape[3]
    if select_topk:
        if (topk_blocks.dim() != 3 or topk_blocks.shape[:2] != (T, HKV)
                or topk_blocks.dtype != torch.float32 or topk_blocks.stride(2) != 1
                or not 1 <= topk_blocks.shape[2] <= SELECT_MAX_BLOCKS):
            raise ValueError(
                f"select_topk needs the index's block scores as float32 [{T}, {HKV}, n] with "
                f"n <= {SELECT_MAX_BLOCKS} blocks, contiguous in the last dim "
                f"(index_block_topk(..., return_scores=True)), got {tuple(topk_blocks.shape)} "
                f"{topk_blocks.dtype}; longer rows need the top-k ids")
    elif (topk_blocks.dim() != 3 or topk_blocks.shape[:2] != (T, HKV)
            or topk_blocks.dtype != torch.int32 or topk_blocks.stride(2) != 1):
        raise ValueError(f"topk_blocks must be int32 [{T}, {HKV}, topk] contiguous in the last "
                         f"dim, got {tuple(topk_blocks.shape)} {topk_blocks.dtype}")


def attention_output(q, out):
    """``out`` checked to be a [T, Hq, D] tensor of q's dtype, contiguous in
    D; a new one when None."""
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be {q.dtype} {list(q.shape)} contiguous in the last dim")
    return out


def kv_scale_args(q, kv_scale_mode, k_scale, v_scale, kv_scales, fold_scalar_scales):
    """The KV-scale launch arguments of the attention kernels: (k_scale,
    v_scale, kv_scales pointers, with ``q`` standing in for those the mode
    does not read; kv_scales' strides; the kernels' SCALE_MODE, 3 for
    unfolded scalar scales; FP16_MMA: an fp8 cache with bf16 queries runs
    its dots in fp16)."""
    mode = KVScaleMode(kv_scale_mode)
    ks = k_scale if mode is KVScaleMode.SCALAR else q
    vs = v_scale if mode is KVScaleMode.SCALAR else q
    kvs = kv_scales if mode is KVScaleMode.PER_TOKEN_HEAD else q
    sstr = kv_scales.stride() if mode is KVScaleMode.PER_TOKEN_HEAD else (0, 0, 0, 0)
    kernel_mode = mode.kernel_mode(fold_scalar_scales)
    fp16_mma = mode is not KVScaleMode.NONE and q.dtype == torch.bfloat16
    return ks, vs, kvs, sstr, kernel_mode, fp16_mma


def validate_attention_inputs(q, kv_cache, block_table, token_req, token_pos, sparse_block,
                              kv_scale_mode, k_scale, v_scale, kv_scales):
    """The checks of ``block_sparse_attention``'s inputs other than the
    selection: shapes, dtypes and the fp8 scale arguments of each mode."""
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_q_heads, head_dim], got {tuple(q.shape)}")
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2:
        raise ValueError("kv_cache must be [num_pages, 2, page_size, num_kv_heads, head_dim], "
                         f"got {tuple(kv_cache.shape)}")
    T, HQ, D = q.shape
    _, _, page_size, HKV, DK = kv_cache.shape
    if DK != D:
        raise ValueError(f"head_dim mismatch: q has {D}, kv_cache has {DK}")
    if HQ % HKV != 0:
        raise ValueError(f"num_q_heads ({HQ}) must be a multiple of num_kv_heads ({HKV})")
    if q.stride(2) != 1 or kv_cache.stride(4) != 1:
        raise ValueError("q and kv_cache must be contiguous in head_dim")
    check_block_table(block_table)
    check_int32_vector("token_req", token_req, T)
    check_int32_vector("token_pos", token_pos, T)
    if sparse_block <= 0 or sparse_block % page_size != 0:
        raise ValueError(f"sparse_block ({sparse_block}) must be a positive multiple of the KV "
                         f"cache page size ({page_size})")
    if kv_scale_mode not in (KVScaleMode.NONE, KVScaleMode.SCALAR, KVScaleMode.PER_TOKEN_HEAD):
        raise ValueError(f"kv_scale_mode must be 0 (none), 1 (scalar) or 2 (per token and KV "
                         f"head), got {kv_scale_mode}")
    is_fp8 = kv_cache.dtype in _FP8_DTYPES
    if kv_scale_mode == 0 and is_fp8:
        raise ValueError("an fp8 kv_cache needs kv_scale_mode 1 (k_scale/v_scale) or 2 (kv_scales)")
    if kv_scale_mode == 0 and kv_cache.dtype != q.dtype:
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} must match q dtype {q.dtype}")
    if kv_scale_mode in (1, 2) and not is_fp8:
        raise ValueError(f"kv_scale_mode {kv_scale_mode} needs an fp8 kv_cache, got {kv_cache.dtype}")
    if kv_scale_mode == 1:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32:
                raise ValueError(f"kv_scale_mode 1 needs {name} as a one-element float32 tensor "
                                 "on the device (kept as a tensor so CUDA graphs see updates)")
    if kv_scale_mode == 2:
        want = (kv_cache.shape[0], 2, page_size, HKV)
        if (not isinstance(kv_scales, torch.Tensor) or tuple(kv_scales.shape) != want
                or kv_scales.dtype != torch.float32):
            raise ValueError(f"kv_scale_mode 2 needs kv_scales float32 {list(want)} "
                             "[num_pages, 2, page_size, num_kv_heads] (any strides)")


# token-tiled prefill attention pays while a request's whole context is a few
# times top-k blocks (neighbouring tokens then share most of their blocks)
TOKEN_TILE_MAX_BLOCKS_PER_TOPK = 4
# ROCm's own token tiles (AMD wavefronts are 64 wide; LDS per workgroup is 64 KiB
# on gfx942 (MI300X/MI325X), 160 KiB on gfx950 (MI355X)): the H200's tile of 8
# tokens in 8 warps and 2 stages needs 96 KiB of LDS (bf16 KV) and spills about
# 200 VGPRs; at most 4 tokens per program in one stage take 32 KiB and spill no
# VGPRs for bf16 and scalar-fp8 KV (tests/kernels/rocm_compile.py reports them)
ROCM_MAX_TOKEN_TILE = 4
ROCM_TILED_STAGES = 1
# block-major prefill: (token, slot) pairs per program (one K/V load for all)
BLOCK_MAJOR_PAIRS = 64
# pairs per program of the grouping launches: H200, 8192-token chunk, the
# rank kernel 8.7 / 9.6 us at 8k / 32k context against 14.0 / 14.2 with 1024
# (256: 7.7 / 10.4; 2048: 49.5 / 50.1), the attention 541.7 vs 547.7 us at 8k and
# 621.4 vs 629.0 at 32k (docs/decisions/0005-prefill-attention-layouts.md)
GROUP_BLOCK = 512
# partial outputs of one block-major launch, at most: an 8192-token chunk x 16
# heads x top-16 x 128 in fp16; longer batches (or more heads) run in slices
BLOCK_MAJOR_PARTIAL_BYTES = 512 << 20


def default_prefill_token_tile(max_context: int, sparse_block: int, topk: int,
                               kv_fp8: bool) -> int:
    """Tokens per program for the prefill tokens of a batch whose longest
    request has ``max_context`` tokens: 8 (bf16) / 4 (fp8 KV) when the context
    has at most ``TOKEN_TILE_MAX_BLOCKS_PER_TOPK * topk`` sparse blocks, else 0
    (one token per program).  H200, 8192-token chunk at 8k context
    (docs/decisions/0005-prefill-attention-layouts.md):
    bf16 TM 8 1.04 ms vs 1.08 untiled; fp8 TM 4 0.98 vs 1.33; at 32k and
    128k tiles lose (up to 3.7x) on the index's own selections."""
    if max_context <= 0 or sparse_block <= 0 or topk <= 0:
        return 0
    blocks = cdiv(max_context, sparse_block)
    if blocks > TOKEN_TILE_MAX_BLOCKS_PER_TOPK * topk:
        return 0
    return 4 if kv_fp8 else 8


# decode batches so small that every selected block split in this many key
# ranges still fits the SMs (tokens x KV heads x top-k x this <= SMs: batch 1
# and 2 at one KV head) split the blocks too (``key_split``).  H200,
# whole decode step, paired rounds (``python -m benchmarks.msa --sweep-kinds
# kv_dtype_parity``), us against one program per block: batch 1 x 8k bf16 14.69
# vs 14.82, fp8 15.04 vs 15.06, fp8 per-token-head 14.75 vs 15.42; 1 x 32k
# 20.29 vs 20.42, 20.06 vs 20.58, 20.10 vs 21.17; 1 x 128k 29.62 vs 29.98, 29.57
# vs 30.08, 29.82 vs 30.53; 2 x 8k 15.78 vs 16.18 (bf16); at 4 x 8k it loses
# (bf16 19.39 vs 18.77), where the rule no longer applies
DECODE_KEY_SPLIT = 4


def default_key_split(programs: int, sparse_block: int, sms: int) -> int:
    """Key ranges per selected block for a per-token decode launch of
    ``programs`` (tokens x KV heads x splits) programs that already split
    every selection slot: when ``DECODE_KEY_SPLIT`` times the programs still
    fit the ``sms`` SMs, the largest power of two up to ``DECODE_KEY_SPLIT``
    that leaves ranges of a multiple of 16 keys (4 for 128-key blocks, 2 for
    the 32-key blocks of test configs), else 1.  (The fused merge keeps 1:
    its last program would merge 4x the partials, H200: attention
    38.7 vs 15.7 us at 1 x 8k.)"""
    if programs * DECODE_KEY_SPLIT > sms:
        return 1
    split = DECODE_KEY_SPLIT
    while split > 1 and sparse_block % (16 * split):
        split //= 2
    return split


def default_prefetch_rows(kernel_mode: int, key_split: int, select_topk: bool) -> bool:
    """Whether the per-token kernel resolves the next key tile's selection
    slot and pages one tile ahead (``PREFETCH_ROWS``) when not asked: with
    per-token-head scales (kernel SCALE_MODE 2, whose tiles also load their
    scale rows through the pages) where the blocks are not split in key
    ranges (the two layouts exclude each other).  H200, whole decode
    step, paired rounds, us, per-token-head against without: 4 x 8k 19.17 vs
    19.55 (bf16 KV 19.14), 32 x 8k 47.52 vs 47.65, 32 x 32k 96.59 vs 96.77;
    bf16 and scalar fp8 KV lose at 4 x 8k (19.30 vs 19.14, 19.15 vs 18.83),
    and every KV dtype loses 3-4% at 1 x 32k, where it would replace
    ``key_split`` (docs/decisions/0003-decode-attention-launches.md).
    With the rule on: per-token-head / bf16 at 4 x 8k 1.002, and 0.997 with
    both on one batch, against 1.015 without it
    (docs/decisions/0003-decode-attention-launches.md)."""
    return kernel_mode == 2 and key_split == 1 and not select_topk


# block-major prefill attention pays from about this many prefill tokens in a
# batch; H200, chunks at the end of a 32k context, bf16 / fp8 KV:
# 256 tokens 91 vs 53 us per token, 1024 165 vs 166, 2048 244 vs 307,
# 8192 807 vs 1106 (fp8 855 vs 1339)
BLOCK_MAJOR_MIN_TOKENS = 1024
# (token, slot) pairs per step of a block-major program: 64 rows (4
# beats 8 at every context, 0.70 vs 0.87 ms at 8k)
BLOCK_MAJOR_STEP = 4


def default_prefill_layout(num_prefill_tokens: int, max_context: int, sparse_block: int,
                           topk: int, kv_fp8: bool) -> dict:
    """The Triton attention's layout for a batch's prefill tokens, as keyword
    arguments of ``block_sparse_attention``: block-major (``block_major`` =
    ``BLOCK_MAJOR_STEP``) from ``BLOCK_MAJOR_MIN_TOKENS`` prefill tokens,
    else token tiles by ``default_prefill_token_tile``."""
    if num_prefill_tokens >= BLOCK_MAJOR_MIN_TOKENS:
        return dict(token_tile=0, block_major=BLOCK_MAJOR_STEP)
    return dict(token_tile=default_prefill_token_tile(max_context, sparse_block, topk, kv_fp8),
                block_major=0)


def block_major_tiles(token_req: torch.Tensor, topk_blocks: torch.Tensor, num_reqs: int,
                      max_blocks: int, pairs_per_tile: int, aggregate: bool = True,
                      group_block: int = GROUP_BLOCK, token_pos: torch.Tensor | None = None,
                      sparse_block: int = 0, group_warps: int = 4):
    """Group the (token, slot) pairs of ``topk_blocks`` [T, Hkv, TOPK] by
    (request, KV head, block) on the device, without host syncs
    (``block_major_group``: a counting sort in two launches).  With
    ``token_pos`` (and ``sparse_block``) each group is split in two: group
    ``2 * key + masked`` holds the pairs whose token does not see the whole
    block (``masked``), so the rest need no causal mask.

    Returns int32 tensors (pair_tok, pair_slot) [P] sorted by group,
    (group_start, counts, tile_end) [NG] per group (``tile_end``: inclusive
    prefix sum of ``cdiv(count, pairs_per_tile)``), and ``num_tiles``, a
    static upper bound of the programs needed.  ``aggregate``: each program of
    ``group_block`` pairs sorts them and adds once per group to the counters,
    not once per pair (H200, an 8192-token chunk: the grouping's rank
    kernel 14.3 vs 24.4 us at 8k context, 14.8 vs 36.7 at 32k; block-major
    attention 590 vs 604 us at 8k, 666 vs 690 at 32k, 694 vs 702 at 128k;
    docs/decisions/0005-prefill-attention-layouts.md)."""
    T, HKV, TOPK = topk_blocks.shape
    dev = topk_blocks.device
    P = T * HKV * TOPK
    split = token_pos is not None
    if split and sparse_block <= 0:
        raise ValueError("block_major_tiles: token_pos needs the sparse_block size")
    NG = num_reqs * HKV * max_blocks * (2 if split else 1)
    if NG + P >= 2 ** 31:
        raise ValueError(f"block_major: {num_reqs} requests x {HKV} KV heads x {max_blocks} "
                         "blocks overflow int32 group ids; use token_tile or the per-token path")
    counts = torch.zeros(NG, dtype=torch.int32, device=dev)
    pair_key = torch.empty(P, dtype=torch.int32, device=dev)
    pair_rank = torch.empty(P, dtype=torch.int32, device=dev)
    grid = (cdiv(P, group_block),)
    block_major_rank_kernel[grid](
        topk_blocks, token_req, token_pos if split else token_req, pair_key, pair_rank,
        counts, P, topk_blocks.stride(0), topk_blocks.stride(1),
        HKV=HKV, TOPK=TOPK, MAX_BLOCKS=max_blocks, NG=NG, BLOCK=group_block,
        AGGREGATE=aggregate, SPLIT_MASKED=split, SPARSE_BLOCK=max(1, sparse_block),
        num_warps=group_warps)
    group_start = torch.cumsum(counts, 0, dtype=torch.int32) - counts
    tile_end = torch.cumsum(torch.div(counts + pairs_per_tile - 1, pairs_per_tile,
                                      rounding_mode="floor"), 0, dtype=torch.int32)
    pair_tok = torch.empty(P, dtype=torch.int32, device=dev)
    pair_slot = torch.empty(P, dtype=torch.int32, device=dev)
    block_major_scatter_kernel[grid](
        pair_key, pair_rank, group_start, pair_tok, pair_slot, P, NG,
        HKV=HKV, TOPK=TOPK, BLOCK=group_block, num_warps=4)
    # at most P / pairs_per_tile full programs plus one partial per non-empty group
    num_tiles = cdiv(P, pairs_per_tile) + min(NG, P)
    return pair_tok, pair_slot, group_start, counts, tile_end, num_tiles


def block_sparse_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    topk_blocks: torch.Tensor,
    sparse_block: int,
    scale: float,
    kv_scale_mode: KVScaleMode = KVScaleMode.NONE,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_scales: torch.Tensor | None = None,
    *,
    fold_scalar_scales: bool = True,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    fused_merge: bool = False,
    token_tile: int = 0,
    tile_start: int = 0,
    block_major: int = 0,
    select_topk: int = 0,
) -> torch.Tensor:
    """Block-sparse GQA attention of each query token over its selected blocks.

    Args:
      q: [T, Hq, D] queries (after norm + RoPE), model dtype.
      kv_cache: [num_pages, 2, page_size, Hkv, D], model dtype or fp8 e4m3.
      block_table [R, max_pages], token_req [T], token_pos [T]: int32.
      topk_blocks: [T, Hkv, topk] int32 selected block ids, -1 = empty.
      sparse_block: tokens per sparse block; scale: softmax scale.
      kv_scale_mode: 0 none, 1 scalar (k_scale, v_scale one-element float32
        tensors), 2 per token and KV head (kv_scales [num_pages, 2, page_size,
        Hkv] float32).
      fold_scalar_scales: with kv_scale_mode 1, fold k_scale into the softmax
        scale and apply v_scale once to the output (default); False scales
        every loaded K/V element instead (A/B benchmarks only).
      out: optional [T, Hq, D] output (q dtype).
      num_splits: override of the split count over selected blocks (tests).
      fused_merge: with several splits, the split program that finishes last
        merges them (arrival counters in a persistent buffer): no merge launch.
      token_tile: > 1 runs ``sparse_attn_tiled``: one program per this many
        consecutive tokens and KV head, reading each distinct selected block
        of the tile once (for prefill chunks; no context splits); at most
        ``ROCM_MAX_TOKEN_TILE`` on ROCm.
      tile_start: with ``token_tile`` or ``block_major``, tokens before this
        index (a batch's decode tokens, which share few blocks with their
        neighbours) run one per program as without it; the tiles start here.
      block_major: > 1 runs ``sparse_attn_block_major`` for prefill: the
        (token, slot) pairs are grouped by selected block on the device and
        one program takes up to ``BLOCK_MAJOR_PAIRS`` pairs of one block,
        reading the block's K/V once for them, and computes this many pairs
        (a power of two) per step; per-block results are merged per token.
        Off unless asked for.
      select_topk: > 0: ``topk_blocks`` is instead the index's block scores
        [T, Hkv, n] float32 with n <= ``SELECT_MAX_BLOCKS``
        (``index_block_topk(..., return_scores=True)``), and every program
        selects its token's top ``select_topk`` blocks by rank itself: the same
        slots as the separate select launch, one launch fewer (per-token
        decode layout only).
    Launch overrides (benchmarks only, ``launch_overrides("attention", ...)``):
        BLOCK_N, num_warps, num_stages; ``pairs_per_program``: block-major pairs per program, default
        ``BLOCK_MAJOR_PAIRS``; ``hold_kv``: block-major keeps the block's K/V in
        registers for all of them (default) or loads it again each step;
        ``prefetch_pairs``: block-major loads each step's pairs and query rows
        during the step before (default: unless the MMA runs in fp16 for an
        fp8 cache); ``prefetch_query``: with ``prefetch_pairs``, the query
        rows too (default unless ``query_mma`` with v_scale in the kernel) or
        only the pair ids, slots and positions;
        ``query_mma``: with an fp8 cache and bf16 queries,
        block-major converts the held K/V to bf16 once and runs its MMA in
        bf16 (default with scalar scales, else in fp16);
        ``v_scale_in_merge``: with scalar fp8 scales, block-major's merge
        applies v_scale to each output row instead of the kernel to every
        partial (default); ``scale_held_kv``: with per-token-head scales,
        block-major scales its held K/V once (default when the sparse
        block is one key tile; False: an fp16 MMA scaling each step);
        ``partial_bytes``: block-major partial outputs per launch, default
        ``BLOCK_MAJOR_PARTIAL_BYTES``; ``aggregate_ranks``: block-major's
        grouping adds to its counters once per group and program (default;
        False: once per pair; see ``block_major_tiles``); ``group_block``: pairs
        per program of the grouping, a power of two (default ``GROUP_BLOCK``),
        ``group_warps`` the warps of its rank kernel (default 4);
        ``prefetch_rows``:
        the per-token kernel resolves the next key tile's selection slot and
        pages one tile ahead (default: ``default_prefetch_rows``, per-token-head
        scales only); ``pdl``: programmatic dependent launch of the per-token
        kernel and the merge, default VLLM_MINIMAX_M3_PDL;
        ``key_split``: the per-token kernel also splits each selected block
        into this many key ranges, one program each (tokens before
        ``tile_start`` only when a prefill layout is given); default
        ``DECODE_KEY_SPLIT`` where those programs still fit the SMs, else 1);
        ``merge_skip_empty``: block-major's merge reads only the partials of
        non-empty slots (default; False: every slot's, weighed by zero);
        ``merge_row_order``: its programs in a 1-D grid in (token, head) row
        order (default; False: a (token, head) grid);
        ``sm90``: on an H100/H200, block-major runs the Gluon kernel where it
        covers the launch (default; False: the ``tl`` kernel); ``sm90_buffers``:
        its query ring's depth.
    Returns: [T, Hq, D] in q.dtype.
    """
    tune = launch_tune("attention")
    _validate(q, kv_cache, block_table, token_req, token_pos, topk_blocks, sparse_block,
              kv_scale_mode, k_scale, v_scale, kv_scales, select_topk)
    device = q.device
    check_triton(device)
    T, HQ, D = q.shape
    _, _, page_size, HKV, _ = kv_cache.shape
    topk = int(select_topk) if select_topk else topk_blocks.shape[2]
    G = HQ // HKV
    if select_topk and (token_tile > 1 or block_major > 1 or tune.get("prefetch_rows")):
        raise ValueError("select_topk runs the per-token decode layout only (no token_tile, "
                         "block_major or prefetch_rows)")
    out = attention_output(q, out)
    if T == 0:
        return out

    if num_splits is None:
        # split the selected blocks only when tokens x KV heads cannot fill the GPU
        work = T * HKV
        splits = 1
        while splits < topk and work * splits * 2 <= 2 * num_sms(device):
            splits *= 2
    else:
        splits = max(1, min(int(num_splits), topk))
    slots = cdiv(topk, splits)
    splits = cdiv(topk, slots)
    key_split = tune.get("key_split")
    if key_split is None:
        key_split = (default_key_split(T * HKV * splits, sparse_block, num_sms(device))
                     if num_splits is None and splits == topk and not fused_merge
                     and not tune.get("prefetch_rows") else 1)
    key_split = int(key_split)
    if key_split < 1 or key_split & (key_split - 1) or sparse_block % (16 * key_split):
        raise ValueError(f"key_split ({key_split}) must be a power of two that leaves "
                         f"sparse_block ({sparse_block}) in key ranges of a multiple of 16")
    if key_split > 1 and tune.get("prefetch_rows"):
        raise ValueError("key_split and prefetch_rows are two per-token decode layouts; pick one")
    splits *= key_split

    G_PAD = max(16, next_pow2(G))
    D_PAD = max(16, next_pow2(D))
    # H200 sweep (8192-token prefill chunk): 128-key tiles / 4 warps fastest
    # for bf16 (1.11 vs 1.18 ms at 64) and fp8 (1.33 vs 1.80 ms)
    BLOCK_N = largest_pow2_divisor(sparse_block // key_split,
                                   tune.get("BLOCK_N", 128 if D_PAD <= 128 else 32))
    if BLOCK_N < 16:
        raise ValueError(f"sparse_block ({sparse_block}) must be divisible by 16")
    ieee = q.dtype == torch.float32
    ks, vs, kvs, sstr, kernel_mode, fp16_mma = kv_scale_args(
        q, kv_scale_mode, k_scale, v_scale, kv_scales, fold_scalar_scales)
    prefetch_rows = bool(tune.get("prefetch_rows", default_prefetch_rows(
        kernel_mode, key_split, bool(select_topk))))

    if token_tile and (token_tile < 1 or token_tile & (token_tile - 1)):
        raise ValueError(f"token_tile must be a power of two (tokens per program), "
                         f"got {token_tile}")
    if block_major and (block_major < 1 or block_major & (block_major - 1)):
        raise ValueError(f"block_major must be a power of two (pairs per step), "
                         f"got {block_major}")
    if token_tile > 1 and block_major > 1:
        raise ValueError("token_tile and block_major are two prefill layouts; pick one")
    rocm = is_rocm(device)
    if rocm:
        token_tile = min(token_tile, ROCM_MAX_TOKEN_TILE)
    if (token_tile > 1 or block_major > 1) and 0 < tile_start:
        # the batch's decode tokens one per program, the tiles after them
        n = min(int(tile_start), T)
        block_sparse_attention(
            q[:n], kv_cache, block_table, token_req[:n], token_pos[:n], topk_blocks[:n],
            sparse_block, scale, kv_scale_mode, k_scale, v_scale, kv_scales,
            fold_scalar_scales=fold_scalar_scales, out=out[:n], fused_merge=fused_merge)
        if n < T:
            block_sparse_attention(
                q[n:], kv_cache, block_table, token_req[n:], token_pos[n:], topk_blocks[n:],
                sparse_block, scale, kv_scale_mode, k_scale, v_scale, kv_scales,
                fold_scalar_scales=fold_scalar_scales, out=out[n:], token_tile=token_tile,
                block_major=block_major)
        return out
    if block_major > 1:
        _block_major_attention(
            q, kv_cache, block_table, token_req, token_pos, topk_blocks, sparse_block,
            float(scale), out, int(block_major), kernel_mode, ks, vs, kvs, sstr, G, G_PAD,
            D_PAD, BLOCK_N, ieee, fp16_mma, tune)
        return out
    if token_tile > 1:
        # 128 accumulator rows or more: 8 warps keep the fp32 tile in registers
        tiled_warps = 4 if token_tile * G_PAD <= 64 else 8
        sparse_attn_tiled_kernel[(cdiv(T, token_tile), HKV)](
            q, kv_cache, block_table, token_req, token_pos, topk_blocks, out,
            ks, vs, kvs, float(scale), T,
            q.stride(0), q.stride(1),
            kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
            sstr[0], sstr[1], sstr[2], sstr[3],
            block_table.stride(0),
            topk_blocks.stride(0), topk_blocks.stride(1),
            out.stride(0), out.stride(1),
            G=G, G_PAD=G_PAD, TM=int(token_tile), D=D, D_PAD=D_PAD,
            TOPK=topk, TOPK_PAD=max(2, next_pow2(topk)),
            SPARSE_BLOCK=sparse_block, BLOCK_N=BLOCK_N, PAGE_SIZE=page_size,
            SCALE_MODE=kernel_mode, IEEE=ieee, FP16_MMA=fp16_mma,
            num_warps=tune.get("num_warps", tiled_warps),
            num_stages=tune.get("num_stages", ROCM_TILED_STAGES if rocm else 2),
        )
        return out

    if splits == 1:
        part_o = part_lse = out
        o_ptr, ost = out, (out.stride(0), out.stride(1))
    else:
        part_o = torch.empty((T, HQ, splits, D_PAD), dtype=torch.float32, device=device)
        part_lse = torch.empty((T, HQ, splits), dtype=torch.float32, device=device)
        o_ptr, ost = out, (HQ, 1)
    fused = fused_merge and splits > 1
    # an fp8 cache with programs on at most half the SMs (decode batches up to 4
    # tokens at 16 splits): 8 warps split each program's fp8 -> fp16 conversion of
    # its keys and values (H200, the chain with scalar scales: 15.1 vs 15.4 us
    # at 1 x 8k, 20.6 vs 21.3 at 1 x 32k; attention 10.5 vs 10.9 at 2 x 8k,
    # 11.2 vs 11.8 at 4 x 8k).  At 8 x 8k (128 programs) 8 warps lose already (13.9
    # vs 13.5, per-token-head scales 15.6 vs 14.1), at 32 x 8k more (53.0 vs 47.9);
    # docs/decisions/0003-decode-attention-launches.md
    # (not on ROCm: 8 wavefronts of 64 leave 256 VGPRs a lane, and fp8 KV spills)
    warps = (8 if kv_scale_mode != 0 and 2 * T * HKV * splits <= num_sms(device) and not rocm
             else 4)
    pdl = use_pdl(device, tune, T)
    pdl_kw = {"launch_pdl": True} if pdl else {}
    counters = arrival_counters(device, "attention_merge", T * HKV) if fused else q  # unused
    nb_pad = max(16, next_pow2(topk_blocks.shape[2])) if select_topk else 16
    sparse_attn_fwd_kernel[(T, HKV, splits)](
        q, kv_cache, block_table, token_req, token_pos, topk_blocks,
        o_ptr, part_o, part_lse,
        ks, vs, kvs, counters,
        float(scale),
        q.stride(0), q.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        sstr[0], sstr[1], sstr[2], sstr[3],
        block_table.stride(0),
        topk_blocks.stride(0), topk_blocks.stride(1),
        ost[0], ost[1],
        out.stride(0), out.stride(1),
        G=G, G_PAD=G_PAD, D=D, D_PAD=D_PAD,
        TOPK=topk, SLOTS=slots, NUM_SPLITS=splits,
        SPARSE_BLOCK=sparse_block, BLOCK_N=BLOCK_N, PAGE_SIZE=page_size,
        SCALE_MODE=kernel_mode, IEEE=ieee,
        FP16_MMA=fp16_mma,
        FUSED_MERGE=fused, S_PAD=max(2, next_pow2(splits)),
        PREFETCH_ROWS=prefetch_rows, PDL=pdl,
        SELECT_RANK=bool(select_topk), SELECT_NB=topk_blocks.shape[2] if select_topk else 1,
        NB_PAD=nb_pad, RANK_COLS=nb_pad, KEY_SPLIT=key_split,
        num_warps=tune.get("num_warps", warps), num_stages=tune.get("num_stages", 2), **pdl_kw,
    )
    if splits > 1 and not fused:
        sparse_attn_merge_kernel[(T, HQ)](
            part_o, part_lse, out, part_lse,
            out.stride(0), out.stride(1),
            HQ=HQ, S=splits, S_PAD=max(2, next_pow2(splits)), D=D, D_PAD=D_PAD, PDL=pdl,
            num_warps=4, **pdl_kw,
        )
    return out


def _block_major_attention(q, kv_cache, block_table, token_req, token_pos, topk_blocks,
                           sparse_block, scale, out, pairs, kernel_mode, ks, vs, kvs, sstr,
                           G, G_PAD, D_PAD, BLOCK_N, ieee, fp16_mma, tune):
    """``block_major`` for tokens that all take the block-major path: grouping,
    block-major kernel and merge, in launches of at most
    ``BLOCK_MAJOR_PARTIAL_BYTES`` of partial outputs (the temporaries are not
    part of vLLM's memory profile)."""
    T, HQ, D = q.shape
    _, _, page_size, HKV, _ = kv_cache.shape
    topk = topk_blocks.shape[2]
    max_blocks = cdiv(block_table.shape[1] * page_size, sparse_block)
    # pairs per program (a multiple of ``pairs``, the pairs per step): the
    # block's K/V is loaded once for all of them
    chunk = max(pairs, next_pow2(int(tune.get("pairs_per_program", BLOCK_MAJOR_PAIRS))))
    # float16 partials for half-precision models: the normalised per-block
    # output is a convex mix of V rows, well inside fp16's range
    part_dtype = torch.float32 if ieee else torch.float16
    per_token = HQ * topk * D_PAD * part_dtype.itemsize
    max_tokens = max(1, int(tune.get("partial_bytes", BLOCK_MAJOR_PARTIAL_BYTES)) // per_token)
    step = cdiv(T, cdiv(T, max_tokens))  # even slices, no small tail
    rows = pairs * G_PAD
    hold_kv = bool(tune.get("hold_kv", True))
    # ``query_mma`` (fp8 cache, bf16 queries): the block's K/V, held for all of a
    # program's steps, converted once to the queries' dtype, so the MMA runs in
    # bf16 as for a bf16 cache (no per-step fp16 query, whose register operand
    # makes the prefetch spill); with it each step's pair rows are prefetched
    # but not its query rows (those spill too).  H200, 8192-token chunk,
    # scalar scales: 651 / 745 / 745 us at 8k / 32k / 128k context against 680 /
    # 782 / 778 for the fp16 MMA without prefetch; with per-token-head scales
    # it spills (766 / 875 / 866 against 690 / 783 / 776), so not there
    # (docs/decisions/0008-fp8-kv-against-bf16.md)
    query_mma = fp16_mma and hold_kv and bool(tune.get("query_mma", kernel_mode == 1))
    # scalar scales: the merge applies v_scale to each output row, not the kernel
    # to every pair's partial; the step loop then fits the prefetched query rows
    # without spilling (sm_90 ptxas: 0 bytes, against 104 with the multiply)
    v_in_merge = kernel_mode == 1 and bool(tune.get("v_scale_in_merge", True))
    # per-token-head scales multiplied into the held block once (rounded to the
    # queries' dtype), the MMA then in that dtype with both prefetches; sm_90 ptxas:
    # no spills (the fp16 MMA scaling every step's score and probability columns
    # spills with prefetch, so runs without).  H200, 8192-token chunk:
    # 614 / 686 / 687 us at 8k / 32k / 128k context against 692 / 782 / 781 for
    # the fp16 MMA, and bf16 KV 603 / 685 / 696
    # (docs/decisions/0008-fp8-kv-against-bf16.md)
    scale_held = (kernel_mode == 2 and hold_kv and sparse_block == BLOCK_N
                  and bool(tune.get("scale_held_kv", True)))
    # either way the held block is in the queries' dtype and so is the MMA
    mma_in_q_dtype = query_mma or scale_held
    # the pairs that see their whole block grouped apart from the rest, so their
    # steps run without the causal mask (the held block only)
    split_masked = hold_kv and sparse_block == BLOCK_N and bool(tune.get("split_masked", True))
    # Hopper: the Gluon kernel (cp.async query ring, warpgroup MMAs) where it
    # covers the launch, the ``tl`` kernel otherwise
    sm90 = (sparse_attn_block_major_sm90_kernel is not None and bool(tune.get("sm90", True))
            and split_masked and (kernel_mode != 1 or v_in_merge)
            and (kernel_mode != 2 or scale_held) and D == D_PAD
            and sm90_block_major_supported(q, kernel_mode, D, sparse_block, G, G_PAD,
                                           pairs))
    # query tiles in the ring: H200, 8192-token chunk, attention at 8k / 128k
    # context: bf16 478.7 / 572.2 us with 2 against 485.6 / 574.5 with 3; fp8 scalar
    # scales 494.5 / 592.0 against 495.0 / 588.1, per-token-head 507.7 / 612.7
    # against 507.8 / 614.1 (docs/decisions/0005-prefill-attention-layouts.md)
    sm90_buffers = int(tune.get("sm90_buffers", 2 if kernel_mode == 0 else 3))
    for s in range(0, T, step):
        q_s, out_s = q[s:s + step], out[s:s + step]
        req_s, pos_s = token_req[s:s + step], token_pos[s:s + step]
        n = q_s.shape[0]
        pair_tok, pair_slot, group_start, counts, tile_end, num_tiles = block_major_tiles(
            req_s, topk_blocks[s:s + step], block_table.shape[0], max_blocks, chunk,
            aggregate=bool(tune.get("aggregate_ranks", True)),
            group_block=int(tune.get("group_block", GROUP_BLOCK)),
            group_warps=int(tune.get("group_warps", 4)),
            token_pos=pos_s if split_masked else None, sparse_block=sparse_block)
        part_o = torch.empty((n, HQ, topk, D_PAD), dtype=part_dtype, device=q.device)
        part_lse = torch.full((n, HQ, topk), float("-inf"), dtype=torch.float32,
                              device=q.device)
        if sm90:
            sparse_attn_block_major_sm90_kernel[(num_tiles,)](
                q_s, kv_cache, block_table, req_s, pos_s,
                pair_tok, pair_slot, group_start, counts, tile_end, counts.numel(), max_blocks,
                part_o, part_lse, ks, kvs, scale,
                q.stride(0), q.stride(1),
                kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
                sstr[0], sstr[1], sstr[2], sstr[3],
                block_table.stride(0),
                HQ=HQ, HKV=HKV, G=G, G_PAD=G_PAD, TM=pairs, CHUNK=chunk, D=D, TOPK=topk,
                SPARSE_BLOCK=sparse_block, PAGE_SIZE=page_size, SCALE_MODE=kernel_mode,
                SPLIT_MASKED=split_masked, NUM_BUF=sm90_buffers,
                num_warps=SM90_NUM_WARPS.value)
        else:
            sparse_attn_block_major_kernel[(num_tiles,)](
                q_s, kv_cache, block_table, req_s, pos_s,
                pair_tok, pair_slot, group_start, counts, tile_end, counts.numel(), max_blocks,
                part_o, part_lse, ks, vs, kvs, scale,
                q.stride(0), q.stride(1),
                kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
                sstr[0], sstr[1], sstr[2], sstr[3],
                block_table.stride(0),
                HQ=HQ, HKV=HKV, G=G, G_PAD=G_PAD, TM=pairs, CHUNK=chunk, D=D, D_PAD=D_PAD,
                TOPK=topk, SPARSE_BLOCK=sparse_block, BLOCK_N=BLOCK_N, PAGE_SIZE=page_size,
                SCALE_MODE=kernel_mode, IEEE=ieee, FP16_MMA=fp16_mma and not mma_in_q_dtype,
                HOLD_KV=hold_kv,
                # each step's rows loaded during the step before: H200, 8192-token
                # chunk, bf16 KV: 607 vs 687 us at 8k, 690 vs 782 at 32k, 692 vs 793 at
                # 128k; with an fp8 cache (fp16 MMA, ptxas spills) 1-2% slower, so off
                # (docs/decisions/0005-prefill-attention-layouts.md)
                PREFETCH_PAIRS=bool(tune.get("prefetch_pairs", not fp16_mma or mma_in_q_dtype)),
                PREFETCH_QUERY=bool(tune.get("prefetch_query",
                                             not mma_in_q_dtype or v_in_merge or scale_held)),
                V_SCALE_IN_MERGE=v_in_merge, SCALE_HELD_KV=scale_held,
                ONE_TILE_SOFTMAX=bool(tune.get("one_tile_softmax", True)),
                MASK_PARTIAL_ONLY=bool(tune.get("mask_partial_only", True)),
                SPLIT_MASKED=split_masked,
                num_warps=tune.get("num_warps", 4 if rows <= 64 else 8),
                # one stage: H200, 8192-token chunk, bf16 / fp8 KV: 665 vs 695 us
                # at 8k, 758 vs 802 at 32k, 760 vs 809 at 128k (fp8 777 vs 843);
                # docs/decisions/0005-prefill-attention-layouts.md
                num_stages=tune.get("num_stages", 1),
            )
        # one warp: H200, 8192 tokens x 16 heads x 16 fp16 partials
        # (docs/decisions/0005-prefill-attention-layouts.md): 142 us (3.8 TB/s) with 1
        # warp, 223 with 2, 681 with 4.  Empty slots'
        # partials not read (``merge_skip_empty``): 8192-token chunk at 8k (its
        # first 2048 tokens see fewer than 16 blocks), merge 129.1 vs 141.8 us, the
        # attention 0.978x in 7 of 7 paired rounds
        # (docs/decisions/0005-prefill-attention-layouts.md)
        # programs in row order (consecutive ones read consecutive partials): H200
        # 8192-token chunk, merge 128.4 / 139.3 / 138.9 us at 8k / 32k / 128k
        # context against 129.2 / 142.1 / 142.8 for a (token, head) grid
        # (docs/decisions/0005-prefill-attention-layouts.md)
        row_order = bool(tune.get("merge_row_order", True))
        sparse_attn_merge_kernel[(n * HQ,) if row_order else (n, HQ)](
            part_o, part_lse, out_s, vs if v_in_merge else part_lse, out.stride(0),
            out.stride(1), HQ=HQ, S=topk, S_PAD=max(2, next_pow2(topk)), D=D, D_PAD=D_PAD,
            V_SCALE=v_in_merge, SKIP_EMPTY=bool(tune.get("merge_skip_empty", True)),
            ROW_ORDER=row_order,
            num_warps=tune.get("merge_warps", 1),
        )


__all__ = ["block_major_tiles", "block_sparse_attention", "default_key_split",
           "default_prefill_layout", "default_prefill_token_tile"]
