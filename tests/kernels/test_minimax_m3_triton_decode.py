# SPDX-License-Identifier: Apache-2.0
"""``sparse_decode``: the persistent one-launch decode (index scoring, top-k,
block-sparse attention, split merge) against the float64 oracles of
test_minimax_m3_triton_msa.py and against the two-launch chain it replaces.

On CPU the kernel runs in the Triton interpreter (programs one after another:
the first takes every work item); on a GPU the programs run side by side and
wait on each other's selections (``ci/gpu_series_tests.sh kernels``).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_minimax_m3_triton_msa import (  # noqa: E402
    DEVICE, DTYPES, ON_GPU, SHAPES, Batch, _seed, assert_counters_zero, check_topk,
    make_idx_cache, make_kv_cache, ref_attention, ref_block_scores, scale_mode_cases, tol)

from vllm.models.minimax_m3.common.triton_ops import (  # noqa: E402
    block_sparse_attention, index_block_topk, sparse_decode)

# decode batches (one new token per request): B -> [(cached tokens, 1), ...]
DECODE_CASES = {
    "short": lambda B: [(B // 3, 1)],                                # < one block
    "exact_blocks": lambda B: [(3 * B - 1, 1), (2 * B, 1)],          # on a boundary
    "few_blocks_pad": lambda B: [(B + 4, 1), (0, 1)],                # < topk visible
    "many": lambda B: [(6 * B + 1, 1), (9 * B + 6, 1), (2 * B - 1, 1), (4 * B, 1), (0, 1),
                       (11 * B + 3, 1)],
}
if ON_GPU:
    DECODE_CASES["long"] = lambda B: [(32000, 1), (131071, 1), (8190, 1), (200, 1)] * 4

# launch shapes: the default, one split per token and KV head, two score blocks
# per item with arg-max rounds, and a single program that takes every item
TUNES = [None, dict(num_splits=1), dict(blocks_per_prog=2, rank_select=False, num_splits=2),
         dict(programs=1, rank_select=True)]


def _inputs(case, shape, dtype, mode, seed):
    Hq, Hkv, D, Didx, B, page, topk = shape
    batch = Batch(DECODE_CASES[case](B), page)
    idx_q = torch.randn(batch.T, Hkv, Didx, device=DEVICE).to(dtype)
    idx_k, _ = make_idx_cache(batch, Didx, dtype)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    return batch, idx_q, idx_k, q


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_sparse_decode_against_oracle(case, shape, dtype):
    """Selections as the oracle's block scores pick (up to ties), outputs as
    float64 attention over the selected blocks of the dequantised cache, for
    every KV scale mode and launch shape; the sync counters end at zero."""
    seed = _seed()
    Hq, Hkv, D, Didx, B, page, topk = shape
    batch, idx_q, idx_k, q = _inputs(case, shape, dtype, 0, seed)
    scores = ref_block_scores(batch, idx_q, idx_k, B, local=1, init=0)
    sel0 = torch.zeros(batch.T, Hkv, topk, dtype=torch.int32, device=DEVICE)
    for mode, fold, (kv, ks, vs, kvs), _, atol, rtol in scale_mode_cases(
            batch, q, sel0, Hkv, D, B, dtype):
        if mode == 1 and not fold:
            continue  # the persistent decode always folds scalar scales
        for tune in TUNES:
            out = torch.full_like(q, float("nan"))
            sel = torch.full((batch.T, Hkv, topk), -7, dtype=torch.int32, device=DEVICE)
            got, got_sel = sparse_decode(
                idx_q, idx_k, q, kv, batch.block_table, batch.token_req, batch.token_pos,
                B, topk, 1, 0, D ** -0.5, mode, ks, vs, kvs, out=out, topk_out=sel,
                _tune=tune)
            tag = f"[seed {seed} mode {mode} tune {tune}]"
            assert got.data_ptr() == out.data_ptr() and got_sel.data_ptr() == sel.data_ptr()
            check_topk(sel, scores, topk, tag=tag)
            # the oracle attends exactly the blocks the kernel selected
            ref = _ref_for(batch, q, kv, ks, vs, kvs, mode, sel, B, D)
            torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol,
                                       msg=lambda m: f"{tag} {m}")
            assert_counters_zero()


def _ref_for(batch, q, kv, ks, vs, kvs, mode, sel, B, D):
    if mode == 0:
        deq = kv.double()
    elif mode == 1:
        deq = kv.double()
        deq[:, 0] *= ks.double()
        deq[:, 1] *= vs.double()
    else:
        deq = kv.double() * kvs[..., None].double()
    return ref_attention(batch, q, deq, sel, B, D ** -0.5)


def test_sparse_decode_equals_two_launch_chain():
    """Bitwise the selection (as sets) and, to rounding, the output of
    index_block_topk followed by block_sparse_attention with the same splits."""
    seed = _seed()
    shape = SHAPES[-1]
    Hq, Hkv, D, Didx, B, page, topk = shape
    dtype = DTYPES[-1]
    batch, idx_q, idx_k, q = _inputs("many", shape, dtype, 0, seed)
    kv, _, _, _, _ = make_kv_cache(batch, Hkv, D, dtype, 0)
    ref_sel = index_block_topk(idx_q, idx_k, batch.block_table, batch.token_req,
                               batch.token_pos, B, topk, num_decode_tokens=batch.T)
    for splits in (1, 2):
        ref = block_sparse_attention(q, kv, batch.block_table, batch.token_req, batch.token_pos,
                                     ref_sel, B, D ** -0.5, num_splits=splits)
        got, sel = sparse_decode(idx_q, idx_k, q, kv, batch.block_table, batch.token_req,
                                 batch.token_pos, B, topk, 1, 0, D ** -0.5,
                                 _tune=dict(num_splits=splits))
        assert torch.equal(sel.sort(-1).values, ref_sel.sort(-1).values), f"[seed {seed}]"
        atol, rtol = tol(dtype)
        torch.testing.assert_close(got, ref, atol=atol, rtol=rtol,
                                   msg=lambda m: f"[seed {seed} splits {splits}] {m}")


def test_sparse_decode_fp8_index_cache():
    """fp8 index keys with per-token scales: the selection follows the
    dequantised keys' scores."""
    seed = _seed()
    shape = SHAPES[0]
    Hq, Hkv, D, Didx, B, page, topk = shape
    dtype = DTYPES[-1]
    batch, idx_q, _, q = _inputs("many", shape, dtype, 0, seed)
    idx_k8, idx_sc = make_idx_cache(batch, Didx, dtype, fp8=True)
    kv, _, _, _, deq = make_kv_cache(batch, Hkv, D, dtype, 0)
    got, sel = sparse_decode(idx_q, idx_k8, q, kv, batch.block_table, batch.token_req,
                             batch.token_pos, B, topk, 1, 0, D ** -0.5, idx_k_scales=idx_sc)
    scores = ref_block_scores(batch, idx_q.to(torch.float16), idx_k8, B, 1, 0, idx_sc)
    check_topk(sel, scores, topk, tag=f"[seed {seed}]")
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got.double(), ref_attention(batch, q, deq, sel, B, D ** -0.5),
                               atol=atol, rtol=rtol, msg=lambda m: f"[seed {seed}] {m}")


def test_sparse_decode_bad_input():
    Hq, Hkv, D, Didx, B, page, topk = SHAPES[-1]
    batch = Batch([(2 * B, 1)], page)
    q = torch.randn(1, Hq, D, device=DEVICE)
    kv, _, _, _, _ = make_kv_cache(batch, Hkv, D, torch.float32, 0)
    idx_k, _ = make_idx_cache(batch, Didx, torch.float32)
    args = (batch.block_table, batch.token_req, batch.token_pos, B, topk, 1, 0, D ** -0.5)
    with pytest.raises(ValueError, match="one index head per KV head"):
        sparse_decode(torch.randn(1, Hkv + 1, Didx, device=DEVICE), idx_k, q, kv, *args)
    with pytest.raises(ValueError, match="topk_out must be"):
        sparse_decode(torch.randn(1, Hkv, Didx, device=DEVICE), idx_k, q, kv, *args,
                      topk_out=torch.empty(1, Hkv, topk + 1, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="kv_scale_mode 1"):
        sparse_decode(torch.randn(1, Hkv, Didx, device=DEVICE), idx_k, q, kv, *args,
                      kv_scale_mode=1)
