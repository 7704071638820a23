# SPDX-License-Identifier: Apache-2.0
"""``score_attend_decode`` (every visible block scored and attended, the top-k
merged) against the dense float64 oracle and against the decode chain
(``index_block_topk`` then ``block_sparse_attention``), fresh random inputs,
poisoned outputs and cache slots; in the Triton interpreter on CPU, compiled
at the model's real shapes on a GPU.  Fixtures and the oracle:
``test_minimax_m3_triton_msa``."""

import pytest
import torch
from test_minimax_m3_triton_msa import (DEVICE, DTYPES, ON_GPU, SHAPES, Batch, _seed,
                                        check_graph_replays, decode_chain_buffers,
                                        make_idx_cache, make_kv_cache, scale_mode_cases, tol)

from tuned_kernels import tuned

from vllm.models.minimax_m3.common import triton_ops
from vllm.models.minimax_m3.common.triton_ops import (block_sparse_attention, index_block_topk,
                                                      score_attend_fits)
from vllm.models.minimax_m3.common.triton_ops._utils import pdl_supported

# ``_tune=dict(...)``: the call inside ``triton_ops.launch_overrides`` (tuned_kernels)
score_attend_decode = tuned("score_attend", triton_ops.score_attend_decode)

# decode requests (tokens already cached, 1 new): inside one block, on a block
# boundary, fewer visible blocks than top-k, several, and (on a GPU) rows up to
# the 64 blocks the rank select takes
DECODE_REQS = {
    "one_block": lambda B: [(B // 3, 1)],
    "boundary_and_few": lambda B: [(3 * B - 1, 1), (B + 4, 1)],
    "many": lambda B: [(9 * B + 6, 1), (0, 1), (4 * B, 1), (2 * B - 1, 1)],
}
if ON_GPU:
    DECODE_REQS["long"] = lambda B: [(62 * B + 5, 1), (40 * B + 7, 1)]


def decode_inputs(shape, reqs, dtype, idx_fp8=False):
    Hq, Hkv, D, Didx, B, page, topk = shape
    batch = Batch(reqs, page)
    idx_q = torch.randn(batch.T, Hkv, Didx, device=DEVICE).to(dtype)
    idx_k, idx_s = make_idx_cache(batch, Didx, dtype, fp8=idx_fp8)
    q = torch.randn(batch.T, Hq, D, device=DEVICE).to(dtype)
    return batch, idx_q, idx_k, idx_s, q


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(DECODE_REQS))
def test_score_attend_decode(case, shape, dtype):
    """Every KV scale mode: the oracle's attention over the blocks the index
    selects, and the decode chain's output (the same blocks: a different
    selection would not match)."""
    seed = _seed()
    Hq, Hkv, D, Didx, B, page, topk = shape
    batch, idx_q, idx_k, _, q = decode_inputs(shape, DECODE_REQS[case](B), dtype)
    args = (batch.block_table, batch.token_req, batch.token_pos)
    sel = index_block_topk(idx_q, idx_k, *args, B, topk, num_decode_tokens=batch.T)
    for mode, fold, (kv, ks, vs, kvs), ref, atol, rtol in scale_mode_cases(
            batch, q, sel, Hkv, D, B, dtype):
        chain = block_sparse_attention(q, kv, *args, sel, B, D ** -0.5, mode, ks, vs, kvs,
                                       fold_scalar_scales=fold)
        out = torch.full_like(q, float("nan"))
        got = score_attend_decode(idx_q, idx_k, q, kv, *args, B, topk, 1, 0, D ** -0.5, mode,
                                  ks, vs, kvs, fold_scalar_scales=fold, out=out)
        assert got is out
        # the other merge (one round of loads at batch 1 by default, else after the ranks)
        other = score_attend_decode(idx_q, idx_k, q, kv, *args, B, topk, 1, 0, D ** -0.5, mode,
                                    ks, vs, kvs, fold_scalar_scales=fold,
                                    _tune=dict(merge_one_round=batch.T > 1, merge_chunks=2))
        where = f"[seed {seed} mode {mode} fold {fold}]"
        torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol,
                                   msg=lambda m: f"{where} oracle: {m}")
        torch.testing.assert_close(got.float(), chain.float(), atol=atol, rtol=rtol,
                                   msg=lambda m: f"{where} chain: {m}")
        torch.testing.assert_close(other.float(), got.float(), atol=atol, rtol=rtol,
                                   msg=lambda m: f"{where} other merge: {m}")


def test_score_attend_decode_several_key_tiles_per_range():
    """A 48-key sparse block (one key range of three 16-key tiles: only the
    first tile's pages are resolved before the PDL wait, the others in the
    walk) and head_dim 256 (attention tiles of 32 keys): oracle and chain in
    every scale mode."""
    seed = _seed()
    shape = (4, 1, 256, 16, 48, 16, 3)
    Hq, Hkv, D, Didx, B, page, topk = shape
    batch, idx_q, idx_k, _, q = decode_inputs(shape, [(5 * B + 7, 1), (2 * B - 1, 1)],
                                              torch.float32)
    args = (batch.block_table, batch.token_req, batch.token_pos)
    sel = index_block_topk(idx_q, idx_k, *args, B, topk, num_decode_tokens=batch.T)
    for mode, fold, (kv, ks, vs, kvs), ref, atol, rtol in scale_mode_cases(
            batch, q, sel, Hkv, D, B, torch.float32):
        chain = block_sparse_attention(q, kv, *args, sel, B, D ** -0.5, mode, ks, vs, kvs,
                                       fold_scalar_scales=fold)
        got = score_attend_decode(idx_q, idx_k, q, kv, *args, B, topk, 1, 0, D ** -0.5, mode,
                                  ks, vs, kvs, fold_scalar_scales=fold,
                                  out=torch.full_like(q, float("nan")))
        where = f"[seed {seed} mode {mode} fold {fold}]"
        torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol,
                                   msg=lambda m: f"{where} oracle: {m}")
        torch.testing.assert_close(got, chain, atol=atol, rtol=rtol,
                                   msg=lambda m: f"{where} chain: {m}")


