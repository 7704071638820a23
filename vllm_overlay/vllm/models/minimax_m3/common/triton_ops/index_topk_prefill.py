# SPDX-License-Identifier: Apache-2.0
"""Prefill / chunked-prefill index scoring fused with a streaming block top-k.

One program handles a tile of ``BLOCK_M`` consecutive query tokens for one
index head and (optionally) one split of the context (``SPLITS`` programs
along axis 2, split ``c`` covering sparse blocks ``[c*bps, (c+1)*bps)``).
For every visible sparse block it computes the block score of each row -- the
max over keys ``j <= token_pos`` of fp32 ``dot(idx_q, idx_k)`` -- and inserts
it into a per-row running top-k set kept in registers (replace-the-minimum),
so the ``[T, num_blocks]`` score matrix is never materialised.  Forced blocks
(own block, ``LOCAL - 1`` preceding ones, the first ``INIT``) score +inf.

With ``SKIP_FULL_MASK`` the per-element causal mask is skipped (a branch on
a scalar) for blocks that end at or before the earliest position of the
request's rows in the tile -- all but the last few blocks of a long context.

With ``SPLIT_VISIBLE`` the ``SPLITS`` programs of a tile divide the blocks
each of its requests sees, at least ``MIN_SPLIT_BLOCKS`` each, instead of
fixed ranges of ``blocks_per_split`` sized by the block table: an engine's
table is as wide as its longest allowed context, and fixed ranges would give
a shorter context's blocks to the first few splits only.

With ``PREFETCH_ROWS`` (one key tile per sparse block) the block-table
lookups of the next block are issued before this block's keys are scored, so
their latency overlaps the math (Triton's pipeliner leaves such data-dependent
loads synchronous).

Rows of a tile may belong to different requests (the tile loops over the
requests present in it, ``min(token_req)..max(token_req)``); this is exact for
any order of ``token_req`` and efficient when a request's tokens are adjacent.

Layouts (element strides, last dim contiguous):
  idx_q        [T, H, D];   idx_k_cache [num_pages, page_size, D]
  idx_k_scales [num_pages, page_size] float32 (K_SCALED, fp8 index keys; the
               dot then runs in fp16, see index_score_decode)
  SPLITS == 1: out_ids [T, H, TOPK] int32, left-packed, -1 padded
  SPLITS  > 1: cand_v / cand_i [T, H, SPLITS * TOPK] (float32 / int32)
               candidates per split, merged by ``block_topk_select_kernel``.
"""

from ._paged import fp16_dot_operand, paged_rows
from ._triton import BATCH_PLACEMENT, tl, triton


@triton.jit
def key_tile_row_max(q, k_ptr, ks_ptr, row, srow, kp, kmask, pos_a, offs_d, dmask,
                     K_SCALED: tl.constexpr, IEEE: tl.constexpr,
                     SKIP_FULL_MASK: tl.constexpr = False, full=False):
    """Per query row, the max over one key tile (cache rows ``row`` [N], key
    positions ``kp`` [N], loaded where ``kmask``) of fp32 ``dot(q, k)``
    (x the key's scale with K_SCALED, scales at ``srow``), counting only keys
    at or before the row's position ``pos_a`` [M] (-1: the row is not
    scored, -inf); [M] float32.  With SKIP_FULL_MASK, ``full`` (a scalar:
    every key of the tile is at or before every scored row's position) skips
    the per-element causal mask."""
    k = tl.load(k_ptr + row[:, None] + offs_d[None, :],
                mask=kmask[:, None] & dmask[None, :], other=0.0)
    if IEEE:
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    if K_SCALED:
        ksc = tl.load(ks_ptr + srow, mask=kmask, other=0.0)
        s = s * ksc[None, :]
    if SKIP_FULL_MASK:
        if not full:
            s = tl.where(kp[None, :] <= pos_a[:, None], s, float("-inf"))
    else:
        s = tl.where(kp[None, :] <= pos_a[:, None], s, float("-inf"))
    return tl.where(pos_a >= 0, tl.max(s, axis=1), float("-inf"))


@triton.jit
def insert_block(run_v, run_i, bmax, b, own_a, offs_k, LOCAL: tl.constexpr, INIT: tl.constexpr):
    """Insert block ``b`` with score ``bmax`` [M] (+inf when forced: the row's
    own block, the LOCAL - 1 before it, the first INIT) into each row's running
    top-k set (replace the minimum); rows of other requests have bmax == -inf
    and are left untouched."""
    forced = (b <= own_a) & ((b > own_a - LOCAL) | (b < INIT))
    new_v = tl.where(forced, float("inf"), bmax)
    cur_min, slot = tl.min(run_v, axis=1, return_indices=True,
                           return_indices_tie_break_left=True)
    sel = (offs_k[None, :] == slot[:, None]) & (new_v > cur_min)[:, None]
    return tl.where(sel, new_v[:, None], run_v), tl.where(sel, b, run_i)


