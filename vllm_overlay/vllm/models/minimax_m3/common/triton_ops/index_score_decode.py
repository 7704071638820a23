# SPDX-License-Identifier: Apache-2.0
"""Decode index scoring, stage 1: per-block max score, split over the context.

One program handles one query token and ``BLOCKS_PER_PROG`` consecutive sparse
blocks for *all* index heads, so every index key is read once per token
(index heads share the single index-key head).  The grid is
``(cdiv(max_blocks, BLOCKS_PER_PROG), num_tokens)`` and depends only on static
sizes (max pages of the block table), so the launch is CUDA-graph capturable;
programs past the token's own block do no work.

Layouts (element strides, last dim contiguous):
  idx_q        [T, H, D]             model dtype (fp32/fp16/bf16)
  idx_k_cache  [num_pages, page_size, D]  model dtype, or fp8 e4m3 with
  idx_k_scales [num_pages, page_size] float32 (K_SCALED=True; score *= scale;
               the dot runs in fp16: e4m3 -> fp16 is one conversion per two
               keys' elements, e4m3 -> bf16 three)
  block_table  [R, max_pages] int32, token_req / token_pos [T] int32
  scores (out) [T, H, max_blocks] float32; entry b is written for b <= own
               block only: max over keys j in block b with j <= pos of
               fp32 dot(idx_q, idx_k) (no softmax scale); forced blocks (own,
               ``LOCAL - 1`` preceding ones, the first ``INIT``) get +inf.

FUSED_SELECT (stage 2 in the same launch): each program then increments the
token's arrival counter ``counters[t]`` (int32, zero before the launch); the
program that arrives last reads the token's complete score rows and writes
the top-k block ids to ``sel [T, H, TOPK]`` (as block_topk_select_kernel,
by rank where RANK, by a threshold search where RADIX),
then puts the counter back to 0, so a persistent zeroed buffer stays valid
across launches and CUDA-graph replays.  One launch instead of two.
PDL (programmatic dependent launch, CUDA sm90+; the wrapper launches with
``launch_pdl``): the program lets the next launch start, reads the token's
position, request and index query (written before the previous launch
began), then waits for the previous launch (the cache write) to complete
before it reads any index key or writes anything.
DEC_STAGES > 0 software-pipelines the walk over a program's blocks (tl.range
num_stages; a tuning knob for BLOCKS_PER_PROG > 1), 0 is a plain loop.
TILE_BLOCKS > 1 scores that many consecutive sparse blocks per step with one
[TILE_BLOCKS * SPARSE_BLOCK, D] key load and one dot (needs BLOCK_N ==
SPARSE_BLOCK and BLOCKS_PER_PROG a multiple of TILE_BLOCKS): more bytes in
flight per program between two waits, for fp8 keys (16 KiB per 128-token block).
"""

from ._paged import fp16_dot_operand, paged_rows
from ._triton import tl, tl_cuda, triton
from .index_topk_select import select_topk_row


@triton.jit
def _key_scores(q, k_ptr, ks_ptr, bt_row, kp, pos, offs_d, dmask,
                stride_kp, stride_ks, stride_sp, stride_ss, PAGE_SIZE: tl.constexpr,
                K_SCALED: tl.constexpr, IEEE: tl.constexpr):
    """[H_PAD, N] fp32 scores of the index queries ``q`` against the keys at
    absolute positions ``kp`` [N] (times their scales if K_SCALED); -inf for
    keys after ``pos``."""
    kmask = kp <= pos
    row, srow = paged_rows(bt_row, kp, kmask, stride_kp, stride_ks, stride_sp, stride_ss,
                           PAGE_SIZE, K_SCALED)
    return _key_scores_at(q, k_ptr, ks_ptr, row, srow, kmask, offs_d, dmask, K_SCALED, IEEE)


