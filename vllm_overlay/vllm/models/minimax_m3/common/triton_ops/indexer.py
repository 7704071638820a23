# SPDX-License-Identifier: Apache-2.0
"""``index_block_topk``: MiniMax-M3 MSA index scoring + block top-k (Triton).

Semantics (same as the PyTorch reference backend, ``sparse_ops.py``): for query
token t and index head h the score of sparse block b is
``max_{j in block b, j <= token_pos[t]} fp32 dot(idx_q[t, h], idx_k[j])``
(no scale).  Blocks ``own - local_blocks + 1 .. own`` (own = token_pos //
sparse_block, clamped at 0) and ``0 .. init_blocks - 1`` (when visible) are
always selected; the rest of the ``topk`` slots go to the best-scoring
visible blocks.  The result lists block ids left-packed, without repeats,
with -1 in the slots left over when fewer than ``topk`` blocks are visible.
The order of the valid ids inside a row is unspecified.

Two paths, both without host syncs or data-dependent grids:
  * decode (tokens ``[0, num_decode_tokens)``): split over the context
    (``index_score_decode`` writes per-block maxima, ``index_topk_select``
    picks the top-k); grid sizes depend only on ``max_context``.
  * prefill (the remaining tokens): tiles of query tokens with a streaming
    top-k in registers (``index_topk_prefill``), optionally split over the
    context and merged by ``index_topk_select``; on an H100/H200 (bf16 / fp16
    index keys, index dim = sparse block = 128) block scores by a Gluon kernel
    (``index_score_prefill_sm90``) and a select launch (``select_score_rows``).
Callers that know the batch split (vLLM orders decode tokens first) should
pass ``num_decode_tokens``; the default sends a batch with T <= R tokens down
the decode path and any other batch down the prefill path (correct either
way; decode tokens of a mixed batch are then scanned by one program each
without a context split, i.e. slower at long context).
"""

from collections.abc import Mapping

import torch

from ._utils import (SELECT_MAX_BLOCKS, arrival_counters, cdiv, check_block_table,
                     check_int32_vector, check_triton, largest_pow2_divisor, launch_tune,
                     next_pow2, num_sms, use_pdl)
from .index_score_decode import index_block_max_decode_kernel
from .index_topk_prefill import index_topk_prefill_kernel
from .index_topk_select import block_topk_bitonic_kernel, block_topk_select_kernel

try:  # Gluon (Triton's explicit-layout dialect) for the sm_90 prefill index
    from .index_score_prefill_sm90 import (MAX_REGISTERS as SM90_INDEX_REGISTERS,
                                           NUM_WARPS as SM90_INDEX_WARPS,
                                           index_block_max_prefill_sm90_kernel,
                                           sm90_index_supported)
except Exception:  # pragma: no cover - a Triton without Gluon (or its Hopper ops)
    index_block_max_prefill_sm90_kernel = None

_FP8_DTYPES = tuple(
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))


# launch-shape overrides of the tl prefill kernel: with any of them the prefill
# index runs that kernel (not the sm_90 one) unless the override ``sm90`` says otherwise
TL_PREFILL_TUNES = frozenset(("BLOCK_M", "num_warps", "num_stages", "prefetch_rows",
                              "skip_full_mask", "split_visible"))


def _select_warps(chunk: int) -> int:
    # the top-k extraction is a chain of reductions: keep them inside few warps
    return 1 if chunk <= 128 else (2 if chunk <= 512 else 4)


