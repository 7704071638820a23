# SPDX-License-Identifier: Apache-2.0
"""Top-k selection over a row of candidate block scores (index stage 2).

One program per (query token, index head).  It streams the row in chunks of
``CHUNK`` entries, extracts each chunk's best ``TOPK`` entries by repeated
argmax and inserts them into a running top-k set (replace-the-minimum).  The
set is left-packed (empty slots are always the rightmost ones) and -1 padded;
entries equal to -inf are never selected.

Layouts:
  vals [T, H, N] float32 candidate scores (+inf = forced block)
  ids  [T, H, N] int32 block ids (HAS_IDS) -- else the block id is the column
  out  [T, H, TOPK] int32 selected block ids, -1 padded
SINGLE_CHUNK (N <= CHUNK): the extracted entries go straight to their slots.
If VALID_FROM_POS, only columns b <= token_pos // SPARSE_BLOCK are read (the
decode score buffer is only written up to the own block).
RANK (SINGLE_CHUNK only): no chain of TOPK arg-max reductions; every entry
counts the entries ahead of it (larger, or equal and to its left) in one
pass over [CHUNK, RANK_COLS] tiles, and the entries ranked below TOPK go
straight to the slot of their rank (CHUNK x CHUNK comparisons: for short
rows, i.e. short contexts, or the prefill index's candidates of a few
splits); with HAS_IDS the slot gets the entry's id, else its column.
RADIX (SINGLE_CHUNK only): no arg-max rounds either; the TOPK-th largest
score is found bit by bit (32 rounds of one count over the row held in
registers: the largest threshold with at least TOPK entries at or above it),
then the entries above it, and the leftmost entries equal to it, are written
in column order (not by descending score).
"""

from ._triton import BATCH_PLACEMENT, tl, tl_cuda, triton


@triton.jit
def topk_insert(run_v, run_i, offs_k, new_v, new_i):
    """Insert one (score, id) into a running top-k set (1-D, length TOPK_PAD)."""
    cur_min, slot = tl.min(run_v, axis=0, return_indices=True,
                           return_indices_tie_break_left=True)
    # (scalar-compare & vector) is written as a where: the interpreter rejects the &
    sel = tl.where(new_v > cur_min, offs_k == slot, False)
    run_v = tl.where(sel, new_v, run_v)
    run_i = tl.where(sel, new_i, run_i)
    return run_v, run_i


@triton.jit
def row_ranks(vals_ptr, row, n_valid, n_cols, TOPK: tl.constexpr, CHUNK: tl.constexpr,
              RANK_COLS: tl.constexpr, VOLATILE: tl.constexpr):
    """Rank of each entry of ``vals[row + 0 .. row + n_valid)`` (a row of at
    most CHUNK entries): how many entries are ahead of it (a higher score, or
    an equal one in a lower column).  Returns (rank [CHUNK] int32, chosen
    [CHUNK] bool: rank < TOPK and the score is not -inf); the chosen entries
    hold ranks 0 .. n_chosen - 1, i.e. the top-k slots in descending order.
    The loads cover the row's ``n_cols`` allocated entries and only then drop
    those from ``n_valid`` on (unwritten ones included), so they need not wait
    for the load ``n_valid`` comes from (the token's position)."""
    offs = tl.arange(0, CHUNK)
    offs_j = tl.arange(0, RANK_COLS)
    v = tl.load(vals_ptr + row + offs, mask=offs < n_cols, other=float("-inf"),
                volatile=VOLATILE)
    v = tl.where(offs < n_valid, v, float("-inf"))
    rank = tl.zeros([CHUNK], tl.int32)
    for j0 in tl.static_range(0, CHUNK, RANK_COLS):
        cols = j0 + offs_j
        vj = tl.load(vals_ptr + row + cols, mask=cols < n_cols, other=float("-inf"),
                     volatile=VOLATILE)
        vj = tl.where(cols < n_valid, vj, float("-inf"))
        ahead = (vj[None, :] > v[:, None]) | ((vj[None, :] == v[:, None])
                                              & (cols[None, :] < offs[:, None]))
        rank += tl.sum(ahead.to(tl.int32), axis=1)
    return rank, (rank < TOPK) & (v > float("-inf"))


@triton.jit
def vector_ranks(v, TOPK: tl.constexpr):
    """``row_ranks`` of a row already in registers, ``v`` [N] float32 (-inf:
    not a candidate): (rank [N] int32, chosen [N] bool)."""
    offs = tl.arange(0, v.shape[0])
    ahead = (v[None, :] > v[:, None]) | ((v[None, :] == v[:, None])
                                         & (offs[None, :] < offs[:, None]))
    rank = tl.sum(ahead.to(tl.int32), axis=1)
    return rank, (rank < TOPK) & (v > float("-inf"))