@triton.jit
def _key_scores_at(q, k_ptr, ks_ptr, row, srow, kmask, offs_d, dmask,
                   K_SCALED: tl.constexpr, IEEE: tl.constexpr):
    """``_key_scores`` from cache row offsets already resolved through the
    block table: ``row`` [N] into the index cache, ``srow`` [N] into its
    scales (K_SCALED only); ``kmask`` [N] the visible keys."""
    k = tl.load(k_ptr + row[:, None] + offs_d[None, :],
                mask=kmask[:, None] & dmask[None, :], other=0.0)
    if IEEE:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    if K_SCALED:
        ksc = tl.load(ks_ptr + srow, mask=kmask, other=0.0)
        s = s * ksc[None, :]
    return tl.where(kmask[None, :], s, float("-inf"))


@triton.jit
def _score_block(q, k_ptr, ks_ptr, bt_row, out_row, b, pos, own, offs_n, offs_d, dmask, hmask,
                 H_PAD: tl.constexpr, stride_kp, stride_ks, stride_sp, stride_ss,
                 SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 LOCAL: tl.constexpr, INIT: tl.constexpr,
                 K_SCALED: tl.constexpr, IEEE: tl.constexpr):
    """Max score of sparse block ``b`` for every index head -> out_row[h, b]."""
    bmax = tl.full([H_PAD], float("-inf"), tl.float32)
    for n0 in tl.static_range(0, SPARSE_BLOCK, BLOCK_N):
        s = _key_scores(q, k_ptr, ks_ptr, bt_row, b * SPARSE_BLOCK + n0 + offs_n, pos, offs_d,
                        dmask, stride_kp, stride_ks, stride_sp, stride_ss, PAGE_SIZE,
                        K_SCALED, IEEE)
        bmax = tl.maximum(bmax, tl.max(s, axis=1))
    forced = (b > own - LOCAL) | (b < INIT)
    bmax = tl.where(forced, float("inf"), bmax)
    tl.store(out_row + b, bmax, mask=hmask)


@triton.jit
def _score_block_tile(q, k_ptr, ks_ptr, bt_row, out_row, b, pos, own, offs_d, dmask, hmask,
                      H_PAD: tl.constexpr, stride_kp, stride_ks, stride_sp, stride_ss,
                      SPARSE_BLOCK: tl.constexpr, TILE_BLOCKS: tl.constexpr,
                      PAGE_SIZE: tl.constexpr, LOCAL: tl.constexpr, INIT: tl.constexpr,
                      K_SCALED: tl.constexpr, IEEE: tl.constexpr):
    """Max scores of sparse blocks ``b .. b + TILE_BLOCKS - 1`` for every index
    head -> out_row[h, blk] for the blocks up to ``own``, from one key load."""
    s = _key_scores(q, k_ptr, ks_ptr, bt_row,
                    b * SPARSE_BLOCK + tl.arange(0, TILE_BLOCKS * SPARSE_BLOCK), pos, offs_d,
                    dmask, stride_kp, stride_ks, stride_sp, stride_ss, PAGE_SIZE, K_SCALED, IEEE)
    bmax = tl.max(tl.reshape(s, [H_PAD, TILE_BLOCKS, SPARSE_BLOCK]), axis=2)
    blk = b + tl.arange(0, TILE_BLOCKS)
    forced = (blk > own - LOCAL) | (blk < INIT)
    bmax = tl.where(forced[None, :], float("inf"), bmax)
    tl.store(out_row[:, None] + blk[None, :], bmax, mask=hmask[:, None] & (blk <= own)[None, :])


