# SPDX-License-Identifier: Apache-2.0
"""Group a prefill chunk's (token, selection slot) pairs by selected block, on
the device, for ``sparse_attn_block_major``: a counting sort in two launches.

A pair's group is ``(request, KV head, block)``, numbered
``key = (req * HKV + kv_head) * MAX_BLOCKS + block`` (``NG`` groups; empty
slots, block -1, belong to none).  SPLIT_MASKED: each group in two,
``2 * key + masked``, where ``masked`` says the token does not see the whole
block (its position is before the block's last key): the pairs of the
unmasked halves, nearly all of a long chunk's, then need no causal mask.

  block_major_rank_kernel     counts the pairs of each group (``counts[key]``
                              by atomic add) and keeps each pair's rank in its
                              group: the value the add returned.  AGGREGATE:
                              the program first sorts its BLOCK pairs by group
                              and adds each group's count once (ranks = the
                              returned base + the rank within the program),
                              instead of one add per pair: a chunk's pairs
                              share few groups, whose counters (a few cache
                              lines) otherwise take every pair's add in turn;
  block_major_scatter_kernel  writes each pair to ``group_start[key] + rank``
                              (``group_start``: exclusive prefix sum of counts).

Ranks within a group follow the atomics' order, which varies from run to run;
every row of the block-major attention is computed on its own, so the output
does not depend on it.

Layouts (int32):
  topk      [T, HKV, TOPK] selected block ids (-1 = empty; TOPK contiguous)
  token_req, token_pos [T] (token_pos read with SPLIT_MASKED only)
  pair_key, pair_rank [T * HKV * TOPK]: the group (NG for empty slots) and
            rank of pair ``(t * HKV + kv_head) * TOPK + slot``
  counts, group_start [NG]
  pair_tok, pair_slot [T * HKV * TOPK]: token and slot of each pair, sorted by
            group (the first ``sum(counts)`` entries are written)
"""

from ._triton import BATCH_PLACEMENT, tl, triton


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b)


@triton.jit(**BATCH_PLACEMENT)
def block_major_rank_kernel(
    topk_ptr, req_ptr, pos_ptr, pair_key_ptr, pair_rank_ptr, counts_ptr,
    P, stride_tt, stride_th,
    HKV: tl.constexpr, TOPK: tl.constexpr, MAX_BLOCKS, NG, BLOCK: tl.constexpr,
    AGGREGATE: tl.constexpr, SPLIT_MASKED: tl.constexpr = False, SPARSE_BLOCK: tl.constexpr = 1,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < P
    t = offs // (HKV * TOPK)
    h = (offs // TOPK) % HKV
    slot = offs % TOPK
    blk = tl.load(topk_ptr + t.to(tl.int64) * stride_tt + h * stride_th + slot,
                  mask=live, other=-1)
    req = tl.load(req_ptr + t, mask=live, other=0)
    valid = blk >= 0
    key = (req * HKV + h) * MAX_BLOCKS + blk
    if SPLIT_MASKED:
        pos = tl.load(pos_ptr + t, mask=live, other=0)
        key = 2 * key + (pos < blk * SPARSE_BLOCK + SPARSE_BLOCK - 1).to(tl.int32)
    key = tl.where(valid, key, NG)
    tl.store(pair_key_ptr + offs, key, mask=live)
    if AGGREGATE:
        # sort the program's pairs by (group, position): runs of one group
        i = tl.arange(0, BLOCK)
        packed = tl.sort(key.to(tl.int64) * BLOCK + i)
        key_s = (packed // BLOCK).to(tl.int32)
        src = (packed % BLOCK).to(tl.int32)  # the pair's position in the program
        prev = tl.gather(key_s, tl.maximum(i - 1, 0), 0)
        head = (i == 0) | (key_s != prev)
        run_start = tl.associative_scan(tl.where(head, i, 0), 0, _max_combine)
        # first head at or after each position; a run ends where the next starts
        next_head = tl.associative_scan(tl.where(head, i, BLOCK), 0, _min_combine,
                                        reverse=True)
        run_end = tl.where(i == BLOCK - 1, BLOCK,
                           tl.gather(next_head, tl.minimum(i + 1, BLOCK - 1), 0))
        run_valid = key_s < NG
        base = tl.atomic_add(counts_ptr + key_s, run_end - i, mask=head & run_valid,
                             sem="relaxed")
        rank = tl.gather(base, run_start, 0) + (i - run_start)
        # pairs past P have no group (key NG), so run_valid also masks them
        tl.store(pair_rank_ptr + tl.program_id(0) * BLOCK + src, rank, mask=run_valid)
    else:
        rank = tl.atomic_add(counts_ptr + key, tl.full([BLOCK], 1, tl.int32), mask=valid,
                             sem="relaxed")
        tl.store(pair_rank_ptr + offs, rank, mask=live & valid)


@triton.jit(**BATCH_PLACEMENT)
def block_major_scatter_kernel(
    pair_key_ptr, pair_rank_ptr, group_start_ptr, pair_tok_ptr, pair_slot_ptr,
    P, NG, HKV: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < P
    key = tl.load(pair_key_ptr + offs, mask=live, other=NG)
    valid = key < NG
    rank = tl.load(pair_rank_ptr + offs, mask=valid, other=0)
    dst = tl.load(group_start_ptr + key, mask=valid, other=0) + rank
    tl.store(pair_tok_ptr + dst, offs // (HKV * TOPK), mask=valid)
    tl.store(pair_slot_ptr + dst, offs % TOPK, mask=valid)