@triton.jit
def rank_topk_row(vals_ptr, ids_ptr, row, n_valid, n_cols, out_row_ptr, TOPK: tl.constexpr,
                  TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr, RANK_COLS: tl.constexpr,
                  VOLATILE: tl.constexpr, HAS_IDS: tl.constexpr = False):
    """``select_topk_row`` by rank for a row of at most CHUNK entries; the
    slots are filled in descending score order (ties: the lower column first)
    with the entries' ids (HAS_IDS) or columns."""
    rank, chosen = row_ranks(vals_ptr, row, n_valid, n_cols, TOPK, CHUNK, RANK_COLS, VOLATILE)
    # the chosen entries hold ranks 0 .. n_chosen - 1
    write_chosen(ids_ptr, row, chosen, rank, out_row_ptr, TOPK, TOPK_PAD, HAS_IDS)


@triton.jit
def write_chosen(ids_ptr, row, chosen, slot, out_row_ptr, TOPK: tl.constexpr,
                 TOPK_PAD: tl.constexpr, HAS_IDS: tl.constexpr):
    """Stores each chosen entry's id (HAS_IDS) or column at ``out_row_ptr +
    slot`` (``slot`` numbers the chosen entries 0 .. n_chosen - 1), then -1 in
    the slots after them up to TOPK."""
    if HAS_IDS:
        picked = tl.load(ids_ptr + row + tl.arange(0, chosen.shape[0]), mask=chosen, other=-1)
    else:
        picked = tl.arange(0, chosen.shape[0]).to(tl.int32)
    tl.store(out_row_ptr + slot, picked, mask=chosen)
    n_chosen = tl.sum(chosen.to(tl.int32), axis=0)
    offs_k = tl.arange(0, TOPK_PAD)
    tl.store(out_row_ptr + offs_k, tl.full([TOPK_PAD], -1, tl.int32),
             mask=(offs_k >= n_chosen) & (offs_k < TOPK))


@triton.jit
def order_keys(v):
    """uint32 keys ordered as the float32 scores ``v`` (no NaNs): negative
    scores have every bit flipped, the others only the sign bit."""
    bits = v.to(tl.uint32, bitcast=True)
    return bits ^ tl.where((bits >> 31) != 0, 0xFFFFFFFF, 0x80000000)


@triton.jit
def radix_topk_row(vals_ptr, ids_ptr, row, n_valid, n_cols, out_row_ptr, TOPK: tl.constexpr,
                   TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr, VOLATILE: tl.constexpr,
                   HAS_IDS: tl.constexpr = False):
    """``select_topk_row`` by a bitwise threshold search for a row of at most
    CHUNK entries; the chosen entries fill the slots in column order (ties at
    the threshold: the lower columns)."""
    offs = tl.arange(0, CHUNK)
    v = tl.load(vals_ptr + row + offs, mask=offs < n_cols, other=float("-inf"),
                volatile=VOLATILE)
    cand = (offs < n_valid) & (v > float("-inf"))
    # key 0 marks a non-candidate: every finite or +inf score orders above it
    keys = tl.where(cand, order_keys(v), 0)
    tau = tl.zeros([], tl.uint32)
    for bit in tl.static_range(31, -1, -1):
        trial = tau | (1 << bit)
        at_least = tl.sum((keys >= trial).to(tl.int32), axis=0)
        tau = tl.where(at_least >= TOPK, trial, tau)
    # tau: the TOPK-th largest key, or 0 when fewer than TOPK are candidates
    above = keys > tau
    tie = (keys == tau) & cand
    need = TOPK - tl.sum(above.to(tl.int32), axis=0)
    chosen = above | (tie & (tl.cumsum(tie.to(tl.int32), axis=0) <= need))
    slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
    write_chosen(ids_ptr, row, chosen, slot, out_row_ptr, TOPK, TOPK_PAD, HAS_IDS)