@triton.jit
def index_block_max_decode_kernel(
    q_ptr, k_ptr, ks_ptr, bt_ptr, req_ptr, pos_ptr, out_ptr,
    sel_ptr, cnt_ptr,
    tok_base, max_blocks,
    stride_qt, stride_qh,
    stride_kp, stride_ks,
    stride_sp, stride_ss,
    stride_bt,
    stride_ot, stride_oh,
    stride_selt, stride_selh,
    H: tl.constexpr, H_PAD: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCKS_PER_PROG: tl.constexpr, PAGE_SIZE: tl.constexpr,
    LOCAL: tl.constexpr, INIT: tl.constexpr,
    K_SCALED: tl.constexpr, IEEE: tl.constexpr,
    FUSED_SELECT: tl.constexpr = False, TOPK: tl.constexpr = 1,
    TOPK_PAD: tl.constexpr = 1, CHUNK: tl.constexpr = 16, SINGLE_CHUNK: tl.constexpr = True,
    DEC_STAGES: tl.constexpr = 0, PDL: tl.constexpr = False, TILE_BLOCKS: tl.constexpr = 1,
    RANK: tl.constexpr = False, RANK_COLS: tl.constexpr = 16, RADIX: tl.constexpr = False,
):
    if PDL:
        tl_cuda.gdc_launch_dependents()
    pid_c = tl.program_id(0)
    t = tok_base + tl.program_id(1)
    req = tl.load(req_ptr + t)
    pos = tl.load(pos_ptr + t)
    own = pos // SPARSE_BLOCK
    b0 = pid_c * BLOCKS_PER_PROG
    nb = tl.minimum(own - b0 + 1, BLOCKS_PER_PROG)  # <= 0: nothing visible here

    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    hmask = offs_h < H
    dmask = offs_d < D
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)
    if K_SCALED and not IEEE:
        q = fp16_dot_operand(q)
    bt_row = bt_ptr + req.to(tl.int64) * stride_bt
    out_row = out_ptr + t.to(tl.int64) * stride_ot + offs_h * stride_oh
    if PDL:
        tl_cuda.gdc_wait()  # the cache write before this launch is complete

    if TILE_BLOCKS > 1 and DEC_STAGES > 0:  # TILE_BLOCKS blocks per key load
        for i in tl.range(0, nb, TILE_BLOCKS, num_stages=DEC_STAGES):
            _score_block_tile(q, k_ptr, ks_ptr, bt_row, out_row, b0 + i, pos, own, offs_d,
                              dmask, hmask, H_PAD, stride_kp, stride_ks, stride_sp, stride_ss,
                              SPARSE_BLOCK, TILE_BLOCKS, PAGE_SIZE, LOCAL, INIT, K_SCALED, IEEE)
    elif TILE_BLOCKS > 1:
        for i in range(0, nb, TILE_BLOCKS):
            _score_block_tile(q, k_ptr, ks_ptr, bt_row, out_row, b0 + i, pos, own, offs_d,
                              dmask, hmask, H_PAD, stride_kp, stride_ks, stride_sp, stride_ss,
                              SPARSE_BLOCK, TILE_BLOCKS, PAGE_SIZE, LOCAL, INIT, K_SCALED, IEEE)
    elif DEC_STAGES > 0:  # software-pipelined walk over this program's blocks
        for i in tl.range(0, nb, num_stages=DEC_STAGES):
            _score_block(q, k_ptr, ks_ptr, bt_row, out_row, b0 + i, pos, own, offs_n, offs_d,
                         dmask, hmask, H_PAD, stride_kp, stride_ks, stride_sp, stride_ss,
                         SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, LOCAL, INIT, K_SCALED, IEEE)
    else:
        for i in range(0, nb):
            _score_block(q, k_ptr, ks_ptr, bt_row, out_row, b0 + i, pos, own, offs_n, offs_d,
                         dmask, hmask, H_PAD, stride_kp, stride_ks, stride_sp, stride_ss,
                         SPARSE_BLOCK, BLOCK_N, PAGE_SIZE, LOCAL, INIT, K_SCALED, IEEE)

    if FUSED_SELECT:
        # acq_rel: this program's score stores are released before the count,
        # and the last arriver acquires everyone else's
        tl.debug_barrier()  # every thread's stores precede the release
        arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel")
        if arrived == tl.num_programs(0) - 1:
            n_valid = tl.minimum(own + 1, max_blocks)
            t64 = t.to(tl.int64)
            for h in range(H):
                select_topk_row(out_ptr, out_ptr, t64 * stride_ot + h * stride_oh, n_valid,
                                max_blocks,
                                sel_ptr + t64 * stride_selt + h * stride_selh,
                                TOPK, TOPK_PAD, CHUNK, False, SINGLE_CHUNK, True,
                                RANK, RANK_COLS, RADIX)
            tl.atomic_xchg(cnt_ptr + t, 0)