@pytest.mark.parametrize("local,init", [(2, 1), (1, 2)])
def test_score_attend_decode_fp8_index_and_forced_blocks(local, init):
    """fp8 index keys with per-token scales, more forced local and initial
    blocks: the same output as the chain with those settings."""
    seed = _seed()
    shape = SHAPES[0]
    Hq, Hkv, D, Didx, B, page, topk = shape
    dtype = DTYPES[-1]
    batch, idx_q, idx_k, idx_s, q = decode_inputs(
        shape, [(7 * B + 3, 1), (5 * B - 1, 1), (B // 2, 1)], dtype, idx_fp8=True)
    args = (batch.block_table, batch.token_req, batch.token_pos)
    kv, *_ = make_kv_cache(batch, Hkv, D, dtype, 0)
    sel = index_block_topk(idx_q, idx_k, *args, B, topk, local, init, idx_k_scales=idx_s,
                           num_decode_tokens=batch.T)
    chain = block_sparse_attention(q, kv, *args, sel, B, D ** -0.5)
    got = score_attend_decode(idx_q, idx_k, q, kv, *args, B, topk, local, init, D ** -0.5,
                              idx_k_scales=idx_s)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got.float(), chain.float(), atol=atol, rtol=rtol,
                               msg=lambda m: f"[seed {seed}] {m}")


def test_score_attend_fits_rule():
    """Rows of at most 64 blocks, and one program per block, token and KV head
    within the SM count."""
    assert score_attend_fits(1, 1, 64, 132)  # batch 1 at 8k context
    assert score_attend_fits(2, 1, 64, 132)  # batch 2
    assert not score_attend_fits(3, 1, 64, 132)  # 192 programs
    assert not score_attend_fits(1, 1, 65, 132)  # a row too long for the rank select
    assert not score_attend_fits(1, 4, 64, 132)
    assert score_attend_fits(4, 4, 8, 132)
    assert not score_attend_fits(0, 1, 8, 132)


def test_score_attend_decode_bad_input():
    shape = SHAPES[0]
    Hq, Hkv, D, Didx, B, page, topk = shape
    dtype = DTYPES[0]
    batch, idx_q, idx_k, _, q = decode_inputs(shape, [(2 * B + 1, 1), (B, 1)], dtype)
    args = (batch.block_table, batch.token_req, batch.token_pos)
    kv, *_ = make_kv_cache(batch, Hkv, D, dtype, 0)
    wide = torch.zeros((batch.block_table.shape[0], 65 * B // page), dtype=torch.int32,
                       device=DEVICE)
    with pytest.raises(ValueError, match="at most 64 sparse blocks"):
        score_attend_decode(idx_q, idx_k, q, kv, wide, *args[1:], B, topk, 1, 0, 1.0)
    with pytest.raises(ValueError, match="one index head per KV head"):
        score_attend_decode(idx_q[:, :1].repeat(1, Hkv + 1, 1), idx_k, q, kv, *args, B, topk,
                            1, 0, 1.0)
    with pytest.raises(ValueError, match="fp8 kv_cache needs kv_scale_mode"):
        score_attend_decode(idx_q, idx_k, q, kv.to(torch.float8_e4m3fn), *args, B, topk, 1, 0,
                            1.0)
    with pytest.raises(ValueError, match="local_blocks"):
        score_attend_decode(idx_q, idx_k, q, kv, *args, B, topk, topk + 1, 0, 1.0)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("num_reqs", [1, 2])
def test_score_attend_decode_in_cuda_graph(num_reqs, pdl):
    """Batch 1 and 2 at real shapes over 64-block tables: captured in a CUDA
    graph and replayed on fresh queries, it equals the launches run eagerly
    without PDL (with ``pdl``, so each launch waited for the one before it)
    and matches the decode chain."""
    if not ON_GPU:
        pytest.skip("needs a GPU: CUDA-graph capture (the kernels run on CPU in "
                    "test_score_attend_decode)")
    if pdl and not pdl_supported(DEVICE):
        pytest.skip("needs sm90+ with Triton grid dependency control")
    seed = _seed()
    Hq, Hkv, D, Didx, B, page, topk = SHAPES[0]
    batch = Batch([(64 * B - 5 - page, 1), (17 * B + 3, 1)][:num_reqs], page)
    assert batch.block_table.shape[1] * page // B == 64
    idx_k, kv, idx_q, q, sel, out = decode_chain_buffers(batch)
    args = (batch.block_table, batch.token_req, batch.token_pos)

    def step(o, pdl=pdl):
        score_attend_decode(idx_q, idx_k, q, kv, *args, B, topk, 1, 0, D ** -0.5, out=o,
                            _tune=dict(pdl=pdl))

    def chain(o):
        index_block_topk(idx_q, idx_k, *args, B, topk, out=sel, num_decode_tokens=batch.T)
        block_sparse_attention(q, kv, *args, sel, B, D ** -0.5, out=o)

    check_graph_replays(step, chain, (idx_q, q), out, seed,
                        eager_step=lambda o: step(o, pdl=False))
