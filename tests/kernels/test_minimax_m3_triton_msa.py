# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 MSA Triton kernels against a dense masked PyTorch oracle.

The oracle below is written straight from the MSA semantics (block score =
max over visible keys of the fp32 index dot product, forced local/init
blocks, top-k, -1 padding; attention over the keys of the selected blocks that
are causally visible) with dense masked tensors: no code is shared with the
kernels or with the model's reference backend.

Without a GPU the kernels run in the Triton interpreter (``conftest.py`` sets
``TRITON_INTERPRET=1``) at small shapes with fp32 / fp16 inputs (the
interpreter's bf16 ``tl.dot`` is broken).  With a GPU the same tests run
compiled, in bf16 at the model's real shapes (one TP4 rank and TP1 heads).
Every test draws fresh random inputs (seed printed on failure) and poisons the
outputs (NaN / sentinel) and the unused cache slots (NaN) before launching.
"""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():  # conftest does this too; keep the file standalone
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tuned_kernels import tuned  # noqa: E402

from vllm.models.minimax_m3.common import triton_ops  # noqa: E402

# ``_tune=dict(...)``: the call inside ``triton_ops.launch_overrides`` (tuned_kernels)
block_sparse_attention = tuned("attention", triton_ops.block_sparse_attention)
index_block_topk = tuned("index", triton_ops.index_block_topk)

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
FP8 = torch.float8_e4m3fn


def _seed() -> int:
    s = random.SystemRandom().randrange(1 << 31)
    torch.manual_seed(s)
    return s


# --------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------
if ON_GPU:
    DTYPES = [torch.bfloat16]
    # (Hq, Hkv, head_dim, index_dim, sparse_block, page_size, topk)
    SHAPES = [(16, 1, 128, 128, 128, 64, 16), (64, 4, 128, 128, 128, 16, 16)]
else:
    DTYPES = [torch.float32, torch.float16]
    SHAPES = [(4, 1, 32, 16, 16, 8, 4), (6, 2, 16, 32, 32, 16, 3)]


# --------------------------------------------------------------------------
# batch / cache construction
# --------------------------------------------------------------------------
class Batch:
    """Requests given as (context tokens already cached, new tokens)."""

    def __init__(self, reqs, page_size, order=None, extra_pages=3):
        self.reqs = reqs
        self.page_size = page_size
        R = len(reqs)
        self.seq_lens = [c + n for c, n in reqs]
        max_pages = max(-(-s // page_size) for s in self.seq_lens) + 1
        num_pages = sum(-(-s // page_size) for s in self.seq_lens) + extra_pages
        perm = torch.randperm(num_pages).tolist()
        bt = torch.full((R, max_pages), -7, dtype=torch.int32)  # poisoned unused entries
        used = set()
        k = 0
        for r, s in enumerate(self.seq_lens):
            for p in range(-(-s // page_size)):
                bt[r, p] = perm[k]
                used.add(perm[k])
                k += 1
        # unused table entries must not be dereferenced; give them valid ids of
        # NaN-poisoned pages so that a stray read shows up as NaN, not a crash
        spare = [p for p in range(num_pages) if p not in used]
        bt[bt < 0] = spare[0]
        self.num_pages = num_pages
        self.block_table = bt.to(DEVICE)
        order = list(range(R)) if order is None else order
        req_ids, pos = [], []
        for r in order:
            c, n = reqs[r]
            req_ids += [r] * n
            pos += list(range(c, c + n))
        self.token_req = torch.tensor(req_ids, dtype=torch.int32, device=DEVICE)
        self.token_pos = torch.tensor(pos, dtype=torch.int32, device=DEVICE)
        self.T = len(pos)

    def valid_slot_mask(self):
        """[num_pages, page_size] bool: slots holding a key of some request."""
        m = torch.zeros(self.num_pages, self.page_size, dtype=torch.bool)
        bt = self.block_table.cpu()
        for r, s in enumerate(self.seq_lens):
            for j in range(s):
                m[bt[r, j // self.page_size], j % self.page_size] = True
        return m.to(DEVICE)

    def gather(self, cache, r, n):
        """Rows 0..n-1 of request r from a paged cache [num_pages, page_size, ...]."""
        pages = self.block_table[r, : -(-n // self.page_size)].long()
        return cache[pages].flatten(0, 1)[:n]


def make_idx_cache(batch, D, dtype, fp8=False):
    k = torch.randn(batch.num_pages, batch.page_size, D, device=DEVICE)
    valid = batch.valid_slot_mask()
    if fp8:
        # the engine's layout: packed pages [keys | float32 scales], as views
        from vllm.models.minimax_m3.common.sparse_ops import fp8_index_cache_views
        pages = torch.empty(batch.num_pages, batch.page_size, D + 4, dtype=FP8, device=DEVICE)
        q8, scales = fp8_index_cache_views(pages, D)
        scales.copy_(torch.rand(batch.num_pages, batch.page_size, device=DEVICE) * 0.02 + 0.005)
        q8.copy_((k / scales[..., None]).clamp(-448, 448).to(FP8))
        q8.view(torch.uint8)[~valid] = 0x7F  # e4m3fn NaN
        scales[~valid] = float("nan")
        return q8, scales
    k = k.to(dtype)
    k[~valid] = float("nan")
    return k, None


def scaled_cache(q8, ks, vs, rounded_to=None):
    """An fp8 cache with scalar scales dequantized in float64; with
    ``rounded_to``, as a kernel sees it that scales every element and rounds it
    to that dtype before its MMA (poisoned slots stay NaN: the oracle reads
    valid rows only)."""
    deq = q8.double()
    deq[:, 0] *= ks.double()
    deq[:, 1] *= vs.double()
    return deq if rounded_to is None else deq.to(rounded_to).double()


def _poison_fp8(q8, inv):
    u = q8.view(torch.uint8)
    u[:, 0][inv] = 0x7F  # e4m3fn NaN
    u[:, 1][inv] = 0x7F


def make_kv_cache(batch, Hkv, D, dtype, mode, fold=True):
    """Returns (kv_cache, k_scale, v_scale, kv_scales, dequantised float cache).

    With scalar scales unfolded (mode 1, ``fold=False``) the kernels scale
    every loaded K and V element and round it to the dtype of their dots
    before the MMA (fp16 for bf16 queries over an fp8 cache), so the oracle's
    cache is rounded the same way: that rounding (up to 2**-11 of each
    element in fp16) is the formulation's, not a kernel error, and compounds
    past the fp16 tolerance when a near-zero output cancels large V rows."""
    kv = torch.randn(batch.num_pages, 2, batch.page_size, Hkv, D, device=DEVICE)
    valid = batch.valid_slot_mask()
    inv = ~valid
    if mode == 0:
        kv = kv.to(dtype)
        deq = kv.double()
        kv[:, 0][inv] = float("nan")
        kv[:, 1][inv] = float("nan")
        return kv, None, None, None, deq
    if mode == 1:
        ks = torch.tensor([0.037], device=DEVICE)
        vs = torch.tensor([0.021], device=DEVICE)
        q8 = torch.empty_like(kv, dtype=FP8)
        q8[:, 0] = (kv[:, 0] * 3 / ks).clamp(-448, 448).to(FP8)
        q8[:, 1] = (kv[:, 1] * 3 / vs).clamp(-448, 448).to(FP8)
        mma = torch.float16 if dtype == torch.bfloat16 else dtype
        deq = scaled_cache(q8, ks, vs, None if fold else mma)
        _poison_fp8(q8, inv)
        return q8, ks, vs, None, deq
    scales = torch.rand(batch.num_pages, 2, batch.page_size, Hkv, device=DEVICE) * 0.05 + 0.002
    q8 = (kv / scales[..., None]).clamp(-448, 448).to(FP8)
    deq = q8.double() * scales[..., None].double()
    _poison_fp8(q8, inv)
    return q8, None, None, scales, deq


# --------------------------------------------------------------------------
# oracle (dense, masked, float64)
# --------------------------------------------------------------------------
def ref_block_scores(batch, idx_q, idx_k, B, local, init, idx_scales=None):
    """List over tokens of [H, num_visible_blocks] float64 block scores
    (+inf for forced blocks)."""
    out = []
    for t in range(batch.T):
        r = int(batch.token_req[t])
        p = int(batch.token_pos[t])
        n = p + 1
        nb = p // B + 1
        keys = batch.gather(idx_k, r, n).double()
        if idx_scales is not None:
            keys = keys * batch.gather(idx_scales, r, n).double()[:, None]
        s = idx_q[t].double() @ keys.T  # [H, n]
        full = torch.full((s.shape[0], nb * B), float("-inf"), dtype=torch.float64, device=DEVICE)
        full[:, :n] = s
        bs = full.view(s.shape[0], nb, B).amax(-1)
        own = nb - 1
        forced = {max(own - i, 0) for i in range(local)} | {b for b in range(init) if b <= own}
        for b in forced:
            bs[:, b] = float("inf")
        out.append(bs)
    return out


def check_topk(got, block_scores, topk, tag=""):
    """Selected sets equal to the oracle's per (token, head); where they differ
    only blocks whose scores tie (within float tolerance) may be swapped."""
    got = got.cpu()
    for t, bs in enumerate(block_scores):
        bs = bs.cpu()
        nb = bs.shape[1]
        for h in range(bs.shape[0]):
            row = got[t, h].tolist()
            nvalid = min(topk, nb)
            where = f"{tag} token {t} head {h}: got {row}"
            assert all(b >= 0 for b in row[:nvalid]), f"not left-packed / missing blocks, {where}"
            assert all(b == -1 for b in row[nvalid:]), f"expected -1 padding after {nvalid}, {where}"
            sel = row[:nvalid]
            assert len(set(sel)) == nvalid, f"repeated block, {where}"
            assert all(0 <= b < nb for b in sel), f"invisible block selected, {where}"
            v, i = bs[h].topk(nvalid)
            want = set(i.tolist())
            if set(sel) == want:
                continue
            sc = bs[h]
            chosen = sc[sel]
            rest = torch.ones(nb, dtype=torch.bool)
            rest[sel] = False
            kth = sc[rest].max() if rest.any() else torch.tensor(float("-inf"))
            tol = 1e-3 * (1.0 + sc[torch.isfinite(sc)].abs().max())
            assert chosen.min() >= kth - tol, (
                f"selection differs from the oracle beyond ties, {where}, oracle {sorted(want)}, "
                f"scores {sc.tolist()}")


def ref_attention(batch, q, deq_kv, topk_blocks, B, scale):
    """Dense masked attention in float64. deq_kv: [num_pages, 2, page, Hkv, D]."""
    T, HQ, D = q.shape
    Hkv = deq_kv.shape[3]
    G = HQ // Hkv
    out = torch.zeros(T, HQ, D, dtype=torch.float64, device=DEVICE)
    for t in range(T):
        r = int(batch.token_req[t])
        p = int(batch.token_pos[t])
        n = p + 1
        k = batch.gather(deq_kv[:, 0], r, n)  # [n, Hkv, D]
        v = batch.gather(deq_kv[:, 1], r, n)
        kb = torch.arange(n, device=DEVICE) // B
        for g in range(Hkv):
            blocks = topk_blocks[t, g]
            blocks = blocks[blocks >= 0].long()
            allowed = (kb[:, None] == blocks[None, :]).any(-1)
            if not allowed.any():
                continue
            qs = q[t, g * G:(g + 1) * G].double()
            s = (qs @ k[:, g].T) * scale
            s = s.masked_fill(~allowed[None, :], float("-inf"))
            out[t, g * G:(g + 1) * G] = torch.softmax(s, -1) @ v[:, g]
    return out


def random_selection(batch, Hkv, topk, B, full_prob=0.7):
    """Random left-packed, -1 padded, repeat-free block lists of visible blocks."""
    sel = torch.full((batch.T, Hkv, topk), -1, dtype=torch.int32)
    for t in range(batch.T):
        nb = int(batch.token_pos[t]) // B + 1
        for g in range(Hkv):
            k = min(topk, nb)
            if random.random() > full_prob:
                k = random.randint(1, k)
            perm = torch.randperm(nb)[:k]
            sel[t, g, :k] = perm.to(torch.int32)
    return sel.to(DEVICE)


def assert_counters_zero():
    """The fused decode select / split merge leave their arrival counters zeroed (they are
    reused by the next launch and by CUDA-graph replays)."""
    from vllm.models.minimax_m3.common.triton_ops import _utils
    assert _utils._COUNTERS, "no arrival counters were allocated"
    for buf in _utils._COUNTERS.values():
        assert int(buf.abs().sum()) == 0, "fused select left arrival counters set"


def tol(dtype):
    return {torch.float32: (2e-4, 2e-4), torch.float16: (3e-3, 1e-2),
            torch.bfloat16: (2e-2, 3e-2)}[dtype]


# --------------------------------------------------------------------------
# index_block_topk
# --------------------------------------------------------------------------
# each case: B -> requests (tokens already cached, new tokens); a request
# with one new token is a decode.  Decodes are listed first (vLLM's order).
INDEX_CASES = {
    "short_decode": lambda B: [(B // 3, 1)],                    # < one block
    "short_prefill": lambda B: [(0, B // 2 + 3)],               # inside block 0
    "exact_blocks": lambda B: [(3 * B - 1, 1), (0, 2 * B)],     # ends on a boundary
    "few_blocks_pad": lambda B: [(B + 4, 1), (3, B + 9)],       # < topk visible
    "many_decode": lambda B: [(6 * B + 1, 1), (9 * B + 6, 1), (2 * B - 1, 1),
                              (4 * B, 1), (0, 1)],
    "mixed": lambda B: [(7 * B + 8, 1), (3 * B - 1, 1), (5 * B, 17), (0, B + 5)],
}
if ON_GPU:  # long contexts at the real shapes
    INDEX_CASES["long"] = lambda B: [(32000, 1), (131071, 1), (8190, 1), (20000, 300)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_index_block_topk(case, shape, dtype):
    seed = _seed()
    _, Hkv, _, Didx, B, page, topk = shape
    reqs = INDEX_CASES[case](B)
    batch = Batch(reqs, page)
    H = Hkv
    idx_q = torch.randn(batch.T, H, Didx, device=DEVICE).to(dtype)
    idx_k, _ = make_idx_cache(batch, Didx, dtype)
    n_dec = sum(1 for c, n in reqs if n == 1)
    scores = ref_block_scores(batch, idx_q, idx_k, B, local=1, init=0)
    # decode path for the decode tokens + prefill path for the rest (the
    # backend's split), all-prefill, the default, and all-decode where cheap
    variants = [dict(num_decode_tokens=n_dec), dict(num_decode_tokens=0), dict(),
                dict(num_decode_tokens=n_dec, fused_select=True),
                # ... its top-k by arg-max rounds (short rows default to ranks)
                dict(num_decode_tokens=n_dec, fused_select=True, _tune=dict(rank_select=False)),
                # the decode top-k by arg-max rounds (short rows default to ranks)
                dict(num_decode_tokens=n_dec, _tune=dict(rank_select=False)),
                # ... by a bitwise threshold search, in its own launch and fused
                dict(num_decode_tokens=n_dec, _tune=dict(radix_select=True, rank_select=False)),
                dict(num_decode_tokens=n_dec, fused_select=True,
                     _tune=dict(radix_select=True, rank_select=False))]
    if ON_GPU or batch.T <= 12:
        variants.append(dict(num_decode_tokens=batch.T))
    # the prefill index skipping the causal mask of fully visible blocks
    variants.append(dict(num_decode_tokens=n_dec, _tune=dict(skip_full_mask=True)))
    if ON_GPU:  # the prefill index without resolving pages one block ahead
        variants.append(dict(num_decode_tokens=n_dec, _tune=dict(prefetch_rows=False)))
        # on an H100/H200 the prefill index defaults to the Gluon scoring kernel
        # (index_score_prefill_sm90) and a select launch: the tl kernel's streaming
        # top-k too, and the Gluon kernel with a ring of 3 key tiles, one split
        # per tile and three
        variants += [dict(num_decode_tokens=n_dec, _tune=dict(sm90=False)),
                     dict(num_decode_tokens=n_dec, _tune=dict(sm90_buffers=3)),
                     dict(num_decode_tokens=n_dec, _tune=dict(sm90_splits=1)),
                     dict(num_decode_tokens=n_dec, _tune=dict(sm90_splits=3,
                                                              min_split_blocks=1))]
        # the decode chain with programmatic dependent launch (sm90+)
        variants.append(dict(num_decode_tokens=n_dec, _tune=dict(pdl=True)))
    if ON_GPU or (dtype == torch.float32 and shape == SHAPES[0]):
        # decode index scoring two sparse blocks per key load, plain and pipelined
        variants += [dict(num_decode_tokens=n_dec, blocks_per_prog=2, _tune=dict(tile_blocks=2)),
                     dict(num_decode_tokens=n_dec, blocks_per_prog=4,
                          _tune=dict(tile_blocks=2, decode_stages=2))]
    if not ON_GPU and dtype == torch.float32 and shape == SHAPES[0]:
        # tuning knobs: several blocks per decode program, prefill split over
        # the context with a merge, top-k selection streaming several chunks
        variants += [dict(num_decode_tokens=n_dec, blocks_per_prog=2, select_chunk=4),
                     dict(num_decode_tokens=n_dec, context_splits=3),
                     dict(num_decode_tokens=n_dec, context_splits=3, select_chunk=4),
                     dict(num_decode_tokens=n_dec, blocks_per_prog=2, select_chunk=4,
                          fused_select=True),
                     dict(num_decode_tokens=n_dec, blocks_per_prog=3,
                          _tune=dict(decode_stages=2)),
                     dict(num_decode_tokens=n_dec, _tune=dict(prefetch_rows=False)),
                     dict(num_decode_tokens=n_dec, context_splits=3,
                          _tune=dict(prefetch_rows=False)),
                     dict(num_decode_tokens=0, context_splits=3,
                          _tune=dict(skip_full_mask=True))]
    for kw in variants:
        out = torch.full((batch.T, H, topk), 12345, dtype=torch.int32, device=DEVICE)
        got = index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req,
                               batch.token_pos, B, topk, out=out, **kw)
        assert got.data_ptr() == out.data_ptr()
        check_topk(got, scores, topk, tag=f"[seed {seed} {kw}]")
        if kw.get("fused_select") and n_dec:  # (no decode tokens: nothing to fuse)
            assert_counters_zero()


@pytest.mark.parametrize("nb,mode", [(40, "rank"), (150, "radix"), (150, "argmax"),
                                     (150, "bitonic"), (40, "bitonic"), (1000, "bitonic")])
def test_select_score_rows(nb, mode):
    """The prefill select of the sm_90 index path (``select_score_rows``) on
    random score rows: each row's top-k of its visible columns (those up to its
    own block), forced (+inf) columns first, -1 padded, for every select mode;
    rows before ``nd`` are left alone."""
    from vllm.models.minimax_m3.common.triton_ops.indexer import select_score_rows

    seed = _seed()
    B, topk, H, nd = 16, 4, 2, 3
    T = 9 if ON_GPU or nb < 1000 else 5
    pos = torch.randint(0, nb * B, (T,), dtype=torch.int32)
    pos[-1] = 2 * B - 1  # two visible blocks: fewer than top-k, padded
    scores = torch.randn(T, H, nb)
    own = (pos // B).long()
    scores[torch.arange(T), :, own] = float("inf")  # the own block is forced
    # columns after the own block are never written: garbage that would win
    scores.masked_fill_(torch.arange(nb)[None, None, :] > own[:, None, None], 1e30)
    out = torch.full((T, H, topk), 777, dtype=torch.int32)
    out_d, sc_d, pos_d = out.to(DEVICE), scores.to(DEVICE), pos.to(DEVICE)
    tune = {"sm90_select": mode}
    if mode == "bitonic" and nb == 150:
        tune["sm90_select_piece"] = 32  # several pieces per row, each merged
    select_score_rows(sc_d, pos_d, out_d, nd, B, topk, tune)
    got = out_d.cpu()
    assert (got[:nd] == 777).all(), f"[seed {seed}] rows before nd were written"
    for t in range(nd, T):
        for h in range(H):
            n = int(own[t]) + 1
            want = torch.topk(scores[t, h, :n], min(topk, n)).indices.sort().values
            row = got[t, h]
            assert (row[len(want):] == -1).all(), (seed, mode, t, h, row)
            assert torch.equal(row[:len(want)].sort().values.long(), want), (seed, mode, t, h,
                                                                              row, want)


@pytest.mark.parametrize("local,init", [(2, 1), (3, 0), (0, 0), (1, 2)])
def test_index_block_topk_local_init(local, init):
    seed = _seed()
    dtype = DTYPES[0]
    _, _, _, Didx, B, page, topk = SHAPES[0]
    H = 3 if not ON_GPU else 4  # non power of two index heads on CPU
    # the last request's chunk starts on the last key of a block: the block
    # after it is invisible to the chunk's first row only
    reqs = [(6 * B - 7, 1), (5, 1), (3 * B - 4, 12), (2 * B - 1, 12)]
    batch = Batch(reqs, page, order=[1, 0, 2, 3])
    idx_q = torch.randn(batch.T, H, Didx, device=DEVICE).to(dtype)
    idx_k, _ = make_idx_cache(batch, Didx, dtype)
    scores = ref_block_scores(batch, idx_q, idx_k, B, local=local, init=init)
    for kw in (dict(num_decode_tokens=batch.T), dict(num_decode_tokens=0),
               dict(num_decode_tokens=2, context_splits=2, select_chunk=2),
               dict(num_decode_tokens=2, fused_select=True),
               # forced blocks (+inf) tie at the top: the threshold search keeps them all
               dict(num_decode_tokens=2, _tune=dict(radix_select=True, rank_select=False)),
               dict(num_decode_tokens=2, _tune=dict(prefetch_rows=False)),
               dict(num_decode_tokens=2, _tune=dict(skip_full_mask=True))):
        out = torch.full((batch.T, H, topk), 12345, dtype=torch.int32, device=DEVICE)
        got = index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req,
                               batch.token_pos, B, topk, local, init, out=out, **kw)
        check_topk(got, scores, topk, tag=f"[seed {seed} local {local} init {init} {kw}]")


@pytest.mark.parametrize("splits,min_blocks", [(4, 1), (3, 2), (8, 1)])
def test_index_block_topk_split_visible(splits, min_blocks):
    """Prefill index with each tile's programs dividing the blocks its rows see
    (``split_visible``, the default): a causal chunk (its last tiles see many
    more blocks than its first), a chunk after a cached prefix and a short
    prompt, tiles of 8 rows shared between requests (interleaved order), and
    a block table wider than any context (as in the engine)."""
    seed = _seed()
    dtype = DTYPES[0]
    _, _, _, Didx, B, page, topk = SHAPES[0]
    H = 2
    reqs = [(0, 6 * B + 5), (2 * B + 3, 3 * B - 3), (0, B - 1)]
    batch = Batch(reqs, page, order=[1, 0, 2])
    idx_q = torch.randn(batch.T, H, Didx, device=DEVICE).to(dtype)
    idx_k, _ = make_idx_cache(batch, Didx, dtype)
    scores = ref_block_scores(batch, idx_q, idx_k, B, local=1, init=0)
    # the table's last column is unused (a valid id of a NaN-poisoned page)
    bt = batch.block_table
    wide = torch.cat([bt, bt[:, -1:].expand(-1, 5 * B // page)], 1)
    for table, tune in ((bt, dict(split_visible=True, min_split_blocks=min_blocks, BLOCK_M=8)),
                        (wide, dict(split_visible=True, min_split_blocks=min_blocks, BLOCK_M=8)),
                        (bt, dict(split_visible=True, min_split_blocks=min_blocks, BLOCK_M=8,
                                  skip_full_mask=True)),
                        (wide, dict(split_visible=True, min_split_blocks=min_blocks, BLOCK_M=8,
                                    prefetch_rows=False)),
                        # the splits' candidates merged by arg-max rounds, not by rank
                        (bt, dict(split_visible=True, min_split_blocks=min_blocks, BLOCK_M=8,
                                  rank_select=False))):
        out = torch.full((batch.T, H, topk), 12345, dtype=torch.int32, device=DEVICE)
        got = index_block_topk(idx_q, idx_k, table, batch.token_req,
                               batch.token_pos, B, topk, num_decode_tokens=0,
                               context_splits=splits, out=out, _tune=tune)
        check_topk(got, scores, topk,
                   tag=f"[seed {seed} splits {splits} table {table.shape[1]} {tune}]")


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_block_topk_fp8_index_cache(dtype):
    """Optional fp8 index-key cache (one float32 scale per token); with 16-bit
    queries the kernels' dot runs in fp16 (``fp16_dot_operand``)."""
    seed = _seed()
    _, _, _, Didx, B, page, topk = SHAPES[0]
    reqs = [(6 * B + 3, 1), (2 * B + 1, 1), (B + 3, 12)]
    batch = Batch(reqs, page)
    idx_q = torch.randn(batch.T, 1, Didx, device=DEVICE).to(dtype)
    idx_k, idx_s = make_idx_cache(batch, Didx, dtype, fp8=True)
    scores = ref_block_scores(batch, idx_q, idx_k, B, 1, 0, idx_scales=idx_s)
    for nd, tune, bpp in ((batch.T, None, None), (0, None, None), (2, None, None),
                          (2, dict(prefetch_rows=False), None),
                          (batch.T, dict(decode_stages=3), 4),  # the b32 launch shape
                          (batch.T, dict(tile_blocks=2), 2),
                          (batch.T, dict(decode_stages=3, tile_blocks=2), 4)):
        out = torch.full((batch.T, 1, topk), 12345, dtype=torch.int32, device=DEVICE)
        got = index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req,
                               batch.token_pos, B, topk, idx_k_scales=idx_s, out=out,
                               num_decode_tokens=nd, blocks_per_prog=bpp, _tune=tune)
        check_topk(got, scores, topk, tag=f"[seed {seed} fp8 idx nd={nd} {tune}]")
    # the PyTorch reference backend's op takes the same fp8 cache and scales
    from vllm.models.minimax_m3.common import sparse_ops
    ref = sparse_ops.index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req,
                                      batch.token_pos, B, topk, idx_k_scales=idx_s)
    check_topk(ref, scores, topk, tag=f"[seed {seed} fp8 idx, reference op]")


