# SPDX-License-Identifier: Apache-2.0
"""The MSA torch reference ops over paged caches vs a direct evaluation of the
definition on contiguous tensors (dense score matrix + dense mask)."""

import pytest
import torch

from vllm.models.minimax_m3.common.sparse_ops import (
    block_sparse_attention,
    index_block_topk,
)


def _batch(seq_lens, q_lens, page_size, n_extra_pages=3, gen=None):
    """Random page assignment: each request owns a shuffled set of pages."""
    R = len(seq_lens)
    pages_per = [-(-s // page_size) for s in seq_lens]
    total = sum(pages_per) + n_extra_pages
    perm = torch.randperm(total, generator=gen)
    max_pages = max(pages_per)
    bt = torch.full((R, max_pages), 0, dtype=torch.int32)
    k = 0
    for r, n in enumerate(pages_per):
        bt[r, :n] = perm[k : k + n].to(torch.int32)
        k += n
    token_req, token_pos = [], []
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        token_req += [r] * q
        token_pos += list(range(s - q, s))
    return (
        total,
        bt,
        torch.tensor(token_req, dtype=torch.int32),
        torch.tensor(token_pos, dtype=torch.int32),
    )


def _paged(dense_per_req, bt, total_pages, page_size):
    """Scatter per-request contiguous [len, ...] tensors into a paged cache."""
    tail = dense_per_req[0].shape[1:]
    cache = torch.randn(total_pages, page_size, *tail)  # garbage elsewhere
    for r, x in enumerate(dense_per_req):
        for j in range(x.shape[0]):
            cache[bt[r, j // page_size], j % page_size] = x[j]
    return cache


def _ref_selection(iq, keys, pos, sparse_block, topk, local, init):
    """Definition: per (token, head) the set of selected block ids."""
    H = iq.shape[0]
    n_blocks = -(-(pos + 1) // sparse_block)
    scores = (iq.float() @ keys[: pos + 1].float().T)  # [H, pos+1]
    out = []
    for h in range(H):
        blk = torch.full((n_blocks,), float("-inf"))
        for b in range(n_blocks):
            blk[b] = scores[h, b * sparse_block : min((b + 1) * sparse_block, pos + 1)].max()
        own = pos // sparse_block
        forced = {max(own - i, 0) for i in range(local)} | {i for i in range(init) if i <= own}
        for b in forced:
            blk[b] = float("inf")
        k = min(topk, n_blocks)
        out.append(set(blk.topk(k).indices.tolist()))
    return out


CASES = [
    # seq_lens, q_lens (prefill, chunked prefill, decode mixed)
    ([70, 9, 130], [70, 1, 40]),
    ([16, 33, 97], [1, 33, 1]),
]


@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("local,init", [(1, 0), (2, 0), (1, 1)])
@pytest.mark.parametrize("case", CASES)
def test_index_block_topk_matches_definition(page_size, local, init, case):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    seq_lens, q_lens = case
    sparse_block, topk, H, D = 32, 3, 2, 16
    total, bt, treq, tpos = _batch(seq_lens, q_lens, page_size, gen=gen)
    keys = [torch.randn(s, D) for s in seq_lens]
    cache = _paged(keys, bt, total, page_size)
    iq = torch.randn(len(treq), H, D)
    got = index_block_topk(iq, cache, bt, treq, tpos, sparse_block, topk, local, init)
    assert got.shape == (len(treq), H, topk) and got.dtype == torch.int32
    for t in range(len(treq)):
        r, p = int(treq[t]), int(tpos[t])
        want = _ref_selection(iq[t], keys[r], p, sparse_block, topk, local, init)
        n_vis = -(-(p + 1) // sparse_block)
        for h in range(H):
            row = got[t, h].tolist()
            k = min(topk, n_vis)
            assert row[k:] == [-1] * (topk - k), row  # -1 padding on the right
            assert len(set(row[:k])) == k and -1 not in row[:k]  # packed, unique
            assert set(row[:k]) == want[h], (t, h, row, want[h])
            assert p // sparse_block in row  # own block always selected


def _ref_attention(q, k, v, pos, sel_blocks, sparse_block, scale):
    """Definition on contiguous K/V [n, Hkv, D]: masked softmax attention."""
    Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    out = torch.empty(Hq, D)
    j = torch.arange(k.shape[0])
    for h in range(Hq):
        g = h // G
        blocks = {b for b in sel_blocks[g] if b >= 0}
        allowed = torch.tensor([(int(x) // sparse_block) in blocks for x in j]) & (j <= pos)
        s = (k[:, g].float() @ q[h].float()) * scale
        s = s.masked_fill(~allowed, float("-inf"))
        out[h] = torch.softmax(s, 0) @ v[:, g].float()
    return out


@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_block_sparse_attention_matches_definition(page_size, case, mode):
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    seq_lens, q_lens = case
    sparse_block, topk, Hq, Hkv, D = 32, 3, 4, 2, 16
    total, bt, treq, tpos = _batch(seq_lens, q_lens, page_size, gen=gen)
    kv = [torch.randn(s, 2, Hkv, D) for s in seq_lens]
    cache = _paged(kv, bt, total, page_size).permute(0, 2, 1, 3, 4).contiguous()
    q = torch.randn(len(treq), Hq, D)
    # random selections incl. -1 padding; own block always present
    n_blocks = [-(-(int(p) + 1) // sparse_block) for p in tpos]
    sel = torch.full((len(treq), Hkv, topk), -1, dtype=torch.int32)
    for t, nb in enumerate(n_blocks):
        for g in range(Hkv):
            own = int(tpos[t]) // sparse_block
            others = [b for b in torch.randperm(nb, generator=gen).tolist() if b != own]
            chosen = [own] + others[: topk - 1]
            sel[t, g, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    k_scale = v_scale = kv_scales = None
    ref_kv = [x.clone() for x in kv]
    if mode == 1:
        k_scale, v_scale = torch.tensor(0.5), torch.tensor(2.0)
        for x in ref_kv:
            x[:, 0] *= 0.5
            x[:, 1] *= 2.0
    elif mode == 2:
        kv_scales = torch.rand(total, 2, page_size, Hkv) + 0.5
        for r, x in enumerate(ref_kv):
            for j in range(x.shape[0]):
                pg, off = bt[r, j // page_size], j % page_size
                x[j] *= kv_scales[pg, :, off, :, None]
    got = block_sparse_attention(q, cache, bt, treq, tpos, sel, sparse_block, 0.25,
                                 mode, k_scale, v_scale, kv_scales)
    assert got.shape == q.shape and got.dtype == q.dtype
    for t in range(len(treq)):
        r = int(treq[t])
        x = ref_kv[r]
        want = _ref_attention(q[t], x[:, 0], x[:, 1], int(tpos[t]), sel[t].tolist(),
                              sparse_block, 0.25)
        torch.testing.assert_close(got[t], want, atol=1e-5, rtol=1e-5)


def test_block_sparse_attention_bf16_output_dtype():
    torch.manual_seed(2)
    total, bt, treq, tpos = _batch([40], [40], 16)
    cache = torch.randn(total, 2, 16, 1, 16).bfloat16()
    q = torch.randn(40, 2, 16).bfloat16()
    sel = index_block_topk(torch.randn(40, 1, 8), torch.randn(total, 16, 8), bt, treq,
                           tpos, 16, 2)
    out = block_sparse_attention(q, cache, bt, treq, tpos, sel, 16, 0.25)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def _impl_run(kv_cache_dtype, cache_dtype, k_scale=1.0, v_scale=1.0, pre_quant=None):
    """Drive the sparse backend Impl (cache writes + select + attend) on a
    chunked-prefill + decode batch, as the engine does."""
    from types import SimpleNamespace

    from vllm.models.minimax_m3.common.backend import (
        MiniMaxM3SparseImpl,
        MiniMaxM3SparseMetadata,
    )

    torch.manual_seed(3)
    page, n_pages, Hq, Hkv, D, Di = 16, 12, 4, 2, 32, 16
    impl = MiniMaxM3SparseImpl(Hq, D, D**-0.5, Hkv, kv_cache_dtype=kv_cache_dtype,
                               sparse_block=32, topk_blocks=2)
    layer = SimpleNamespace(_k_scale=torch.tensor(k_scale), _v_scale=torch.tensor(v_scale))
    kv = torch.zeros(n_pages, 2, page, Hkv, D, dtype=cache_dtype)
    idx = torch.zeros(n_pages, page, Di)
    bt = torch.tensor([[3, 7, 1, 9, 0, 2], [4, 5, 6, 8, 10, 11]], dtype=torch.int32)
    outs = []
    # step 1: request 0 prefills 70 tokens, request 1 prefills 40
    # step 2: request 0 decodes 1 token, request 1 prefills 30 more (chunked)
    for q_lens, starts in (([70, 40], [0, 0]), ([1, 30], [70, 40])):
        treq = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(q_lens)])
        tpos = torch.cat([torch.arange(s, s + n, dtype=torch.int32) for s, n in zip(starts, q_lens)])
        slots = torch.cat([
            bt[r, (torch.arange(s, s + n) // page)].long() * page + torch.arange(s, s + n) % page
            for r, (s, n) in enumerate(zip(starts, q_lens))])
        T = len(treq)
        md = MiniMaxM3SparseMetadata(T, bt, treq, tpos, torch.tensor(
            [s + n for s, n in zip(starts, q_lens)], dtype=torch.int32), slots)
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(T, h, D, generator=g) for h in (Hq, Hkv, Hkv))
        if pre_quant is not None:  # what an e4m3 cache with these scales keeps
            ks, vs = pre_quant
            k = (k / ks).to(torch.float8_e4m3fn).float() * ks
            v = (v / vs).to(torch.float8_e4m3fn).float() * vs
        iq, ik = torch.randn(T, Hkv, Di, generator=g), torch.randn(T, Di, generator=g)
        out = torch.zeros(T, Hq, D)
        impl.forward(layer, q, k, v, iq, ik, kv, idx, md, out)
        outs.append(out)
    return torch.cat(outs)


def test_impl_fp8_kv_cache_scalar_scales_close_to_fp32():
    ref = _impl_run("auto", torch.float32)
    got = _impl_run("fp8", torch.float8_e4m3fn, k_scale=0.05, v_scale=0.02)
    assert torch.isfinite(got).all()
    err = (got - ref).abs()
    assert err.max() < 0.2 and err.mean() < 0.02, (err.max(), err.mean())
    assert err.max() > 0.0  # really went through the fp8 cache
    # Exactly what an fp32 cache of the e4m3-rounded K/V gives.
    exact = _impl_run("auto", torch.float32, pre_quant=(0.05, 0.02))
    torch.testing.assert_close(got, exact, atol=1e-5, rtol=1e-5)


def test_fp8_index_cache_views_pack_keys_then_scales():
    """The fp8 index-key cache the engine allocates, [pages, page, Didx + 4]
    e4m3: each page holds its keys (Didx bytes each), then their float32
    scales; the views write exactly those bytes."""
    from vllm.models.minimax_m3.common.sparse_ops import fp8_index_cache_views

    P, S, D = 3, 16, 32
    pages = torch.zeros(P, S, D + 4, dtype=torch.float8_e4m3fn)
    keys, scales = fp8_index_cache_views(pages, D)
    assert keys.shape == (P, S, D) and scales.shape == (P, S)
    assert scales.dtype == torch.float32
    vals = torch.arange(1, D + 1, dtype=torch.float32).to(torch.float8_e4m3fn)
    keys[2, 5] = vals
    scales[1, 7] = 0.375
    raw = pages.view(torch.uint8).reshape(P, S * (D + 4))
    page_keys = raw[2, : S * D].view(torch.float8_e4m3fn).reshape(S, D).float()
    assert torch.equal(page_keys[5], vals.float())
    assert int((page_keys != 0).sum()) == D  # nothing else was written
    page_scales = raw[1, S * D :].view(torch.float32)
    assert page_scales[7] == 0.375 and int((page_scales != 0).sum()) == 1
    assert int((raw[0] != 0).sum()) == 0


def test_fp8_index_cache_views_refuse_bad_caches():
    from vllm.models.minimax_m3.common.sparse_ops import fp8_index_cache_views

    good = torch.zeros(2, 16, 36, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="rows of 36 bytes, got 48"):
        fp8_index_cache_views(torch.zeros(2, 16, 48, dtype=torch.float8_e4m3fn), 32)
    with pytest.raises(ValueError, match="multiple of 4"):
        fp8_index_cache_views(torch.zeros(2, 16, 34, dtype=torch.float8_e4m3fn), 30)
    with pytest.raises(ValueError, match="e4m3"):
        fp8_index_cache_views(good.float(), 32)
    with pytest.raises(ValueError, match="contiguous"):
        fp8_index_cache_views(good.transpose(0, 1), 32)


def test_select_sparse_ops_gives_a_typed_ops_object():
    """``select_sparse_ops``: the ``SparseOps`` interface, on CPU the PyTorch
    reference (``triton`` False); ``TritonSparseOps`` holds the kernels."""
    from vllm.models.minimax_m3.common import msa_ops, sparse_ops

    ops = msa_ops.select_sparse_ops(torch.device("cpu"))
    assert isinstance(ops, msa_ops.ReferenceSparseOps) and ops.triton is False
    assert ops.write_cache is sparse_ops.write_sparse_cache
    assert ops.index_block_topk is sparse_ops.index_block_topk
    assert ops.block_sparse_attention is sparse_ops.block_sparse_attention
    for name in ("write_cache", "index_block_topk", "block_sparse_attention"):
        assert callable(getattr(msa_ops.SparseOps, name))
    try:
        from vllm.models.minimax_m3.common import triton_ops
    except ImportError:
        pytest.skip("no Triton")
    triton = msa_ops.TritonSparseOps()
    assert triton.triton is True
    assert triton.block_sparse_attention is triton_ops.block_sparse_attention
    assert triton.index_block_topk is triton_ops.index_block_topk
    assert triton.write_cache is triton_ops.write_sparse_cache
