# SPDX-License-Identifier: Apache-2.0
"""The dense prefix (``dense_prefix``): prefill tokens below top-k x block
attended densely equal their block-sparse attention, and the backend that
routes them there gives the same outputs as the sparse ops alone."""

import pytest
import torch

from vllm.models.minimax_m3.common import backend, dense_prefix, sparse_ops
from vllm.models.minimax_m3.common import envs as m3_envs
from vllm.models.minimax_m3.common.dense_prefix import (DenseSpan, PrefillChunk,
                                                        dense_spans, long_prefill_chunks)


def test_long_prefill_chunks_and_their_dense_spans():
    # a decode row, a first chunk of 70, a chunk of 30 from position 40, a
    # chunk of 20 from position 100, a chunk of 5
    qsl = torch.tensor([0, 1, 71, 101, 121, 126], dtype=torch.int32)
    seq_lens = torch.tensor([9, 70, 70, 120, 5], dtype=torch.int32)
    chunks = long_prefill_chunks(qsl, seq_lens, 16)
    assert chunks == (PrefillChunk(1, 70, 1, 0), PrefillChunk(71, 30, 2, 40),
                      PrefillChunk(101, 20, 3, 100))
    # dense limit 64 (top-2 of 32-token blocks): positions 0..63
    assert dense_spans(chunks, 64, 16) == (DenseSpan(1, 64, 1, 0), DenseSpan(71, 24, 2, 40))
    assert dense_spans(chunks, 64, 25) == (DenseSpan(1, 64, 1, 0),)
    assert long_prefill_chunks(qsl, None, 16) == ()  # no exact host lengths: none
    assert long_prefill_chunks(qsl, seq_lens, 0) == ()  # off


def test_min_tokens_setting(monkeypatch):
    monkeypatch.delenv("VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS", raising=False)
    assert m3_envs.VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS == dense_prefix.DEFAULT_MIN_TOKENS
    for value, want in (("0", 0), ("16", 16), ("4096", 4096)):
        monkeypatch.setenv("VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS", value)
        assert m3_envs.VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS == want
    for bad in ("8", "-1", "many"):
        monkeypatch.setenv("VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS", bad)
        with pytest.raises(ValueError, match="DENSE_PREFIX_MIN_TOKENS must be 0"):
            m3_envs.VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS


def _paged_batch(seq_lens, page, Hkv, D, mode, gen):
    """A shuffled paged cache holding random K/V of each request (written by
    the reference cache writer, so fp8 modes hold e4m3 values and scales)."""
    n_pages = sum(-(-s // page) for s in seq_lens) + 2
    perm = torch.randperm(n_pages, generator=gen).to(torch.int32)
    max_pages = max(-(-s // page) for s in seq_lens)
    bt = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    k = 0
    for r, s in enumerate(seq_lens):
        n = -(-s // page)
        bt[r, :n] = perm[k:k + n]
        k += n
    slots = torch.cat([bt[r, torch.arange(s) // page].long() * page + torch.arange(s) % page
                       for r, s in enumerate(seq_lens)])
    N = int(slots.numel())
    key, val = torch.randn(N, Hkv, D, generator=gen), torch.randn(N, Hkv, D, generator=gen)
    dtype = torch.float8_e4m3fn if mode else torch.float32
    kv = torch.zeros(n_pages, 2, page, Hkv, D, dtype=dtype)
    idx = torch.zeros(n_pages, page, 8)
    ks, vs, kvs = None, None, None
    if mode == 1:
        ks, vs = torch.tensor(0.01), torch.tensor(0.02)
    if mode == 2:
        kvs = torch.zeros(n_pages, 2, page, Hkv)
    sparse_ops.write_sparse_cache(key, val, torch.randn(N, 8, generator=gen), kv, idx, slots,
                                  ks, vs, kvs)
    return bt, kv, idx, (mode, ks, vs, kvs)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_dense_prefix_attention_equals_block_sparse(mode):
    """Every token below top-k x block selects all its blocks, so its dense
    causal attention equals the reference block-sparse attention, for a chunk
    from position 0 and one from inside the dense region, GQA group 2."""
    gen = torch.Generator().manual_seed(11 + mode)
    page, B, topk, Hq, Hkv, D = 8, 16, 4, 4, 2, 16
    seq_lens = [70, 50]  # request 0: chunk 0..69; request 1: chunk 20..49
    bt, kv, idx, scales = _paged_batch(seq_lens, page, Hkv, D, mode, gen)
    treq = torch.tensor([0] * 70 + [1] * 30, dtype=torch.int32)
    tpos = torch.cat([torch.arange(70), torch.arange(20, 50)]).to(torch.int32)
    q = torch.randn(100, Hq, D, generator=gen)
    iq = torch.randn(100, Hkv, 8, generator=gen)
    sel = sparse_ops.index_block_topk(iq, idx, bt, treq, tpos, B, topk)
    ref = sparse_ops.block_sparse_attention(q, kv, bt, treq, tpos, sel, B, 0.3, *scales)
    chunks = (PrefillChunk(0, 70, 0, 0), PrefillChunk(70, 30, 1, 20))
    spans = dense_spans(chunks, topk * B, 16)
    assert spans == (DenseSpan(0, 64, 0, 0), DenseSpan(70, 30, 1, 20))
    outs = dense_prefix.dense_prefix_attention(q, kv, bt, spans, 0.3, *scales)
    for span, o in zip(spans, outs):
        rows = slice(span.token_start, span.token_start + span.num_tokens)
        torch.testing.assert_close(o, ref[rows], atol=1e-5, rtol=1e-5)
    # token 64 of request 0 sees 5 blocks: its selection is not every block
    assert (sel[64] >= 0).sum() == Hkv * topk


_DENSE_PREFIX_ATTENTION = dense_prefix.dense_prefix_attention


def _impl_outputs(monkeypatch, min_tokens, kv_cache_dtype, batches):
    """The sparse Impl over consecutive steps (cache writes, then attention),
    with the dense prefix at ``min_tokens`` (0: off); also the spans it took."""
    from types import SimpleNamespace
    monkeypatch.setenv("VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS", str(min_tokens))
    taken = []

    def spy(q, kv, bt, spans, *a):
        taken.append(spans)
        return _DENSE_PREFIX_ATTENTION(q, kv, bt, spans, *a)
    monkeypatch.setattr(dense_prefix, "dense_prefix_attention", spy)
    torch.manual_seed(5)
    page, n_pages, Hq, Hkv, D, Di = 16, 16, 4, 2, 32, 16
    fp8 = kv_cache_dtype == "fp8"
    impl = backend.MiniMaxM3SparseImpl(Hq, D, D ** -0.5, Hkv, kv_cache_dtype=kv_cache_dtype,
                                       sparse_block=32, topk_blocks=2)
    layer = SimpleNamespace(_k_scale=torch.tensor(0.05), _v_scale=torch.tensor(0.03))
    kv = torch.zeros(n_pages, 2, page, Hkv, D,
                     dtype=torch.float8_e4m3fn if fp8 else torch.float32)
    idx = torch.zeros(n_pages, page, Di)
    bt = torch.tensor([[3, 7, 1, 9, 0, 2, 12], [4, 5, 6, 8, 10, 11, 13]], dtype=torch.int32)
    outs = []
    for reqs in batches:  # per request (first position, new tokens)
        starts, q_lens = zip(*reqs)
        treq = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(q_lens)])
        tpos = torch.cat([torch.arange(s, s + n, dtype=torch.int32) for s, n in reqs])
        slots = torch.cat([bt[r, (torch.arange(s, s + n) // page)].long() * page
                           + torch.arange(s, s + n) % page for r, (s, n) in enumerate(reqs)])
        T = len(treq)
        qsl = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
        seq_lens = torch.tensor([s + n for s, n in reqs], dtype=torch.int32)
        md = backend.MiniMaxM3SparseMetadata(
            T, bt, treq, tpos, seq_lens, slots,
            num_decode_tokens=sum(1 for n in q_lens[:1] if n == 1),
            max_seq_len=int(seq_lens.max()),
            prefill_chunks=long_prefill_chunks(qsl, seq_lens, impl.dense_prefix_min_tokens))
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(T, h, D, generator=g) for h in (Hq, Hkv, Hkv))
        iq, ik = torch.randn(T, Hkv, Di, generator=g), torch.randn(T, Di, generator=g)
        out = torch.full((T, Hq, D), float("nan"))
        impl.forward(layer, q, k, v, iq, ik, kv, idx, md, out)
        outs.append(out)
    return torch.cat(outs), taken


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_impl_with_dense_prefix_equals_sparse_only(monkeypatch, kv_cache_dtype):
    """A prefill-only step whose first chunk leads the batch (cut off the
    sparse ops' tokens), then a mixed step (a decode first, a chunk from
    inside the dense region: its tokens get no selection): the same outputs
    with and without the dense prefix (dense limit 64)."""
    batches = [[(0, 90), (0, 40)], [(90, 1), (40, 40)]]
    want, none = _impl_outputs(monkeypatch, 0, kv_cache_dtype, batches)
    got, taken = _impl_outputs(monkeypatch, 16, kv_cache_dtype, batches)
    assert none == []
    assert taken == [(DenseSpan(0, 64, 0, 0), DenseSpan(90, 40, 1, 0)),
                     (DenseSpan(1, 24, 1, 40),)]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