@triton.jit
def select_topk_row(
    vals_ptr, ids_ptr, row, n_valid, n_cols, out_row_ptr,
    TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr,
    HAS_IDS: tl.constexpr, SINGLE_CHUNK: tl.constexpr, VOLATILE: tl.constexpr,
    RANK: tl.constexpr = False, RANK_COLS: tl.constexpr = 16, RADIX: tl.constexpr = False,
):
    """Top-k of ``vals[row + 0 .. row + n_valid)`` into ``out_row_ptr[0:TOPK]``.
    VOLATILE: read the row uncached (it was written by other programs of the
    same launch; see index_block_max_decode_kernel's FUSED_SELECT).
    RANK: ``rank_topk_row``, RADIX: ``radix_topk_row`` (SINGLE_CHUNK rows)."""
    if RADIX:
        tl.static_assert(SINGLE_CHUNK)
        radix_topk_row(vals_ptr, ids_ptr, row, n_valid, n_cols, out_row_ptr, TOPK, TOPK_PAD,
                       CHUNK, VOLATILE, HAS_IDS)
    elif RANK:
        tl.static_assert(SINGLE_CHUNK)
        rank_topk_row(vals_ptr, ids_ptr, row, n_valid, n_cols, out_row_ptr, TOPK, TOPK_PAD,
                      CHUNK, RANK_COLS, VOLATILE, HAS_IDS)
    else:
        offs_k = tl.arange(0, TOPK_PAD)
        offs_c = tl.arange(0, CHUNK)
        # padded slots hold +inf so they are never the minimum (never written out)
        run_v = tl.where(offs_k < TOPK, float("-inf"), float("inf"))
        run_i = tl.full([TOPK_PAD], -1, tl.int32)
        for c0 in range(0, n_valid, CHUNK):
            cols = c0 + offs_c
            cmask = cols < n_valid
            v = tl.load(vals_ptr + row + cols, mask=cmask, other=float("-inf"), volatile=VOLATILE)
            if HAS_IDS:
                ids = tl.load(ids_ptr + row + cols, mask=cmask, other=-1)
            for it in tl.static_range(TOPK):
                best, j = tl.max(v, axis=0, return_indices=True)
                if HAS_IDS:
                    bid = tl.sum(tl.where(offs_c == j, ids, 0), axis=0)
                else:
                    bid = c0 + j
                if SINGLE_CHUNK:
                    # extraction order is descending: slot `it` gets the it-th best
                    run_i = tl.where(offs_k == it, tl.where(best > float("-inf"), bid, -1), run_i)
                else:
                    run_v, run_i = topk_insert(run_v, run_i, offs_k, best, bid.to(tl.int32))
                v = tl.where(offs_c == j, float("-inf"), v)
        tl.store(out_row_ptr + offs_k, run_i, mask=offs_k < TOPK)


@triton.jit(**BATCH_PLACEMENT)
def block_topk_select_kernel(
    vals_ptr, ids_ptr, pos_ptr, out_ptr,
    tok_base, N,
    stride_vt, stride_vh,
    stride_ot, stride_oh,
    TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, CHUNK: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr,
    HAS_IDS: tl.constexpr, VALID_FROM_POS: tl.constexpr, SINGLE_CHUNK: tl.constexpr,
    PDL: tl.constexpr = False, RANK: tl.constexpr = False, RANK_COLS: tl.constexpr = 16,
    RADIX: tl.constexpr = False,
):
    if PDL:  # see index_score_decode: static inputs first, then wait
        tl_cuda.gdc_launch_dependents()
    t = tok_base + tl.program_id(0)
    h = tl.program_id(1)
    if VALID_FROM_POS:
        pos = tl.load(pos_ptr + t)
        n_valid = tl.minimum(pos // SPARSE_BLOCK + 1, N)
    else:
        n_valid = N
    if PDL:
        tl_cuda.gdc_wait()
    select_topk_row(vals_ptr, ids_ptr, t.to(tl.int64) * stride_vt + h * stride_vh, n_valid, N,
                    out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh,
                    TOPK, TOPK_PAD, CHUNK, HAS_IDS, SINGLE_CHUNK, False, RANK, RANK_COLS,
                    RADIX)


@triton.jit(**BATCH_PLACEMENT)
def block_topk_bitonic_kernel(
    vals_ptr, pos_ptr, out_ptr,
    tok_base, N,
    stride_vt, stride_vh,
    stride_ot, stride_oh,
    TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, PIECE: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr,
):
    """Top-k of a row of block scores by bitonic top-k (``tl.topk``), one
    program per (token, head), the columns up to the token's own block only
    (``VALID_FROM_POS``): the row is read in pieces of ``PIECE`` columns, each
    piece's top ``TOPK_PAD`` merged with the running set, so the work follows
    the visible blocks, not the row's allocated width.  Each entry is one
    uint64 key: the score's order bits above, the column inverted below, so
    ties go to the lower column and the key carries its column.  Slots are
    filled in descending score order, -1 after the visible blocks."""
    t = tok_base + tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    n_valid = tl.minimum(pos // SPARSE_BLOCK + 1, N)
    row = vals_ptr + t.to(tl.int64) * stride_vt + h * stride_vh
    offs = tl.arange(0, PIECE)
    best = tl.zeros([TOPK_PAD], tl.uint64)  # key 0: no entry
    for c0 in range(0, n_valid, PIECE):
        cols = c0 + offs
        v = tl.load(row + cols, mask=cols < n_valid, other=float("-inf"))
        key = ((order_keys(v).to(tl.uint64) << 32)
               | (0xFFFFFFFF - cols.to(tl.uint32)).to(tl.uint64))
        key = tl.where((cols < n_valid) & (v > float("-inf")), key, 0)
        top = tl.topk(key, TOPK_PAD)
        best = tl.topk(tl.reshape(tl.join(best, top), [2 * TOPK_PAD], can_reorder=True), TOPK_PAD)
    col = (0xFFFFFFFF - (best & 0xFFFFFFFF)).to(tl.int32)
    offs_k = tl.arange(0, TOPK_PAD)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + offs_k,
             tl.where(best != 0, col, -1), mask=offs_k < TOPK)