def test_index_block_topk_bad_input():
    _, _, _, Didx, B, page, topk = SHAPES[0]
    batch = Batch([(4, 1)], page)
    idx_q = torch.randn(1, 1, Didx, device=DEVICE)
    idx_k, _ = make_idx_cache(batch, Didx, torch.float32)
    with pytest.raises(ValueError, match="multiple of"):
        index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req, batch.token_pos,
                         page + 1, topk)
    with pytest.raises(ValueError, match="int32"):
        index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req.long(),
                         batch.token_pos, B, topk)
    with pytest.raises(ValueError, match="local_blocks"):
        index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req, batch.token_pos,
                         B, topk, local_blocks=topk + 1)
    for bpp, tile in ((2, 3), (1, 2)):  # not a power of two; not dividing blocks_per_prog
        with pytest.raises(ValueError, match="tile_blocks"):
            index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req, batch.token_pos,
                             B, topk, blocks_per_prog=bpp, _tune=dict(tile_blocks=tile))
    with pytest.raises(ValueError, match="min_split_blocks"):
        index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req, batch.token_pos,
                         B, topk, num_decode_tokens=0, _tune=dict(min_split_blocks=0))


# --------------------------------------------------------------------------
# block_sparse_attention
# --------------------------------------------------------------------------
ATTN_CASES = {
    "short": lambda B: [(3, 1), (0, B // 2 + 1)],
    "exact_blocks": lambda B: [(3 * B - 1, 1), (2 * B - 6, 6)],
    "mixed": lambda B: [(9 * B + 6, 1), (B + 4, 1), (4 * B - 4, 7), (0, 5)],
}
if ON_GPU:
    ATTN_CASES["long"] = lambda B: [(131071, 1), (30000, 1), (9000, 200)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_block_sparse_attention(case, shape, dtype):
    seed = _seed()
    Hq, Hkv, D, _, B, page, topk = shape
    reqs = ATTN_CASES[case](B)
    batch = Batch(reqs, page)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    kv, _, _, _, deq = make_kv_cache(batch, Hkv, D, dtype, 0)
    sel = random_selection(batch, Hkv, topk, B)
    scale = D ** -0.5
    ref = ref_attention(batch, q, deq, sel, B, scale)
    atol, rtol = tol(dtype)
    splits_list = (1, 2, topk) if case == "mixed" else (1, 2)
    runs = [(n, False, None) for n in ((None,) + splits_list if ON_GPU else splits_list)]
    runs += [(n, True, None) for n in splits_list if n != 1]  # the split merge fused in
    if ON_GPU:  # programmatic dependent launch of the attention and its merge (sm90+)
        runs += [(n, False, dict(pdl=True)) for n in (None, 2)]
    for splits, fused, tune in runs:
        out = torch.full_like(q, float("nan"))
        got = block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                                     sel, B, scale, out=out, num_splits=splits,
                                     fused_merge=fused, _tune=tune)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(
            got.double(), ref, atol=atol, rtol=rtol,
            msg=lambda m: f"[seed {seed} splits {splits} fused {fused} {tune}] {m}")
        if fused:
            assert_counters_zero()


# every KV scale mode: (kv_scale_mode, fold_scalar_scales)
SCALE_MODES = ((0, True), (1, True), (1, False), (2, True))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_attention_selects_from_block_scores(shape):
    """``index_block_topk(..., return_scores=True)`` + ``block_sparse_attention(...,
    select_topk=k)`` (each attention program ranks its token's block scores)
    gives the two-launch chain's output exactly: the same slots in the same
    order, every split count; a row of fewer visible blocks than k, a context
    inside one block, rows ending on a block boundary."""
    seed = _seed()
    Hq, Hkv, D, Didx, B, page, topk = shape
    dtype = DTYPES[0]
    reqs = [(B // 3, 1), (3 * B - 1, 1), (B + 4, 1), (9 * B + 6, 1), (4 * B, 1)]
    if ON_GPU:  # up to the longest row the attention ranks (64 blocks)
        reqs += [(64 * B - 1, 1), (40 * B + 7, 1)]
    batch = Batch(reqs, page)
    idx_q = torch.randn(batch.T, Hkv, Didx, device=DEVICE).to(dtype)
    idx_k, _ = make_idx_cache(batch, Didx, dtype)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    args = (batch.block_table, batch.token_req, batch.token_pos)
    # (the batch's block table has a spare page: without max_context, 65 blocks on a GPU)
    sel = index_block_topk(idx_q, idx_k, *args, B, topk, num_decode_tokens=batch.T,
                           max_context=64 * B)
    scores = index_block_topk(idx_q, idx_k, *args, B, topk, num_decode_tokens=batch.T,
                              max_context=64 * B, return_scores=True)
    assert scores.dtype == torch.float32 and scores.shape[:2] == (batch.T, Hkv)
    for mode in (0, 2):
        kv, ks, vs, kvs, _ = make_kv_cache(batch, Hkv, D, dtype, mode)
        # (and each block over two programs, where that leaves 16-key ranges)
        split_blocks = (dict(num_splits=2, _tune=dict(key_split=2)),) if B % 32 == 0 else ()
        for kw in (dict(), dict(num_splits=1), dict(num_splits=3),
                   dict(num_splits=2, fused_merge=True)) + split_blocks:
            ref = block_sparse_attention(q, kv, *args, sel, B, D ** -0.5, mode, ks, vs, kvs,
                                         **kw)
            out = torch.full_like(q, float("nan"))
            got = block_sparse_attention(q, kv, *args, scores, B, D ** -0.5, mode, ks, vs, kvs,
                                         out=out, select_topk=topk, **kw)
            assert torch.equal(got, ref), f"[seed {seed} mode {mode} {kw}]"
    # what it does not take: prefill tokens, long rows, ids, prefill layouts
    with pytest.raises(ValueError, match="return_scores"):
        index_block_topk(idx_q, idx_k, *args, B, topk, num_decode_tokens=batch.T - 1,
                         return_scores=True)
    with pytest.raises(ValueError, match="return_scores"):
        index_block_topk(idx_q, idx_k, *args, B, topk, num_decode_tokens=batch.T,
                         max_context=65 * B, return_scores=True)
    kv, *_ = make_kv_cache(batch, Hkv, D, dtype, 0)
    with pytest.raises(ValueError, match="select_topk"):
        block_sparse_attention(q, kv, *args, sel, B, D ** -0.5, select_topk=topk)
    with pytest.raises(ValueError, match="select_topk"):
        block_sparse_attention(q, kv, *args, scores, B, D ** -0.5, select_topk=topk,
                               token_tile=2)


def scale_mode_cases(batch, q, sel, Hkv, D, B, dtype):
    """Per KV scale mode (and folding): the mode, the folding, the cache and its
    scales (kv, k_scale, v_scale, kv_scales), the oracle's output on the
    dequantized cache, and the tolerances."""
    for mode, fold in SCALE_MODES:
        kv, ks, vs, kvs, deq = make_kv_cache(batch, Hkv, D, dtype, mode, fold)
        ref = ref_attention(batch, q, deq, sel, B, D ** -0.5)
        atol, rtol = tol(dtype)
        atol *= 3 if mode else 1  # make_kv_cache's fp8 caches hold 3x larger values
        yield mode, fold, (kv, ks, vs, kvs), ref, atol, rtol


def shared_selection(batch, Hkv, topk, B):
    """Prefill-like selections: each token keeps most of the previous token's
    blocks (same request), swaps one at random and always has its own block,
    so tiles of consecutive tokens share most blocks but not all."""
    sel = random_selection(batch, Hkv, topk, B).cpu()
    req, pos = batch.token_req.cpu(), batch.token_pos.cpu()
    for t in range(1, batch.T):
        if req[t] != req[t - 1]:
            continue
        own = int(pos[t]) // B
        for g in range(Hkv):
            prev = [b for b in sel[t - 1, g].tolist() if b >= 0]
            if own not in prev:
                prev = prev[: topk - 1] + [own]
            if len(prev) > 1 and random.random() < 0.5:
                cand = [b for b in range(own + 1) if b not in prev]
                if cand:
                    prev[random.randrange(len(prev) - 1)] = random.choice(cand)
            sel[t, g] = -1
            sel[t, g, : len(prev)] = torch.tensor(prev, dtype=torch.int32)
    return sel.to(DEVICE)


TILE_CASES = dict(ATTN_CASES, prefill=lambda B: [(2 * B + 3, 3 * B // 2 + 1), (0, B + 7)])


@pytest.mark.parametrize("case", list(TILE_CASES))
@pytest.mark.parametrize("shape", [0, 1])
def test_block_sparse_attention_block_major(case, shape):
    """``block_major``: (token, slot) pairs grouped by block on the device, one
    program per up to TM pairs of one block, per-block partials merged per
    token: equals the oracle for every KV scale mode, with several requests,
    two KV heads (odd group size on CPU), decode tokens before ``tile_start``
    and groups larger and smaller than a tile."""
    if not ON_GPU and (case, shape) == ("prefill", 1):
        pytest.skip("CPU time (3 minutes in the interpreter, CI's longest test): the GPU runs "
                    "it; on CPU [0-prefill] covers the prefill tiles, [1-mixed] the random "
                    "selections")
    seed = _seed()
    dtype = DTYPES[-1]
    Hq, Hkv, D, _, B, page, topk = SHAPES[shape]
    case_index = list(TILE_CASES).index(case)
    reqs = TILE_CASES[case](B)
    batch = Batch(reqs, page)
    n_decode = next((i for i, (_, n) in enumerate(reqs) if n != 1), len(reqs))
    sel = (shared_selection if shape == 0 else random_selection)(batch, Hkv, topk, B)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    scale = D ** -0.5
    for mode, fold, (kv, ks, vs, kvs), ref, atol, rtol in scale_mode_cases(
            batch, q, sel, Hkv, D, B, dtype):
        # programs of a few pairs (groups span several programs; the grouping's
        # counters added once per pair, not the default once per group and
        # program; the pairs that see their whole block not grouped apart, so
        # only the programs whose pairs all do skip the causal mask); a block of
        # several key tiles (walked per step, not loaded once); K/V loaded
        # again each step; rows prefetched; the defaults
        for variant, (tm, start, tune) in enumerate((
                                (2, 0, dict(pairs_per_program=4, aggregate_ranks=False,
                                            split_masked=False)),
                                (4, n_decode, dict(BLOCK_N=16)),
                                (2, n_decode, dict(hold_kv=False)),
                                # each step's rows loaded one step ahead; each step an
                                # online-softmax update of an empty state
                                (2, n_decode, dict(prefetch_pairs=True, pairs_per_program=8,
                                                   one_tile_softmax=False)),
                                # ... its ids, slots and positions only, the query rows
                                # loaded at each step's top
                                (2, n_decode, dict(prefetch_pairs=True, prefetch_query=False,
                                                   pairs_per_program=8)),
                                # fp8 cache, bf16 queries (GPU only): the MMA in bf16
                                (4 if ON_GPU else 1, n_decode, dict(query_mma=True)),
                                # per-token-head scales applied at each step in an
                                # fp16 MMA (the default scales the held block once)
                                (4, n_decode, dict(scale_held_kv=False)),
                                # launches of a few tokens' partials (slices of the batch);
                                # the merge reading every slot's partial, empty ones too,
                                # on a (token, head) grid
                                (2, 0, dict(partial_bytes=5 * Hq * topk * max(16, D) * 4)),
                                (2, n_decode, dict(merge_skip_empty=False,
                                                   merge_row_order=False)),
                                # 64 rows per step (GPU only): on an H200 the Gluon
                                # kernel (the default there), and the ``tl`` kernel
                                *(((4, n_decode, None), (4, n_decode, dict(sm90=False)))
                                  if ON_GPU else ()),
                                (8 if ON_GPU else 1, batch.T // 2, None))):
            if tm == 1 or (tune and "scale_held_kv" in tune and mode != 2):
                continue
            # CPU (the interpreter, CI's longest test): each variant in half of the
            # (case, shape) pairs, both shapes, every scale mode; the defaults in all
            if not ON_GPU and tune is not None and (variant + case_index + shape) % 2:
                continue
            out = torch.full_like(q, float("nan"))
            got = block_sparse_attention(q, kv, batch.block_table, batch.token_req,
                                         batch.token_pos, sel, B, scale, mode, ks, vs, kvs,
                                         fold_scalar_scales=fold, out=out, block_major=tm,
                                         tile_start=start, _tune=tune)
            assert got.data_ptr() == out.data_ptr()
            # unfolded scalar scales with a bf16 MMA (query_mma): every K and V element
            # is scaled and then rounded to bf16 (8 significant bits), which folding
            # avoids; make_kv_cache's unfolded oracle rounds to fp16 (the default
            # unfolded MMA), so this variant gets an oracle over the bf16-rounded cache.
            # (Against the fp16 one at twice the atol it failed on the H200: run 13,
            # 0.0617 off against 0.06 at 1x; run 55, seed 1682697082, 0.1248 against
            # 0.12 at 2x.)
            ref_v = ref
            if not fold and tune and tune.get("query_mma"):
                ref_v = ref_attention(batch, q, scaled_cache(kv, ks, vs, dtype), sel, B, scale)
            torch.testing.assert_close(
                got.double(), ref_v, atol=atol, rtol=rtol,
                msg=lambda m: f"[seed {seed} mode {mode} fold {fold} block_major {tm} "
                              f"start {start} tune {tune}] {m}")


@pytest.mark.parametrize("layout", ["per_token", "token_tile", "block_major"])
def test_block_sparse_attention_cleared_tokens(layout):
    """Tokens whose selections are all -1 (the backend's densely attended
    spans, ``dense_prefix``) leave every other token's output exact, in each
    prefill layout; their own rows are overwritten by the backend."""
    seed = _seed()
    dtype = DTYPES[-1]
    Hq, Hkv, D, _, B, page, topk = SHAPES[0]
    batch = Batch([(5 * B + 3, 1), (0, 2 * B + 5), (B, B + 3)], page)
    sel = shared_selection(batch, Hkv, topk, B)
    cleared = torch.zeros(batch.T, dtype=torch.bool, device=DEVICE)
    cleared[1:1 + B] = True  # the second request's first B tokens
    cleared[batch.T - 3:] = True  # and the last request's last 3
    sel[cleared] = -1
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    kw = dict(per_token={}, token_tile=dict(token_tile=4),
              block_major=dict(block_major=4 if ON_GPU else 2))[layout]
    kv, ks, vs, kvs, deq = make_kv_cache(batch, Hkv, D, dtype, 0, True)
    ref = ref_attention(batch, q, deq, sel, B, D ** -0.5)
    out = torch.full_like(q, float("nan"))
    block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos, sel,
                           B, D ** -0.5, 0, ks, vs, kvs, out=out, tile_start=1, **kw)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out[~cleared].double(), ref[~cleared], atol=atol, rtol=rtol,
                               msg=lambda m: f"[seed {seed} {layout}] {m}")


@pytest.mark.parametrize("aggregate,group_block,split", [(True, 1024, True), (True, 64, False),
                                                         (False, 1024, False), (False, 64, True)])
def test_block_major_tiles_cover_every_pair_once(aggregate, group_block, split):
    """The device-side grouping (a counting sort): every valid (token, slot)
    pair lands exactly once in the segment of its (request, KV head, block)
    group, the per-group program counts add up, and the static program count
    covers them (no host sync); with the counters added once per group and
    program (``aggregate``) or once per pair, in one program or several (the
    last one partly past the pairs); with ``split`` (``token_pos`` given) each
    group in two, the pairs whose token does not see the block's last key in
    the odd one."""
    from vllm.models.minimax_m3.common.triton_ops.attention import block_major_tiles
    _seed()
    T, Hkv, topk, R, max_blocks, TM, SB = 37, 2, 5, 3, 9, 4, 4
    req = torch.randint(0, R, (T,), dtype=torch.int32, device=DEVICE)
    pos = torch.randint(0, max_blocks * SB, (T,), dtype=torch.int32, device=DEVICE)
    pos[:9] = 2 * SB + SB - 1  # sees all of block 2 (the large group), its last key too
    sel = torch.randint(-1, max_blocks, (T, Hkv, topk), dtype=torch.int32, device=DEVICE)
    sel[0, 0, :] = 2  # a group larger than one program
    sel[1:9, 0, 0] = 2
    req[:9] = 1
    pair_tok, pair_slot, start, counts, tile_end, num_tiles = (
        x.cpu() if isinstance(x, torch.Tensor) else x
        for x in block_major_tiles(req, sel, R, max_blocks, TM, aggregate=aggregate,
                                   group_block=group_block,
                                   token_pos=pos if split else None, sparse_block=SB))
    req, sel, pos = req.cpu(), sel.cpu(), pos.cpu()
    want = {}
    for t in range(T):
        for h in range(Hkv):
            for s in range(topk):
                b = int(sel[t, h, s])
                if b >= 0:
                    key = (int(req[t]) * Hkv + h) * max_blocks + b
                    if split:
                        key = 2 * key + int(int(pos[t]) < b * SB + SB - 1)
                    want.setdefault(key, []).append((t, s))
    assert int(counts.sum()) == sum(len(v) for v in want.values())
    assert int(counts.max()) > TM
    if split:  # both halves hold pairs
        assert {k % 2 for k in want} == {0, 1}
    assert counts.numel() == R * Hkv * max_blocks * (2 if split else 1)
    for key in range(counts.numel()):
        got = [(int(pair_tok[p]), int(pair_slot[p]))
               for p in range(int(start[key]), int(start[key]) + int(counts[key]))]
        assert sorted(got) == sorted(want.get(key, [])), key
    programs = (counts + TM - 1) // TM
    assert torch.equal(tile_end, torch.cumsum(programs, 0).to(torch.int32))
    assert num_tiles >= int(tile_end[-1])


def test_block_major_bad_input():
    Hq, Hkv, D, _, B, page, topk = SHAPES[0]
    batch = Batch([(0, 5)], page)
    q = torch.randn(batch.T, Hq, D, device=DEVICE)
    kv, _, _, _, _ = make_kv_cache(batch, Hkv, D, torch.float32, 0)
    sel = random_selection(batch, Hkv, topk, B)
    args = (q, kv, batch.block_table, batch.token_req, batch.token_pos, sel, B, 1.0)
    with pytest.raises(ValueError, match="block_major must be a power of two"):
        block_sparse_attention(*args, block_major=3)
    with pytest.raises(ValueError, match="pick one"):
        block_sparse_attention(*args, block_major=4, token_tile=4)


@pytest.mark.parametrize("case", list(TILE_CASES))
@pytest.mark.parametrize("selection", ["random", "shared"])
def test_block_sparse_attention_token_tiles(case, selection):
    """``token_tile``: one program per tile of consecutive tokens walking the
    union of their selected blocks (decodes and prefill tokens of several
    requests may share a tile) equals the oracle, every KV scale mode."""
    seed = _seed()
    dtype = DTYPES[-1]
    Hq, Hkv, D, _, B, page, topk = SHAPES[1] if ON_GPU else SHAPES[0]
    reqs = TILE_CASES[case](B)
    batch = Batch(reqs, page)
    n_decode = next((i for i, (_, n) in enumerate(reqs) if n != 1), len(reqs))
    pick = random_selection if selection == "random" else shared_selection
    sel = pick(batch, Hkv, topk, B)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    scale = D ** -0.5
    tiles = (2, 4) if not ON_GPU else (2, 4, 8)
    for mode, fold, (kv, ks, vs, kvs), ref, atol, rtol in scale_mode_cases(
            batch, q, sel, Hkv, D, B, dtype):
        for tm in tiles:
            # tile_start: the batch's decode tokens (listed first) one per program,
            # or an arbitrary split point
            for start in sorted({0, n_decode, batch.T // 2}):
                out = torch.full_like(q, float("nan"))
                got = block_sparse_attention(q, kv, batch.block_table, batch.token_req,
                                             batch.token_pos, sel, B, scale, mode, ks, vs, kvs,
                                             fold_scalar_scales=fold, out=out, token_tile=tm,
                                             tile_start=start)
                assert got.data_ptr() == out.data_ptr()
                torch.testing.assert_close(
                    got.double(), ref, atol=atol, rtol=rtol,
                    msg=lambda m: f"[seed {seed} mode {mode} fold {fold} tile {tm} "
                                  f"start {start}] {m}")


# launch variants of the per-token kernel: name -> its keyword arguments, for a
# sparse block of B keys
PER_TOKEN_VARIANTS = {
    # the next key tile's selection slot and pages resolved one tile ahead, with
    # one and with two key tiles per sparse block, the selection split or not; and
    # not (the default with per-token-head scales where blocks are not key-split)
    "prefetch_rows": lambda B: [dict(num_splits=s, _tune=dict(prefetch_rows=True, BLOCK_N=n))
                                for n, s in ((B, 1), (B // 2, 1), (B // 2, 2))]
    + [dict(num_splits=1, _tune=dict(prefetch_rows=False))],
    # every selected block split into key ranges, one program each, merged with
    # the other splits by log-sum-exp in the merge launch or the fused merge
    "key_split": lambda B: [dict(num_splits=1, _tune=dict(key_split=2)),
                            dict(num_splits=2, fused_merge=True, _tune=dict(key_split=2)),
                            dict(_tune=dict(key_split=B // 16))],
}


@pytest.mark.parametrize("variant", list(PER_TOKEN_VARIANTS))
@pytest.mark.parametrize("case", ["short", "mixed"])
def test_block_sparse_attention_per_token_variants(case, variant):
    """Each launch variant of the per-token kernel (``PER_TOKEN_VARIANTS``)
    equals the oracle, every KV scale mode."""
    seed = _seed()
    dtype = DTYPES[-1]
    Hq, Hkv, D, _, B, page, topk = SHAPES[1]  # sparse block 32 on CPU: two 16-key tiles
    batch = Batch(ATTN_CASES[case](B), page)
    sel = random_selection(batch, Hkv, topk, B)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    scale = D ** -0.5
    for mode, fold, (kv, ks, vs, kvs), ref, atol, rtol in scale_mode_cases(
            batch, q, sel, Hkv, D, B, dtype):
        for kw in PER_TOKEN_VARIANTS[variant](B):
            out = torch.full_like(q, float("nan"))
            got = block_sparse_attention(
                q, kv, batch.block_table, batch.token_req, batch.token_pos, sel, B, scale,
                mode, ks, vs, kvs, fold_scalar_scales=fold, out=out, **kw)
            torch.testing.assert_close(
                got.double(), ref, atol=atol, rtol=rtol,
                msg=lambda m: f"[seed {seed} mode {mode} fold {fold} {kw}] {m}")


def test_block_sparse_attention_token_tile_must_be_pow2():
    batch = Batch([(0, 3)], SHAPES[0][5])
    Hq, Hkv, D, _, B, page, topk = SHAPES[0]
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(DTYPES[0])
    kv, *_ = make_kv_cache(batch, Hkv, D, DTYPES[0], 0)
    sel = random_selection(batch, Hkv, topk, B)
    with pytest.raises(ValueError, match="token_tile"):
        block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                               sel, B, 0.1, token_tile=3)


@pytest.mark.parametrize("Hq,Hkv", [(5, 1), (6, 2)] if not ON_GPU else [(24, 1), (48, 4)])
def test_block_sparse_attention_odd_groups(Hq, Hkv):
    """GQA group sizes that are not powers of two (5, 3 / 24, 12)."""
    seed = _seed()
    dtype = DTYPES[0]
    _, _, D, _, B, page, topk = SHAPES[0]
    reqs = [(4 * B + 5, 1), (B - 3, 5)]
    batch = Batch(reqs, page)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    kv, _, _, _, deq = make_kv_cache(batch, Hkv, D, dtype, 0)
    sel = random_selection(batch, Hkv, topk, B)
    ref = ref_attention(batch, q, deq, sel, B, 0.3)
    atol, rtol = tol(dtype)
    for splits in (1, 2):
        out = torch.full_like(q, float("nan"))
        got = block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                                     sel, B, 0.3, out=out, num_splits=splits)
        torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol,
                                   msg=lambda m: f"[seed {seed} splits {splits}] {m}")


def test_block_sparse_attention_head_dim_128():
    if ON_GPU:
        pytest.skip("covered by the real-shape tests on the GPU")
    seed = _seed()
    batch = Batch([(40, 1), (0, 5)], 16)
    q = torch.randn(batch.T, 16, 128, device=DEVICE, dtype=torch.float16)
    kv, _, _, _, deq = make_kv_cache(batch, 1, 128, torch.float16, 0)
    sel = random_selection(batch, 1, 2, 16, full_prob=1.0)
    ref = ref_attention(batch, q, deq, sel, 16, 128 ** -0.5)
    got = block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                                 sel, 16, 128 ** -0.5, out=torch.full_like(q, float("nan")))
    torch.testing.assert_close(got.double(), ref, atol=3e-3, rtol=1e-2,
                               msg=lambda m: f"[seed {seed}] {m}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_msa_pipeline_end_to_end(dtype):
    """index_block_topk feeding block_sparse_attention vs the oracle pipeline."""
    seed = _seed()
    Hq, Hkv, D, Didx, B, page, topk = SHAPES[-1]
    reqs = [(4 * B + 2, 1), (9, 1), (2 * B - 7, 10), (0, 12)]
    batch = Batch(reqs, page)
    idx_q = torch.randn(batch.T, Hkv, Didx, device=DEVICE).to(dtype)
    idx_k, _ = make_idx_cache(batch, Didx, dtype)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    kv, _, _, _, deq = make_kv_cache(batch, Hkv, D, dtype, 0)
    sel = index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req, batch.token_pos,
                           B, topk, num_decode_tokens=2)
    scores = ref_block_scores(batch, idx_q, idx_k, B, 1, 0)
    check_topk(sel, scores, topk, tag=f"[seed {seed}]")
    ref = ref_attention(batch, q, deq, sel, B, D ** -0.5)
    got = block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                                 sel, B, D ** -0.5)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol,
                               msg=lambda m: f"[seed {seed}] {m}")


def test_pdl_switch_and_rule(monkeypatch):
    """VLLM_MINIMAX_M3_PDL: 1 always, 0 never, unset for launches of at most
    PDL_MAX_TOKENS tokens; a clear error otherwise; the launch override ``pdl`` wins; never
    where PDL is unsupported (CPU, ROCm, the interpreter, before sm90)."""
    from vllm.models.minimax_m3.common.triton_ops import _utils
    name = "VLLM_MINIMAX_M3_PDL"
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(_utils, "pdl_supported", lambda device: device.type == "cuda")
    monkeypatch.delenv(name, raising=False)
    n = _utils.PDL_MAX_TOKENS
    assert _utils.use_pdl(cuda, {}, 1) and _utils.use_pdl(cuda, {}, n)
    assert not _utils.use_pdl(cuda, {}, n + 1)
    assert _utils.use_pdl(cuda, {"pdl": True}, 4 * n)
    assert not _utils.use_pdl(cuda, {"pdl": False}, 1)
    monkeypatch.setenv(name, "1")
    assert _utils.use_pdl(cuda, {}, 4 * n)
    monkeypatch.setenv(name, "0")
    assert not _utils.use_pdl(cuda, {}, 1)
    assert not _utils.use_pdl(torch.device("cpu"), {"pdl": True}, 1)
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ValueError, match=f"{name} must be 0 or 1"):
        _utils.use_pdl(cuda, {}, 1)


def test_launch_overrides_are_a_scoped_benchmark_hook():
    """The product's kernel wrappers take no launch-shape overrides; a
    benchmark sets them per op in a ``launch_overrides`` block (nested blocks
    add to it; each op reads its own; nothing outside)."""
    import inspect

    from vllm.models.minimax_m3.common.triton_ops import _utils, launch_overrides

    for fn in (triton_ops.block_sparse_attention, triton_ops.index_block_topk,
               triton_ops.score_attend_decode):
        assert "_tune" not in inspect.signature(fn).parameters, fn.__name__
    assert dict(_utils.launch_tune("attention")) == {}
    with launch_overrides("attention", sm90=False, num_warps=8):
        with launch_overrides("attention", num_warps=4), launch_overrides("index", pdl=True):
            assert dict(_utils.launch_tune("attention")) == dict(sm90=False, num_warps=4)
            assert dict(_utils.launch_tune("index")) == dict(pdl=True)
            assert dict(_utils.launch_tune("score_attend")) == {}
        assert dict(_utils.launch_tune("attention")) == dict(sm90=False, num_warps=8)
        assert dict(_utils.launch_tune("index")) == {}
    assert dict(_utils.launch_tune("attention")) == {}
    with pytest.raises(ValueError, match="op must be one of"):
        with launch_overrides("attn", sm90=False):
            pass


def decode_chain_buffers(batch):
    """bf16 caches and buffers of a decode chain at ``SHAPES[0]``: (index-key
    cache, KV cache, index queries, queries, selection, output); the queries
    and outputs are left for the test to fill."""
    Hq, Hkv, D, Didx, _, _, topk = SHAPES[0]
    idx_k, _ = make_idx_cache(batch, Didx, torch.bfloat16)
    kv, _, _, _, _ = make_kv_cache(batch, Hkv, D, torch.bfloat16, 0)
    idx_q = torch.empty(batch.T, Hkv, Didx, device=DEVICE, dtype=torch.bfloat16)
    q = torch.empty(batch.T, Hq, D, device=DEVICE, dtype=torch.bfloat16)
    sel = torch.empty(batch.T, Hkv, topk, dtype=torch.int32, device=DEVICE)
    return idx_k, kv, idx_q, q, sel, torch.empty_like(q)


@pytest.mark.skipif(not ON_GPU, reason="programmatic dependent launch needs a CUDA GPU "
                    "(sm90+); on the H200: ci/gpu_series_tests.sh kernels")
@pytest.mark.parametrize("one_launch", [False, True])
def test_decode_chain_pdl_in_cuda_graph(one_launch):
    """The decode chain (index scoring, top-k select, attention, merge; with
    ``one_launch`` the select and the merge fused into the launches before
    them) with programmatic dependent launch, captured in one CUDA graph and
    replayed on fresh queries: every replay equals the chain launched without
    PDL, so each kernel waited for the selection / partials before it."""
    from vllm.models.minimax_m3.common.triton_ops._utils import pdl_supported
    if not pdl_supported(DEVICE):
        pytest.skip("needs sm90+ with Triton grid dependency control")
    seed = _seed()
    Hq, Hkv, D, Didx, B, page, topk = SHAPES[0]
    batch = Batch([(40 * B + 3, 1), (7 * B, 1), (300 * B - 1, 1), (B // 2, 1)] * 8, page)
    idx_k, kv, idx_q, q, sel, out = decode_chain_buffers(batch)

    def chain(sel, out, tune):
        index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req, batch.token_pos, B,
                         topk, out=sel, num_decode_tokens=batch.T, fused_select=one_launch,
                         _tune=tune)
        block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos, sel,
                               B, D ** -0.5, out=out, fused_merge=one_launch, _tune=tune)

    idx_q.normal_()
    q.normal_()
    chain(sel, out, dict(pdl=True))  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain(sel, out, dict(pdl=True))
    ref_sel, ref_out = torch.empty_like(sel), torch.empty_like(out)
    for rep in range(5):
        idx_q.normal_()
        q.normal_()
        sel.fill_(-7)
        out.fill_(float("nan"))
        g.replay()
        chain(ref_sel, ref_out, dict(pdl=False))
        torch.cuda.synchronize()
        assert torch.equal(sel, ref_sel), f"[seed {seed} replay {rep}] selections differ"
        assert torch.equal(out, ref_out), f"[seed {seed} replay {rep}] outputs differ"
    if one_launch:
        assert_counters_zero()


def test_default_key_split_rule():
    """Blocks split in key ranges only while the programs fit the SMs, in
    ranges of whole 16-key tiles."""
    from vllm.models.minimax_m3.common.triton_ops.attention import (DECODE_KEY_SPLIT,
                                                                    default_key_split)
    assert default_key_split(16, 128, 132) == DECODE_KEY_SPLIT  # batch 1, top-16
    assert default_key_split(32, 128, 132) == DECODE_KEY_SPLIT  # batch 2
    assert default_key_split(64, 128, 132) == 1  # batch 4: 256 programs
    assert default_key_split(16, 32, 132) == 2  # 16-key ranges, not 8
    assert default_key_split(16, 16, 132) == 1
    assert default_key_split(16, 128, 4) == 1  # the CPU stand-in SM count


def test_default_decode_select_rule():
    """Decode rows of at most 64 blocks are ranked, rows of 65-256 blocks take
    the threshold search on one warp in the select launch (the fused select keeps
    arg-max rounds there), longer rows arg-max rounds; tune forces either."""
    from vllm.models.minimax_m3.common.triton_ops.indexer import decode_select
    assert decode_select(64, 64, False, {}) == (True, False, 1)
    assert decode_select(64, 64, True, {}) == (True, False, 1)
    assert decode_select(256, 256, False, {}) == (False, True, 1)
    assert decode_select(128, 100, False, {}) == (False, True, 1)
    assert decode_select(256, 256, True, {}) == (False, False, 2)
    assert decode_select(1024, 1024, False, {}) == (False, False, 4)
    assert decode_select(256, 1024, False, {}) == (False, False, 2)  # several chunks
    assert decode_select(1024, 1024, False, dict(radix_select=True)) == (False, True, 1)
    assert decode_select(256, 256, False, dict(radix_select=False)) == (False, False, 2)
    assert decode_select(64, 64, False, dict(rank_select=False, select_warps=2)) == (
        False, False, 2)


def test_sm90_prefill_index_rule():
    """Which prefill index launches the sm_90 Gluon kernel covers (on an sm_90
    device): bf16 / fp16 keys of the queries' dtype, index dim = sparse block =
    128, pages tiling a block, rows of at most 2048 blocks, a score buffer of
    at most 256 MiB; everything else takes the tl kernel. Off a GPU never."""
    from vllm.models.minimax_m3.common.triton_ops.index_score_prefill_sm90 import (
        sm90_index_fits, sm90_index_supported)

    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    ok = dict(q_dtype=bf16, k_dtype=bf16, k_scaled=False, dim=128, sparse_block=128,
              page_size=64, rows=8192, heads=1, max_blocks=1024)
    assert sm90_index_fits(**ok)
    assert sm90_index_fits(**dict(ok, q_dtype=f16, k_dtype=f16, page_size=128))
    assert sm90_index_fits(**dict(ok, rows=32768, heads=2))  # exactly 256 MiB
    for bad in (dict(q_dtype=f32, k_dtype=f32), dict(k_dtype=torch.float8_e4m3fn),
                dict(k_dtype=f16), dict(k_scaled=True), dict(dim=64), dict(sparse_block=64),
                dict(page_size=96), dict(max_blocks=2049), dict(rows=32769, heads=2)):
        assert not sm90_index_fits(**dict(ok, **bad)), bad
    q = torch.zeros(4, 1, 128, dtype=bf16)
    assert not sm90_index_supported(q, q, False, 128, 64, 4, 1, 8)  # a CPU tensor


def test_default_prefetch_rows_rule():
    """The per-token kernel resolves rows one tile ahead by default only with
    per-token-head scales (kernel mode 2), never instead of a key split or
    with the in-kernel selection."""
    from vllm.models.minimax_m3.common.triton_ops.attention import default_prefetch_rows
    assert default_prefetch_rows(2, 1, False)
    assert not default_prefetch_rows(2, 4, False)  # batch 1-2: key ranges instead
    assert not default_prefetch_rows(2, 1, True)  # select_topk runs without it
    for mode in (0, 1, 3):  # bf16, scalar fp8 folded and unfolded
        assert not default_prefetch_rows(mode, 1, False)


@pytest.mark.parametrize("num_reqs", [1, 2])
def test_decode_key_split_in_cuda_graph(num_reqs):
    """Batch 1 and 2 at real shapes take the key-split launch by default
    (every selected block over 4 programs, 64 partials per token): captured
    with the index in one CUDA graph and replayed on fresh queries, it equals
    the same launch run eagerly and matches one program per block."""
    if not ON_GPU:
        pytest.skip("needs a GPU: the key-split rule counts the GPU's SMs (the launch "
                    "itself runs on CPU in test_block_sparse_attention_per_token_variants)")
    from vllm.models.minimax_m3.common.triton_ops._utils import num_sms
    from vllm.models.minimax_m3.common.triton_ops.attention import default_key_split
    seed = _seed()
    Hq, Hkv, D, Didx, B, page, topk = SHAPES[0]
    assert default_key_split(num_reqs * Hkv * topk, B, num_sms(DEVICE)) > 1
    batch = Batch([(64 * B - 5, 1), (17 * B + 3, 1)][:num_reqs], page)
    idx_k, kv, idx_q, q, sel, out = decode_chain_buffers(batch)

    def chain(out, tune=None):
        index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req, batch.token_pos, B,
                         topk, out=sel, num_decode_tokens=batch.T)
        block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos, sel,
                               B, D ** -0.5, out=out, _tune=tune)

    check_graph_replays(chain, lambda o: chain(o, dict(key_split=1)), (idx_q, q), out, seed)


def check_graph_replays(step, reference, inputs, out, seed, reps=3, eager_step=None):
    """``step(out)`` captured in a CUDA graph (after one eager call on fresh
    ``inputs``, which compiles outside the capture), then per replay on fresh
    ``inputs``: the graph's output equals ``eager_step`` (default ``step``)
    run eagerly and matches ``reference(o)`` within the bf16 tolerance."""
    for x in inputs:
        x.normal_()
    step(out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(out)
    eager, ref = torch.empty_like(out), torch.empty_like(out)
    atol, rtol = tol(torch.bfloat16)
    for rep in range(reps):
        for x in inputs:
            x.normal_()
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        (eager_step or step)(eager)
        reference(ref)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"[seed {seed} replay {rep}] graph and eager differ"
        torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol,
                                   msg=lambda m: f"[seed {seed} replay {rep}] {m}")


def test_block_sparse_attention_bad_input():
    batch = Batch([(4, 1)], 8)
    q = torch.randn(1, 4, 16, device=DEVICE)
    kv, _, _, _, _ = make_kv_cache(batch, 1, 16, torch.float32, 0)
    sel = torch.zeros(1, 1, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="kv_scale_mode 1"):
        block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                               sel, 16, 1.0, kv_scale_mode=1)
    with pytest.raises(ValueError, match="key_split"):
        block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                               sel, 16, 1.0, _tune=dict(key_split=3))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        block_sparse_attention(torch.randn(1, 3, 16, device=DEVICE), kv.expand(-1, -1, -1, 2, -1),
                               batch.block_table, batch.token_req, batch.token_pos,
                               sel.expand(-1, 2, -1), 16, 1.0)


# --------------------------------------------------------------------------
# the model helper's PyTorch reference backend, when present
# --------------------------------------------------------------------------
def test_against_reference_sparse_ops():
    try:
        from vllm.models.minimax_m3.common import sparse_ops
    except ImportError as e:
        pytest.skip(f"reference backend sparse_ops not importable: {e}")
    if not (hasattr(sparse_ops, "index_block_topk") and hasattr(sparse_ops, "block_sparse_attention")):
        pytest.skip("sparse_ops lacks index_block_topk / block_sparse_attention")
    seed = _seed()
    dtype = DTYPES[0]
    Hq, Hkv, D, Didx, B, page, topk = SHAPES[-1]
    reqs = [(3 * B + 4, 1), (B + 2, 17), (0, 9)]
    batch = Batch(reqs, page)
    idx_q = torch.randn(batch.T, Hkv, Didx, device=DEVICE).to(dtype)
    idx_k, _ = make_idx_cache(batch, Didx, dtype)
    idx_k = torch.nan_to_num(idx_k)  # the reference may read whole pages
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    kv, _, _, _, _ = make_kv_cache(batch, Hkv, D, dtype, 0)
    kv = torch.nan_to_num(kv)
    args = (batch.block_table, batch.token_req, batch.token_pos)
    ref_sel = sparse_ops.index_block_topk(idx_q, idx_k, *args, B, topk, 1, 0)
    got_sel = index_block_topk(idx_q, idx_k, *args, B, topk, 1, 0)
    scores = ref_block_scores(batch, idx_q, idx_k, B, 1, 0)
    check_topk(ref_sel.to(torch.int32), scores, topk, tag=f"[seed {seed} sparse_ops]")
    check_topk(got_sel, scores, topk, tag=f"[seed {seed} triton]")
    ref = sparse_ops.block_sparse_attention(q, kv, *args, got_sel, B, D ** -0.5, 0, None, None, None)
    got = block_sparse_attention(q, kv, *args, got_sel, B, D ** -0.5)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got.float(), ref.float(), atol=atol, rtol=rtol,
                               msg=lambda m: f"[seed {seed}] {m}")
