# SPDX-License-Identifier: Apache-2.0
"""Prefill index scoring for Hopper (sm_90), in Gluon: per-block maxima.

One program scores ``BLOCK_M`` consecutive query tokens of one index head
against its split of the sparse blocks their request sees, and writes the
rows' block scores in the decode path's layout (``index_score_decode``):
``scores[t, h, b]`` = max over keys ``j <= token_pos[t]`` of block ``b`` of
fp32 ``dot(idx_q[t, h], idx_k[j])``, +inf for forced blocks (the own block,
the ``LOCAL - 1`` before it, the first ``INIT``), written for ``b <= own``
only.  The top-k is then ``block_topk_select_kernel`` (``VALID_FROM_POS``),
as for decode tokens.

What it does that the ``tl`` kernel (``index_topk_prefill``, a streaming
top-k in registers: 255 registers with spills at its launch shape) does not:

- the query tile is copied once into shared memory and every score product
  is a warpgroup MMA from shared memory (``NUM_WARPS // 4`` warpgroups of 64
  rows), so no register holds a query;
- each block's keys arrive by ``cp.async`` into a ring of ``NUM_BUF``
  shared-memory tiles, ``NUM_BUF - 1`` blocks ahead, the copy issued while
  the current block's MMA runs and its pages looked up an iteration before;
- no top-k state in registers: a step is an MMA, a row max and one store per
  row, small enough for two programs per SM, one's MMA running while the
  other reduces.

Splits (``SPLITS`` programs along grid axis 2): each divides the blocks its
request's rows see, at least ``MIN_SPLIT_BLOCKS`` each (the ``tl`` kernel's
``SPLIT_VISIBLE``).  Rows of a tile may belong to several requests; the
program walks each request present in the tile in turn (exact for any
order, efficient when a request's tokens are adjacent).  Keys after the
request's last row in the tile are never copied (zero-filled), and the
per-element causal mask is applied only to blocks some row sees in part.

Layouts (element strides, last dim contiguous): ``idx_q`` [T, H, D] bf16 or
fp16; ``idx_k`` [num_pages, page_size, D] the same dtype; ``block_table``
[R, max_pages] int32; ``token_req`` / ``token_pos`` [T] int32; ``scores``
[T, H, NB] float32.  ``D == SPARSE_BLOCK == 128`` is the shape the H200
runs check (``sm90_index_supported``).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ._triton import BATCH_PLACEMENT
from ._utils import is_sm90
from .sparse_attn_block_major_sm90 import row_tile_layout

NUM_WARPS = 8  # two warpgroups, 64 query rows each
# registers per thread: two programs per SM (2 x 256 threads x 128 = the SM's 64K);
# ptxas fits the kernel in 112 without spills (sm90_compile.py), in 138 if left free
MAX_REGISTERS = 128

# the score buffer a launch may allocate; beyond it the tl kernel's streaming
# top-k (no buffer) runs instead
SCORE_BUFFER_BYTES = 256 << 20
# the widest row the select kernel ranks in registers (one chunk)
MAX_SCORED_BLOCKS = 2048


@gluon.jit(**BATCH_PLACEMENT)
def index_block_max_prefill_sm90_kernel(
    q_ptr, k_ptr, bt_ptr, req_ptr, pos_ptr, scores_ptr,
    tok_base, tok_end,
    stride_qt, stride_qh,
    stride_kp, stride_ks,
    stride_bt,
    stride_st, stride_sh,
    D: gl.constexpr, SPARSE_BLOCK: gl.constexpr, BLOCK_M: gl.constexpr,
    PAGE_SIZE: gl.constexpr, LOCAL: gl.constexpr, INIT: gl.constexpr,
    SPLITS: gl.constexpr, MIN_SPLIT_BLOCKS: gl.constexpr, NUM_BUF: gl.constexpr,
):
    gl.static_assert(NUM_BUF >= 2, "a ring of at least two key tiles")
    gl.static_assert(BLOCK_M == 16 * gl.num_warps(), "16 rows per warp (64 per warpgroup)")
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0],
                                                  warps_per_cta=[gl.num_warps(), 1],
                                                  instr_shape=[16, SPARSE_BLOCK, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    tile: gl.constexpr = row_tile_layout(D, gl.num_warps())
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SPARSE_BLOCK, D], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_sl)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, SPARSE_BLOCK, D], k_sl)

    pid_m = gl.program_id(0)
    h = gl.program_id(1)
    split = gl.program_id(2)
    row0 = tok_base + pid_m * BLOCK_M

    # the query tile, one commit group (the first step's wait covers it)
    rows_c = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, tile))
    offs_dc = gl.arange(0, D, layout=gl.SliceLayout(0, tile))
    async_copy.async_copy_global_to_shared(
        q_smem, q_ptr + (rows_c.to(gl.int64) * stride_qt + h * stride_qh)[:, None]
        + offs_dc[None, :], mask=(rows_c < tok_end)[:, None])
    async_copy.commit_group()

    rows = row0 + gl.arange(0, BLOCK_M, layout=rows_l)
    rmask = rows < tok_end
    req = gl.load(req_ptr + rows, mask=rmask, other=0)
    pos = gl.load(pos_ptr + rows, mask=rmask, other=-1)
    own = gl.where(rmask, pos // SPARSE_BLOCK, -1)
    srow = scores_ptr + rows.to(gl.int64) * stride_st + h * stride_sh
    keys0 = gl.arange(0, SPARSE_BLOCK, layout=cols_l)

    r_lo = gl.min(gl.where(rmask, req, 2147483647), axis=0)
    r_hi = gl.max(gl.where(rmask, req, -1), axis=0)
    for r in range(r_lo, r_hi + 1):
        act = rmask & (req == r)
        pos_a = gl.where(act, pos, -1)
        own_a = gl.where(act, own, -1)
        max_pos = gl.max(pos_a, axis=0)
        min_pos = gl.min(gl.where(act, pos, 2147483647), axis=0)
        # this split's share of the blocks the request's rows see
        seen = gl.max(own_a, axis=0) + 1
        per_split = gl.maximum(gl.cdiv(seen, SPLITS), MIN_SPLIT_BLOCKS)
        b_lo = split * per_split
        nblk = gl.maximum(gl.minimum(seen, b_lo + per_split) - b_lo, 0)
        bt_row = bt_ptr + r * stride_bt

        for jj in gl.static_range(NUM_BUF - 1):
            page, kload = key_pages(bt_row, b_lo + jj, max_pos, jj < nblk, SPARSE_BLOCK,
                                    PAGE_SIZE, tile)
            copy_key_tile(k_ptr, k_smem.index(jj), b_lo + jj, page, kload, stride_kp, stride_ks,
                          D, SPARSE_BLOCK, PAGE_SIZE, tile)
        # the pages of the block the first iteration sends for
        page, kload = key_pages(bt_row, b_lo + NUM_BUF - 1, max_pos, NUM_BUF - 1 < nblk,
                                SPARSE_BLOCK, PAGE_SIZE, tile)
        for i in range(nblk):
            b = b_lo + i
            # block i's keys (and, first, the query tile) landed, visible to the
            # MMA; every warp is past block i - 1's MMA, whose ring slot refills
            async_copy.wait_group(NUM_BUF - 2)
            fence_async_shared()
            gl.thread_barrier()
            s_tok = warpgroup_mma(q_smem, k_smem.index(i % NUM_BUF).permute((1, 0)),
                                  gl.zeros([BLOCK_M, SPARSE_BLOCK], gl.float32, mma),
                                  use_acc=False, is_async=True)
            # while it runs: the copy of block i + NUM_BUF - 1 (its rows resolved an
            # iteration ago), and the page lookups of the block after it
            nxt = i + NUM_BUF - 1
            copy_key_tile(k_ptr, k_smem.index(nxt % NUM_BUF), b_lo + nxt, page, kload, stride_kp,
                          stride_ks, D, SPARSE_BLOCK, PAGE_SIZE, tile)
            page, kload = key_pages(bt_row, b_lo + nxt + 1, max_pos, nxt + 1 < nblk,
                                    SPARSE_BLOCK, PAGE_SIZE, tile)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
            if (b + 1) * SPARSE_BLOCK <= min_pos + 1:  # every row sees the whole block
                bmax = gl.max(s, axis=1)
            else:
                keys = b * SPARSE_BLOCK + keys0
                bmax = gl.max(gl.where(keys[None, :] <= pos_a[:, None], s, float("-inf")),
                              axis=1)
            forced = (b <= own_a) & ((b > own_a - LOCAL) | (b < INIT))
            gl.store(srow + b, gl.where(forced, float("inf"), bmax), mask=act & (b <= own_a))
        # the ring is empty before the next request primes it
        async_copy.wait_group(0)
        gl.thread_barrier()


@gluon.jit
def key_pages(bt_row, b, max_pos, live, SPARSE_BLOCK: gl.constexpr, PAGE_SIZE: gl.constexpr,
              layout: gl.constexpr):
    """The pages (int32 [SPARSE_BLOCK], in the copy layout's row slice) of
    block ``b``'s keys, and which keys to copy: those up to ``max_pos``,
    none unless ``live``."""
    kp = b * SPARSE_BLOCK + gl.arange(0, SPARSE_BLOCK, layout=gl.SliceLayout(1, layout))
    kload = (kp <= max_pos) & live
    return gl.load(bt_row + kp // PAGE_SIZE, mask=kload, other=0), kload


@gluon.jit
def copy_key_tile(k_ptr, dst, b, page, kload, stride_kp, stride_ks, D: gl.constexpr,
                  SPARSE_BLOCK: gl.constexpr, PAGE_SIZE: gl.constexpr, layout: gl.constexpr):
    """``cp.async`` of block ``b``'s index keys (on ``page``, from ``key_pages``)
    into ``dst`` [SPARSE_BLOCK, D], keys not ``kload`` zero-filled; one commit
    group (an empty one when nothing is copied, so the ring counts one group
    per block)."""
    in_page = gl.arange(0, SPARSE_BLOCK, layout=gl.SliceLayout(1, layout)) % PAGE_SIZE
    row = page.to(gl.int64) * stride_kp + in_page.to(gl.int64) * stride_ks
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    async_copy.async_copy_global_to_shared(dst, k_ptr + row[:, None] + offs_d[None, :],
                                           mask=kload[:, None])
    async_copy.commit_group()


def sm90_index_supported(idx_q: torch.Tensor, idx_k_cache: torch.Tensor, k_scaled: bool,
                         sparse_block: int, page_size: int, rows: int, heads: int,
                         max_blocks: int) -> bool:
    """Whether the prefill index runs ``index_block_max_prefill_sm90_kernel``
    (then ``indexer.select_score_rows``) for this launch: an sm_90 CUDA device
    and ``sm90_index_fits``."""
    if not is_sm90(idx_q.device):
        return False
    return sm90_index_fits(idx_q.dtype, idx_k_cache.dtype, k_scaled, idx_q.shape[-1],
                           sparse_block, page_size, rows, heads, max_blocks)


def sm90_index_fits(q_dtype: torch.dtype, k_dtype: torch.dtype, k_scaled: bool, dim: int,
                    sparse_block: int, page_size: int, rows: int, heads: int,
                    max_blocks: int) -> bool:
    """The launches the sm_90 prefill index covers: bf16 / fp16 index queries
    and keys of one dtype (no fp8 index keys), index dim 128 = sparse block
    (the shape the H200 runs check), pages that tile a block, rows of at most
    ``MAX_SCORED_BLOCKS`` blocks and a score buffer ([rows, heads, max_blocks]
    float32) of at most ``SCORE_BUFFER_BYTES``."""
    return (q_dtype in (torch.bfloat16, torch.float16) and k_dtype == q_dtype and not k_scaled
            and dim == sparse_block == 128 and sparse_block % page_size == 0
            and max_blocks <= MAX_SCORED_BLOCKS
            and rows * heads * max_blocks * 4 <= SCORE_BUFFER_BYTES)


__all__ = ["MAX_REGISTERS", "MAX_SCORED_BLOCKS", "NUM_WARPS", "SCORE_BUFFER_BYTES",
           "index_block_max_prefill_sm90_kernel", "sm90_index_fits", "sm90_index_supported"]