def decode_select(chunk: int, max_blocks: int, fused: bool,
                  tune: Mapping) -> tuple[bool, bool, int]:
    """How the decode path picks the top-k of rows of ``max_blocks`` block
    scores held in one ``chunk`` (``SINGLE_CHUNK`` when max_blocks <= chunk):
    (by rank, by a bitwise threshold search, the select launch's warps); both
    False: arg-max rounds.  ``tune`` may force rank_select / radix_select /
    select_warps."""
    # by rank in one pass for rows of at most 64 entries (8k context at 128-token
    # blocks): H200, the decode chain at 1 x 8k 13.8 vs 15.4 us, 32 x 8k 44.1
    # vs 44.8; at 256 blocks (32k) it is 4x slower (86 vs 20 us at 1 x 32k)
    # (docs/decisions/0002-decode-index-and-top-k.md); the same rule for the
    # fused select (its last scoring program ranks the row)
    rank = bool(tune.get("rank_select", chunk <= 64)) and max_blocks <= chunk <= 256
    # by threshold search, one warp, for rows of 65-256 entries (up to 32k context)
    # in the select launch: H200, its device time 4.2-4.3 vs 5.2 us at 256
    # blocks; at 1024 blocks (128k) arg-max rounds win, 6.3 vs 7.0-9.6 us at 1-8
    # warps (docs/decisions/0002-decode-index-and-top-k.md)
    radix = (bool(tune.get("radix_select", 64 < chunk <= 256 and not fused))
             and max_blocks <= chunk and not rank)
    warps = int(tune.get("select_warps", 1 if radix else _select_warps(chunk)))
    return rank, radix, warps


def _validate(idx_q, idx_k_cache, block_table, token_req, token_pos, sparse_block,
              topk, local_blocks, init_blocks, idx_k_scales):
    if idx_q.dim() != 3:
        raise ValueError(f"idx_q must be [num_tokens, index_heads, index_dim], got {tuple(idx_q.shape)}")
    if idx_k_cache.dim() != 3:
        raise ValueError("idx_k_cache must be [num_pages, page_size, index_dim], got "
                         f"{tuple(idx_k_cache.shape)}")
    T, H, D = idx_q.shape
    if idx_k_cache.shape[2] != D:
        raise ValueError(f"index dim mismatch: idx_q has {D}, idx_k_cache has {idx_k_cache.shape[2]}")
    if idx_q.stride(2) != 1 or idx_k_cache.stride(2) != 1:
        raise ValueError("idx_q and idx_k_cache must be contiguous in the index dim")
    check_block_table(block_table)
    check_int32_vector("token_req", token_req, T)
    check_int32_vector("token_pos", token_pos, T)
    page_size = idx_k_cache.shape[1]
    if sparse_block <= 0 or sparse_block % page_size != 0:
        raise ValueError(f"sparse_block ({sparse_block}) must be a positive multiple of the "
                         f"index cache page size ({page_size})")
    if topk <= 0:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if local_blocks < 0 or init_blocks < 0 or local_blocks + init_blocks > topk:
        raise ValueError(f"need 0 <= local_blocks ({local_blocks}), 0 <= init_blocks "
                         f"({init_blocks}) and local_blocks + init_blocks <= topk ({topk})")
    if idx_k_cache.dtype in _FP8_DTYPES:
        if idx_k_scales is None:
            raise ValueError("an fp8 idx_k_cache needs idx_k_scales [num_pages, page_size] float32 "
                             "(one dequantisation scale per token)")
    elif idx_k_cache.dtype != idx_q.dtype:
        raise ValueError(f"idx_k_cache dtype {idx_k_cache.dtype} must match idx_q dtype "
                         f"{idx_q.dtype} (or be fp8 with idx_k_scales)")
    if idx_k_scales is not None:
        if (idx_k_scales.shape != idx_k_cache.shape[:2] or idx_k_scales.dtype != torch.float32):
            raise ValueError("idx_k_scales must be float32 [num_pages, page_size], got "
                             f"{tuple(idx_k_scales.shape)} {idx_k_scales.dtype}")
        if idx_k_cache.dtype not in _FP8_DTYPES:
            raise ValueError("idx_k_scales is only valid with an fp8 idx_k_cache")