@triton.jit(**BATCH_PLACEMENT)
def index_topk_prefill_kernel(
    q_ptr, k_ptr, ks_ptr, bt_ptr, req_ptr, pos_ptr,
    out_ids_ptr, cand_v_ptr,
    tok_base, tok_end, blocks_per_split,
    stride_qt, stride_qh,
    stride_kp, stride_ks,
    stride_sp, stride_ss,
    stride_bt,
    stride_ot, stride_oh,
    D: tl.constexpr, D_PAD: tl.constexpr,
    TOPK: tl.constexpr, TOPK_PAD: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    PAGE_SIZE: tl.constexpr, LOCAL: tl.constexpr, INIT: tl.constexpr,
    SPLITS: tl.constexpr, K_SCALED: tl.constexpr, IEEE: tl.constexpr,
    PREFETCH_ROWS: tl.constexpr = False, SKIP_FULL_MASK: tl.constexpr = False,
    SPLIT_VISIBLE: tl.constexpr = False, MIN_SPLIT_BLOCKS: tl.constexpr = 8,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)

    rows = tok_base + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < tok_end
    req = tl.load(req_ptr + rows, mask=rmask, other=0)
    pos = tl.load(pos_ptr + rows, mask=rmask, other=-1)
    own = tl.where(rmask, pos // SPARSE_BLOCK, -1)

    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, TOPK_PAD)
    dmask = offs_d < D
    q = tl.load(q_ptr + rows.to(tl.int64)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    if IEEE:
        q = q.to(tl.float32)
    elif K_SCALED:
        q = fp16_dot_operand(q)

    run_v = tl.where(offs_k[None, :] < TOPK, float("-inf"), float("inf")) + tl.zeros([BLOCK_M, TOPK_PAD], tl.float32)
    run_i = tl.full([BLOCK_M, TOPK_PAD], -1, tl.int32)

    r_lo = tl.min(tl.where(rmask, req, 2147483647), axis=0)
    r_hi = tl.max(tl.where(rmask, req, -1), axis=0)
    for r in range(r_lo, r_hi + 1):
        act = rmask & (req == r)
        pos_a = tl.where(act, pos, -1)
        own_a = tl.where(act, own, -1)
        max_pos = tl.max(pos_a, axis=0)
        min_pos = tl.min(tl.where(act, pos, 2147483647), axis=0)
        if SPLIT_VISIBLE:  # this split's share of the blocks the request's rows see
            seen = tl.max(own_a, axis=0) + 1
            per_split = tl.maximum(tl.cdiv(seen, SPLITS), MIN_SPLIT_BLOCKS)
            b_lo = split * per_split
            b_hi = tl.minimum(seen, b_lo + per_split)
        else:
            b_lo = split * blocks_per_split
            b_hi = tl.minimum(tl.max(own_a, axis=0) + 1, b_lo + blocks_per_split)
        bt_row = bt_ptr + r * stride_bt
        if PREFETCH_ROWS:
            # one key tile per sparse block (BLOCK_N == SPARSE_BLOCK, checked by
            # the wrapper); the next block's pages are resolved one block ahead
            kp = b_lo * SPARSE_BLOCK + offs_n
            kmask = (kp <= max_pos) & (b_lo < b_hi)
            row, srow = paged_rows(bt_row, kp, kmask, stride_kp, stride_ks, stride_sp,
                                   stride_ss, PAGE_SIZE, K_SCALED)
            for b in range(b_lo, b_hi):
                kp_n = kp + SPARSE_BLOCK
                kmask_n = (kp_n <= max_pos) & (b + 1 < b_hi)
                row_n, srow_n = paged_rows(bt_row, kp_n, kmask_n, stride_kp, stride_ks,
                                           stride_sp, stride_ss, PAGE_SIZE, K_SCALED)
                full = (b + 1) * SPARSE_BLOCK <= min_pos + 1
                bmax = key_tile_row_max(q, k_ptr, ks_ptr, row, srow, kp, kmask, pos_a,
                                        offs_d, dmask, K_SCALED, IEEE, SKIP_FULL_MASK, full)
                run_v, run_i = insert_block(run_v, run_i, bmax, b, own_a, offs_k, LOCAL, INIT)
                kp, kmask, row, srow = kp_n, kmask_n, row_n, srow_n
        else:
            for b in range(b_lo, b_hi):
                bmax = tl.full([BLOCK_M], float("-inf"), tl.float32)
                for n0 in tl.static_range(0, SPARSE_BLOCK, BLOCK_N):
                    kp = b * SPARSE_BLOCK + n0 + offs_n
                    kmask = kp <= max_pos
                    row, srow = paged_rows(bt_row, kp, kmask, stride_kp, stride_ks, stride_sp,
                                           stride_ss, PAGE_SIZE, K_SCALED)
                    bmax = tl.maximum(bmax, key_tile_row_max(
                        q, k_ptr, ks_ptr, row, srow, kp, kmask, pos_a, offs_d, dmask,
                        K_SCALED, IEEE))
                run_v, run_i = insert_block(run_v, run_i, bmax, b, own_a, offs_k, LOCAL, INIT)

    omask = rmask[:, None] & (offs_k[None, :] < TOPK)
    if SPLITS == 1:
        optr = out_ids_ptr + rows.to(tl.int64)[:, None] * stride_ot + h * stride_oh + offs_k[None, :]
        tl.store(optr, run_i, mask=omask)
    else:
        # candidate buffers: [T, H, SPLITS * TOPK], ids stored in out_ids_ptr
        base = rows.to(tl.int64)[:, None] * stride_ot + h * stride_oh + split * TOPK + offs_k[None, :]
        tl.store(cand_v_ptr + base, run_v, mask=omask)
        tl.store(out_ids_ptr + base, run_i, mask=omask)