def index_block_topk(
    idx_q: torch.Tensor,
    idx_k_cache: torch.Tensor,
    block_table: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    sparse_block: int,
    topk: int,
    local_blocks: int = 1,
    init_blocks: int = 0,
    *,
    num_decode_tokens: int | None = None,
    max_context: int | None = None,
    idx_k_scales: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocks_per_prog: int | None = None,
    context_splits: int | None = None,
    select_chunk: int | None = None,
    fused_select: bool = False,
    return_scores: bool = False,
) -> torch.Tensor:
    """Select the top-k sparse blocks per (query token, index head).

    Args:
      idx_q: [T, H_idx, D_idx] index queries (after norm + RoPE), model dtype.
      idx_k_cache: [num_pages, page_size, D_idx] paged index keys (model dtype,
        or fp8 e4m3 with ``idx_k_scales`` [num_pages, page_size] float32).
      block_table: [R, max_pages] int32; token_req / token_pos: [T] int32.
      sparse_block: tokens per sparse block (a multiple of page_size).
      topk, local_blocks, init_blocks: selection sizes (see module doc).
      num_decode_tokens: tokens ``[0, n)`` take the split-context decode path,
        the rest the prefill path.  Default: all decode when T <= R (one token
        per request), else all prefill.  Both paths give the same result.
      max_context: static upper bound on token_pos + 1 (default
        ``max_pages * page_size``); sizes the decode grid and score buffer.
      blocks_per_prog, context_splits, select_chunk: tuning overrides (tests
        use them to exercise every code path; select_chunk a power of two;
        context_splits alone: fixed context ranges, with
        the launch override ``split_visible=True`` splits of the blocks a tile sees).
      return_scores: decode batches (every token on the decode path) of at
        most ``SELECT_MAX_BLOCKS`` blocks per row: return the block scores
        [T, H_idx, max_blocks] float32 (+inf = forced; entries after a token's
        own block unwritten) without the select launch, for
        ``block_sparse_attention(..., select_topk=topk)``.
      fused_select: decode path in one launch (the last scoring program of a
        token selects its top-k; arrival counters in a persistent buffer).
    Launch overrides (benchmarks only, ``launch_overrides("index", ...)``):
        prefill BLOCK_M,
        num_warps, num_stages, prefetch_rows, skip_full_mask, split_visible=False:
        fixed context ranges per split, min_split_blocks: the fewest blocks per
        split with split_visible (8); decode decode_stages,
        pdl (programmatic dependent launch; default VLLM_MINIMAX_M3_PDL),
        decode_warps, tile_blocks (sparse blocks per key load); rank_select:
        the top-k by rank in one pass, decode rows and the prefill splits'
        candidates, default for rows of at most 64 entries; radix_select: the
        decode top-k by a bitwise threshold search, default in the select
        launch for rows of 65-256 entries; select_warps: that launch's warps;
        see ``decode_select``); on an H100/H200 the prefill tokens run the Gluon
        scoring kernel and a select launch (``index_score_prefill_sm90``) where
        it covers the launch: sm90 (False: the tl kernel, as does any of
        ``TL_PREFILL_TUNES`` or ``context_splits``), sm90_splits (programs per
        tile), sm90_warps (16 query rows each, a multiple of 4), sm90_buffers
        (key tiles in flight + 1), sm90_maxnreg (0: ptxas picks the registers),
        sm90_select ("rank", "bitonic", "radix", "argmax": ``select_score_rows``),
        sm90_select_piece, sm90_select_warps.
    Returns: [T, H_idx, topk] int32 block ids, left-packed, -1 padded (or
    the block scores, with ``return_scores``).
    """
    _validate(idx_q, idx_k_cache, block_table, token_req, token_pos, sparse_block,
              topk, local_blocks, init_blocks, idx_k_scales)
    device = idx_q.device
    check_triton(device)
    T, H, D = idx_q.shape
    page_size = idx_k_cache.shape[1]
    if out is None:
        out = torch.empty((T, H, topk), dtype=torch.int32, device=device)
    elif out.shape != (T, H, topk) or out.dtype != torch.int32 or out.stride(2) != 1:
        raise ValueError(f"out must be int32 [{T}, {H}, {topk}] contiguous in the last dim")
    if T == 0:
        return out if not return_scores else torch.empty((0, H, 1), dtype=torch.float32,
                                                         device=device)
    if max_context is None:
        max_context = block_table.shape[1] * page_size
    max_blocks = max(cdiv(max_context, sparse_block), 1)
    if num_decode_tokens is None:
        num_decode_tokens = T if T <= block_table.shape[0] else 0
    nd = max(0, min(int(num_decode_tokens), T))
    if return_scores and (nd != T or max_blocks > SELECT_MAX_BLOCKS or fused_select):
        raise ValueError(
            f"return_scores needs a decode batch (num_decode_tokens == {T}, got {nd}) of at "
            f"most {SELECT_MAX_BLOCKS} sparse blocks per row (max_context {max_context} gives "
            f"{max_blocks}) and no fused_select; otherwise take the top-k ids")

    k_scaled = idx_k_scales is not None
    ks = idx_k_scales if k_scaled else idx_k_cache  # dummy pointer when unused
    s_sp, s_ss = (ks.stride(0), ks.stride(1)) if k_scaled else (0, 0)
    ieee = idx_q.dtype == torch.float32
    D_PAD = max(16, next_pow2(D))
    BLOCK_N = largest_pow2_divisor(sparse_block, 128)
    if BLOCK_N < 16:
        raise ValueError(f"sparse_block ({sparse_block}) must be divisible by 16")
    TOPK_PAD = next_pow2(topk)
    sms = num_sms(device)
    tune = launch_tune("index")

    if nd > 0:
        dec_stages = 0  # plain loop over a program's blocks
        tile_blocks = 1  # sparse blocks per key load
        if blocks_per_prog is None:
            # enough programs to fill the GPU at batch 1, few at large batch
            # measured on H200 (docs/decisions/0002-decode-index-and-top-k.md): 1 block
            # per program
            # up to ~8k blocks in flight, 2 beyond (b32 x 128k: 255 vs 275 us
            # with 16); more blocks per program only lengthens the tail
            bpp = 2 if nd * max_blocks >= 16384 else 1
            if k_scaled and not ieee and nd * max_blocks >= 8192 and BLOCK_N == sparse_block:
                # fp8 index keys, 16 KiB per 128-token block: 8 blocks per
                # program, two per key load (32 KiB, as one bf16 block), a
                # 2-stage pipelined walk (H200, index + top-k: b32 128k
                # 151.5 vs 161.4 us, 32k 54.0 vs 56.6; at 8k it loses, 22.9 vs
                # 21.5; docs/decisions/0002-decode-index-and-top-k.md)
                bpp, dec_stages, tile_blocks = 8, 2, 2
            elif k_scaled and not ieee and nd * max_blocks >= 2048:
                # 4 blocks per program with a 3-stage pipelined walk (H200, b32:
                # 162 vs 196 us at 128k, 57 vs 62 at 32k, 23 vs 26 at 8k;
                # docs/decisions/0002-decode-index-and-top-k.md)
                bpp, dec_stages = 4, 3
        else:
            bpp = int(blocks_per_prog)
        tile_blocks = int(tune.get("tile_blocks", tile_blocks))
        if tile_blocks > 1 and (tile_blocks & (tile_blocks - 1) or BLOCK_N != sparse_block
                                or bpp % tile_blocks):
            raise ValueError(f"tile_blocks ({tile_blocks}) must be a power of two dividing "
                             f"blocks_per_prog ({bpp}), with sparse_block ({sparse_block}) "
                             f"at most 128 and a power of two")
        H_PAD = max(16, next_pow2(H))
        pdl = use_pdl(device, tune, nd)
        pdl_kw = {"launch_pdl": True} if pdl else {}
        scores = torch.empty((nd, H, max_blocks), dtype=torch.float32, device=device)
        grid = (cdiv(max_blocks, bpp), nd)
        chunk = select_chunk or min(next_pow2(max_blocks), 2048)
        counters = arrival_counters(device, "index_select", nd) if fused_select else scores
        # (the rank pass as a runtime loop over transposed tiles was slower still, run
        # 12: 30.7 vs 20.8 us at 1 x 32k, 106 vs 30 at 1 x 128k, removed)
        rank, radix, select_warps = decode_select(chunk, max_blocks, fused_select, tune)
        rank_cols = min(chunk, max(16, 4096 // chunk))
        index_block_max_decode_kernel[grid](
            idx_q, idx_k_cache, ks, block_table, token_req, token_pos, scores,
            out, counters,
            0, max_blocks,
            idx_q.stride(0), idx_q.stride(1),
            idx_k_cache.stride(0), idx_k_cache.stride(1),
            s_sp, s_ss,
            block_table.stride(0),
            scores.stride(0), scores.stride(1),
            out.stride(0), out.stride(1),
            H=H, H_PAD=H_PAD, D=D, D_PAD=D_PAD,
            SPARSE_BLOCK=sparse_block, BLOCK_N=BLOCK_N,
            BLOCKS_PER_PROG=bpp, PAGE_SIZE=page_size,
            LOCAL=local_blocks, INIT=init_blocks,
            K_SCALED=k_scaled, IEEE=ieee,
            FUSED_SELECT=fused_select, TOPK=topk, TOPK_PAD=TOPK_PAD, CHUNK=chunk,
            SINGLE_CHUNK=max_blocks <= chunk,
            DEC_STAGES=tune.get("decode_stages", dec_stages), PDL=pdl, TILE_BLOCKS=tile_blocks,
            RANK=rank, RANK_COLS=rank_cols, RADIX=radix,
            num_warps=tune.get("decode_warps", 4), **pdl_kw,
        )
        if return_scores:
            return scores
        if not fused_select:
            block_topk_select_kernel[(nd, H)](
                scores, scores, token_pos, out,
                0, max_blocks,
                scores.stride(0), scores.stride(1),
                out.stride(0), out.stride(1),
                TOPK=topk, TOPK_PAD=TOPK_PAD, CHUNK=chunk,
                SPARSE_BLOCK=sparse_block, HAS_IDS=False, VALID_FROM_POS=True,
                SINGLE_CHUNK=max_blocks <= chunk, PDL=pdl,
                RANK=rank, RANK_COLS=rank_cols, RADIX=radix,
                num_warps=select_warps, **pdl_kw,
            )

    npf = T - nd
    if npf > 0:
        if (index_block_max_prefill_sm90_kernel is not None and context_splits is None
                and bool(tune.get("sm90", not TL_PREFILL_TUNES.intersection(tune)))
                and sm90_index_supported(idx_q, idx_k_cache, k_scaled, sparse_block, page_size,
                                         T, H, max_blocks)):
            _prefill_index_sm90(idx_q, idx_k_cache, block_table, token_req, token_pos, out,
                                nd, T, sparse_block, topk, local_blocks, init_blocks,
                                max_blocks, sms, tune)
            return out
        # 128 query rows per tile: on the H200 (the benchmark's sweep,
        # 2026-11-30) 14-17% faster than 64 for an 8192-token chunk at 32k and
        # 128k context (255 vs 298 us, 937 vs 1126 us); 8 warps are slower
        BLOCK_M = tune.get("BLOCK_M", 128 if D_PAD <= 128 else 32)
        tiles = cdiv(npf, BLOCK_M)
        # the next block's pages resolved one block ahead: 10-11% faster on the
        # H200 for an 8192-token chunk at 32k and 128k context (228 vs 255 us,
        # 835 vs 936 us; docs/decisions/0004-prefill-index.md); it needs
        # one key tile per sparse block (sparse blocks up to 128 tokens)
        prefetch_rows = bool(tune.get("prefetch_rows", BLOCK_N == sparse_block))
        if prefetch_rows and BLOCK_N != sparse_block:
            raise ValueError(f"prefetch_rows needs one key tile per sparse block "
                             f"(sparse_block {sparse_block} > {BLOCK_N})")
        # splits of the context: by default each tile's programs divide the
        # blocks its rows see (SPLIT_VISIBLE); else (``split_visible=False``, or
        # ``context_splits`` alone) fixed ranges of ``max_blocks / splits``, sized
        # by the block table: as wide as the engine's longest context, they leave
        # a shorter context's blocks to the first splits (H200, 8192-token
        # chunk, table for 128k: 74 vs 188 us at 8k context, 203 vs 672 at 32k;
        # equal when the table is as wide as the context)
        if "context_splits" in tune:  # benchmarking: a fixed split count
            context_splits = int(tune["context_splits"])
        split_visible = bool(tune.get("split_visible", context_splits is None))
        if context_splits is None:
            splits = 1
            while (splits < 64 and tiles * H * splits * 2 <= 2 * sms
                   and cdiv(max_blocks, splits * 2) >= 8):
                splits *= 2
        else:
            splits = max(1, min(int(context_splits), max_blocks))
        bps = cdiv(max_blocks, splits)
        splits = cdiv(max_blocks, bps)
        split_visible = split_visible and splits > 1
        min_split_blocks = int(tune.get("min_split_blocks", 8))
        if min_split_blocks < 1:
            raise ValueError(f"min_split_blocks must be at least 1, got {min_split_blocks}")
        common = dict(
            D=D, D_PAD=D_PAD, TOPK=topk, TOPK_PAD=TOPK_PAD,
            SPARSE_BLOCK=sparse_block, BLOCK_N=BLOCK_N, BLOCK_M=BLOCK_M,
            PAGE_SIZE=page_size, LOCAL=local_blocks, INIT=init_blocks,
            SPLITS=splits, K_SCALED=k_scaled, IEEE=ieee,
            PREFETCH_ROWS=prefetch_rows,
            SPLIT_VISIBLE=split_visible,
            MIN_SPLIT_BLOCKS=min_split_blocks,
            # no per-element causal mask on blocks every row of the tile sees
            # in full: H200, 8192-token chunk, 740 vs 836 us at 128k,
            # 209 vs 229 at 32k (docs/decisions/0004-prefill-index.md)
            SKIP_FULL_MASK=bool(tune.get("skip_full_mask", True)) and prefetch_rows,
            num_warps=tune.get("num_warps", 4),
            num_stages=tune.get("num_stages", 2),
        )
        args = (idx_q.stride(0), idx_q.stride(1),
                idx_k_cache.stride(0), idx_k_cache.stride(1),
                s_sp, s_ss, block_table.stride(0))
        grid = (tiles, H, splits)
        if splits == 1:
            index_topk_prefill_kernel[grid](
                idx_q, idx_k_cache, ks, block_table, token_req, token_pos,
                out, out, nd, T, bps, *args, out.stride(0), out.stride(1), **common)
        else:
            cand_v = torch.empty((T, H, splits * topk), dtype=torch.float32, device=device)
            cand_i = torch.empty((T, H, splits * topk), dtype=torch.int32, device=device)
            index_topk_prefill_kernel[grid](
                idx_q, idx_k_cache, ks, block_table, token_req, token_pos,
                cand_i, cand_v, nd, T, bps, *args, cand_v.stride(0), cand_v.stride(1),
                **common)
            mchunk = select_chunk or min(next_pow2(splits * topk), 1024)
            # the splits' candidates ranked in one pass (the decode rule: rows of
            # at most 64 entries, i.e. 4 splits of top-16)
            mrank = (bool(tune.get("rank_select", mchunk <= 64))
                     and splits * topk <= mchunk <= 256)
            block_topk_select_kernel[(npf, H)](
                cand_v, cand_i, token_pos, out,
                nd, splits * topk,
                cand_v.stride(0), cand_v.stride(1),
                out.stride(0), out.stride(1),
                TOPK=topk, TOPK_PAD=TOPK_PAD, CHUNK=mchunk,
                SPARSE_BLOCK=sparse_block, HAS_IDS=True, VALID_FROM_POS=False,
                SINGLE_CHUNK=splits * topk <= mchunk,
                RANK=mrank, RANK_COLS=min(mchunk, max(16, 4096 // mchunk)),
                num_warps=_select_warps(mchunk),
            )
    return out


def _prefill_index_sm90(idx_q, idx_k_cache, block_table, token_req, token_pos, out, nd, T,
                        sparse_block, topk, local_blocks, init_blocks, max_blocks, sms, tune):
    """The prefill tokens ``[nd, T)`` on an H100/H200: block scores by the Gluon
    kernel (``index_score_prefill_sm90``) into a [T, H, max_blocks] buffer, then
    the top-k of each row (``select_score_rows``)."""
    H = idx_q.shape[1]
    npf = T - nd
    warps = int(tune.get("sm90_warps", SM90_INDEX_WARPS))  # 16 query rows per warp
    BLOCK_M = 16 * warps
    tiles = cdiv(npf, BLOCK_M)
    # splits of the blocks each tile sees, enough programs for about four per SM
    splits = int(tune.get("sm90_splits", 0))
    if splits < 1:
        splits = 1
        while splits < 16 and tiles * H * splits < 4 * sms and cdiv(max_blocks, splits * 2) >= 8:
            splits *= 2
    scores = torch.empty((T, H, max_blocks), dtype=torch.float32, device=idx_q.device)
    # two programs of 8 warps per SM need at most 128 registers (0: ptxas decides)
    maxnreg = int(tune.get("sm90_maxnreg", SM90_INDEX_REGISTERS if warps == 8 else 0))
    index_block_max_prefill_sm90_kernel[(tiles, H, splits)](
        idx_q, idx_k_cache, block_table, token_req, token_pos, scores,
        nd, T,
        idx_q.stride(0), idx_q.stride(1),
        idx_k_cache.stride(0), idx_k_cache.stride(1),
        block_table.stride(0),
        scores.stride(0), scores.stride(1),
        D=idx_q.shape[2], SPARSE_BLOCK=sparse_block, BLOCK_M=BLOCK_M,
        PAGE_SIZE=idx_k_cache.shape[1], LOCAL=local_blocks, INIT=init_blocks,
        SPLITS=splits, MIN_SPLIT_BLOCKS=int(tune.get("min_split_blocks", 8)),
        NUM_BUF=int(tune.get("sm90_buffers", 2)),
        num_warps=warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    select_score_rows(scores, token_pos, out, nd, sparse_block, topk, tune)


def select_score_rows(scores: torch.Tensor, token_pos: torch.Tensor, out: torch.Tensor, nd: int,
                      sparse_block: int, topk: int, tune: Mapping) -> None:
    """The top-k blocks of the score rows ``[nd, T)`` of ``scores`` [T, H, NB]
    float32 (columns up to each token's own block written, +inf = forced) into
    ``out`` [T, H, topk] (left-packed, -1 padded; ties to the lower block).
    Rows of at most 64 blocks are ranked in one pass ("rank"); longer rows by
    bitonic top-k over the visible columns in pieces of 128 ("bitonic"), so
    the work follows the context, not the block table's width; or
    (the launch override ``sm90_select``) over the whole row by a bitwise threshold search
    ("radix": 10% faster where the table is as wide as the context, 2x slower
    at 8k context in a 128k table) or by arg-max rounds ("argmax"). H200 run
    54 also timed each 64-column segment ranked, then the candidates: slower
    (128k: 179 against 98 us), not kept."""
    T, H, nb = scores.shape
    npf = T - nd
    topk_pad = next_pow2(topk)
    chunk = next_pow2(nb)
    mode = tune.get("sm90_select", "rank" if chunk <= 64 else "bitonic")
    if mode not in ("rank", "bitonic", "radix", "argmax"):
        raise ValueError(f"sm90_select must be rank, bitonic, radix or argmax, got {mode!r}")
    if mode == "bitonic":
        # pieces of 128 columns, one warp: H200, 8192 rows x 1024 blocks
        # (128k): 96-99 us against 110 (256) and 135 (256, 4 warps); 32k 25.4-25.8
        piece = int(tune.get("sm90_select_piece", min(chunk, 128)))
        block_topk_bitonic_kernel[(npf, H)](
            scores, token_pos, out,
            nd, nb,
            scores.stride(0), scores.stride(1),
            out.stride(0), out.stride(1),
            TOPK=topk, TOPK_PAD=topk_pad, PIECE=piece, SPARSE_BLOCK=sparse_block,
            num_warps=int(tune.get("sm90_select_warps", 1)),
        )
        return
    if mode == "rank" and chunk > 256:
        raise ValueError(f"sm90_select 'rank' ranks rows of at most 256 blocks, got {nb}")
    block_topk_select_kernel[(npf, H)](
        scores, scores, token_pos, out,
        nd, nb,
        scores.stride(0), scores.stride(1),
        out.stride(0), out.stride(1),
        TOPK=topk, TOPK_PAD=topk_pad, CHUNK=chunk,
        SPARSE_BLOCK=sparse_block, HAS_IDS=False, VALID_FROM_POS=True, SINGLE_CHUNK=True,
        RANK=mode == "rank", RANK_COLS=min(chunk, max(16, 4096 // chunk)),
        RADIX=mode == "radix",
        num_warps=int(tune.get("sm90_select_warps", 1 if chunk <= 256 else 4)),
    )


__all__ = ["index_block_topk"]
