# SPDX-License-Identifier: Apache-2.0
"""The sparse layer's cache-write kernel and the unfolded scalar-scale mode.

``write_sparse_cache`` (Triton) against the reference write of
``sparse_ops`` (model dtype and fp8 with scalar scales; -1 slots must write
nothing), and ``block_sparse_attention(fold_scalar_scales=False)`` -- the
per-element scaling kept for the seed's A/B benchmark -- against the folded
default and the dequantised reference. Fresh random inputs every run; caches
poisoned with a sentinel so stray writes show.
"""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from vllm.models.minimax_m3.common import sparse_ops  # noqa: E402
from vllm.models.minimax_m3.common.triton_ops import (  # noqa: E402
    block_sparse_attention, write_sparse_cache)

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
FP8 = torch.float8_e4m3fn
DTYPE = torch.bfloat16 if ON_GPU else torch.float16
# (Hkv, D, Didx, page_size)
SHAPE = (4, 128, 128, 64) if ON_GPU else (2, 16, 32, 8)


def _seed() -> int:
    s = random.SystemRandom().randrange(1 << 31)
    torch.manual_seed(s)
    return s


def _caches(num_pages, kv_dtype):
    hkv, d, di, page = SHAPE
    kv = torch.full((num_pages, 2, page, hkv, d), 3.0, device=DEVICE).to(kv_dtype)
    ic = torch.full((num_pages, page, di), 3.0, dtype=DTYPE, device=DEVICE)
    return kv, ic


@pytest.mark.parametrize("fp8", [False, True])
def test_write_sparse_cache_matches_reference(fp8):
    seed = _seed()
    hkv, d, di, page = SHAPE
    T, num_pages = 37, 12
    ks = torch.tensor([0.02 if ON_GPU else 2.0 ** -6], device=DEVICE) if fp8 else None
    vs = torch.tensor([0.05 if ON_GPU else 2.0 ** -5], device=DEVICE) if fp8 else None
    k = torch.randn(T, hkv, d, dtype=DTYPE, device=DEVICE) * 4
    v = torch.randn(T, hkv, d, dtype=DTYPE, device=DEVICE) * 4
    if fp8 and not ON_GPU:
        # The interpreter's fp32 -> e4m3 cast loses the carry when rounding
        # reaches the next binade (125 -> 64, not 128); on the interpreter use
        # values whose quotient is exactly representable, on the GPU any.
        k = ((k.float() / ks).to(FP8).float() * ks).to(DTYPE)
        v = ((v.float() / vs).to(FP8).float() * vs).to(DTYPE)
    ik = torch.randn(T, di, dtype=DTYPE, device=DEVICE)
    slots = torch.randperm(num_pages * page, device=DEVICE)[:T].to(torch.int64)
    slots[::5] = -1  # graph padding: nothing written
    kv_dtype = FP8 if fp8 else DTYPE
    got_kv, got_ic = _caches(num_pages, kv_dtype)
    ref_kv, ref_ic = _caches(num_pages, kv_dtype)
    write_sparse_cache(k, v, ik, got_kv, got_ic, slots, ks, vs)
    sparse_ops.write_sparse_cache(k, v, ik, ref_kv, ref_ic, slots.cpu() if not ON_GPU else slots,
                                  ks, vs)
    # bitwise: same rounding (fp8: round to nearest even of the clamped quotient)
    assert torch.equal(got_kv.view(torch.uint8) if fp8 else got_kv,
                       ref_kv.view(torch.uint8) if fp8 else ref_kv), f"seed {seed}"
    assert torch.equal(got_ic, ref_ic), f"seed {seed}"
    untouched = torch.ones(num_pages * page, dtype=torch.bool)
    untouched[slots[slots >= 0].cpu()] = False
    flat = got_ic.reshape(-1, di).cpu()
    assert torch.all(flat[untouched] == 3.0), f"seed {seed}: a -1 slot was written"


def test_write_sparse_cache_fp8_needs_scales():
    hkv, d, di, page = SHAPE
    kv, ic = _caches(2, FP8)
    x = torch.zeros(1, hkv, d, dtype=DTYPE, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        write_sparse_cache(x, x, torch.zeros(1, di, dtype=DTYPE, device=DEVICE), kv, ic,
                           torch.zeros(1, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("num_new", [1, 40])  # decode (split path) and prefill
def test_unfolded_scalar_scales_match_folded(num_new):
    seed = _seed()
    hkv, d, _, page = SHAPE
    hq, sparse_block, topk = hkv * 4, page * 2, 3
    ctx = 150
    seq = ctx + num_new
    num_pages = -(-seq // page) + 1
    bt = torch.randperm(num_pages, device=DEVICE)[None, :].to(torch.int32)
    kv8 = (torch.randn(num_pages, 2, page, hkv, d, device=DEVICE) * 50).clamp(-440, 440).to(FP8)
    q = torch.randn(num_new, hq, d, dtype=DTYPE, device=DEVICE)
    req = torch.zeros(num_new, dtype=torch.int32, device=DEVICE)
    pos = torch.arange(ctx, seq, dtype=torch.int32, device=DEVICE)
    rows = []  # own block + distinct earlier blocks, -1 padded (no repeats)
    for own in (pos // sparse_block).tolist():
        for _ in range(hkv):
            earlier = torch.randperm(own)[: topk - 1].tolist()
            rows.append([own] + earlier + [-1] * (topk - 1 - len(earlier)))
    topk_blocks = torch.tensor(rows, dtype=torch.int32, device=DEVICE).view(num_new, hkv, topk)
    ks = torch.tensor([0.013], device=DEVICE)
    vs = torch.tensor([0.021], device=DEVICE)
    args = (q, kv8, bt, req, pos, topk_blocks, sparse_block, d ** -0.5, 1, ks, vs, None)
    folded = block_sparse_attention(*args)
    unfolded = block_sparse_attention(*args, fold_scalar_scales=False)
    ref = sparse_ops.block_sparse_attention(*(a.cpu() if torch.is_tensor(a) else a for a in args))
    tol = dict(atol=3e-2, rtol=3e-2) if ON_GPU else dict(atol=5e-3, rtol=1e-2)
    torch.testing.assert_close(unfolded.float().cpu(), ref.float(), **tol, msg=lambda m: f"seed {seed}: {m}")
    torch.testing.assert_close(folded.float().cpu(), ref.float(), **tol, msg=lambda m: f"seed {seed}: {m}")


def _padded_fp8_cache(num_pages):
    """The sparse layer's per-token-head layout: fp8 rows of D values, each
    followed by 16 bytes whose first 4 hold the row's float32 scale."""
    hkv, d, _, page = SHAPE
    raw = torch.full((num_pages, 2, page, hkv, d + 16), 0x7F, dtype=torch.uint8, device=DEVICE)
    raw = raw.view(FP8)  # 0x7F is NaN in e4m3: unwritten rows show up
    return raw[..., :d], raw[..., d:d + 4].view(torch.float32).squeeze(-1)


def _rows(num_new):
    """K or V rows of very different magnitudes (no scalar scale fits all)."""
    hkv, d, _, _ = SHAPE
    if ON_GPU:
        mag = torch.logspace(-2, 3, num_new * hkv).view(num_new, hkv, 1)
        return (torch.randn(num_new, hkv, d) * mag).to(DTYPE).to(DEVICE)
    # The interpreter's fp32 -> e4m3 cast drops the rounding carry; give it rows
    # whose quotients x / (amax / 448) are exact e4m3 values (a power-of-two
    # scale per row and one element at 448).
    q = (torch.randn(num_new, hkv, d) * 100).clamp(-440, 440).to(FP8).float()
    q[..., 0] = 448.0
    e = torch.randint(-10, 6, (num_new, hkv, 1)).float()
    return (q * torch.exp2(e)).to(DTYPE).to(DEVICE)


def test_per_token_head_write_and_attention():
    seed = _seed()
    hkv, d, di, page = SHAPE
    hq, sparse_block, topk, num_new = hkv * 4, page * 2, 3, 150
    num_pages = -(-num_new // page) + 1
    k, v = _rows(num_new), _rows(num_new)
    ik = torch.randn(num_new, di, dtype=DTYPE, device=DEVICE)
    bt = torch.randperm(num_pages, device=DEVICE)[None, :].to(torch.int32)
    pos = torch.arange(num_new, dtype=torch.int32, device=DEVICE)
    slots = bt[0, (pos // page).long()].long() * page + (pos % page).long()
    got_kv, got_s = _padded_fp8_cache(num_pages)
    ref_kv, ref_s = _padded_fp8_cache(num_pages)
    ic = torch.zeros(num_pages, page, di, dtype=DTYPE, device=DEVICE)
    write_sparse_cache(k, v, ik, got_kv, ic, slots, kv_scales=got_s)
    sparse_ops.write_sparse_cache(k, v, ik, ref_kv, ic.clone(), slots, kv_scales=ref_s)

    w = slots.cpu()
    def per_token(t):  # [pages, 2, page, ...] -> the written tokens' [2, ...]
        return t.transpose(1, 2).reshape(num_pages * page, 2, *t.shape[3:]).cpu()[w]
    gs, rs = per_token(got_s), per_token(ref_s)
    assert torch.equal(gs, rs), f"seed {seed}: scales differ"
    gq, rq = per_token(got_kv.view(torch.uint8)), per_token(ref_kv.view(torch.uint8))
    assert torch.equal(gq, rq), f"seed {seed}: fp8 rows differ from the reference write"
    # e4m3 keeps 3 mantissa bits: a dequantised value is within 1/16 of itself,
    # or of one subnormal step (2^-9 of its row scale)
    want = torch.stack((k, v), 1).float().cpu()
    err = (rq.view(FP8).float() * rs[..., None] - want).abs()
    assert bool((err <= want.abs() / 16 + rs[..., None] * 2.0 ** -9).all()), f"seed {seed}"

    q = torch.randn(num_new, hq, d, dtype=DTYPE, device=DEVICE)
    rows = []
    for own in (pos // sparse_block).tolist():
        for _ in range(hkv):
            earlier = torch.randperm(own)[: topk - 1].tolist()
            rows.append([own] + earlier + [-1] * (topk - 1 - len(earlier)))
    sel = torch.tensor(rows, dtype=torch.int32, device=DEVICE).view(num_new, hkv, topk)
    req = torch.zeros(num_new, dtype=torch.int32, device=DEVICE)
    args = (q, ref_kv, bt, req, pos, sel, sparse_block, d ** -0.5, 2, None, None, ref_s)
    out = block_sparse_attention(*args)
    ref = sparse_ops.block_sparse_attention(*(a.cpu() if torch.is_tensor(a) else a for a in args))
    # rows span 2^16 in magnitude: tolerance relative to each output row's
    # largest value (the kernel's P@V operands are 16-bit)
    out, ref = out.float().cpu(), ref.float()
    rel = 3e-2 if ON_GPU else 4e-3
    bound = rel * (ref.abs() + ref.abs().amax(-1, keepdim=True))
    assert bool(((out - ref).abs() <= bound).all()), (
        f"seed {seed}: max error {(out - ref).abs().max():.3g}")


def test_fp8_index_key_cache_write():
    """Optional fp8 index-key cache: each token's key stored as key / s in
    e4m3 with s = amax / 448 in idx_scales; the Triton write and the reference
    write agree, every written key dequantises within e4m3 precision, the
    row maximum maps to 448, and -1 slots are skipped."""
    seed = _seed()
    hkv, d, di, page = SHAPE
    T, num_pages = 29, 10
    k = torch.randn(T, hkv, d, dtype=DTYPE, device=DEVICE)
    ik = torch.randn(T, di, dtype=DTYPE, device=DEVICE) * 3
    if not ON_GPU:
        # the interpreter's fp32 -> e4m3 cast drops the rounding carry (see
        # above): use keys whose quotient is exact, e4m3 values times a power
        # of two with the row maximum 448 (so s is that power of two)
        vals = (ik.float() * 40).clamp(-440, 440).to(FP8).float()
        vals[:, 0] = 448.0
        ik = (vals * 2.0 ** torch.randint(-7, -2, (T, 1), device=DEVICE)).to(DTYPE)
    slots = torch.randperm(num_pages * page, device=DEVICE)[:T].to(torch.int64)
    slots[::4] = -1
    out = {}
    for name, fn in (("triton", write_sparse_cache), ("ref", sparse_ops.write_sparse_cache)):
        kv, _ = _caches(num_pages, DTYPE)
        ic = torch.zeros(num_pages, page, di, device=DEVICE).to(FP8)
        isc = torch.full((num_pages, page), -1.0, device=DEVICE)
        fn(k, k, ik, kv, ic, slots, idx_scales=isc)
        out[name] = (ic, isc)
    (ic, isc), (ric, risc) = out["triton"], out["ref"]
    torch.testing.assert_close(isc, risc, rtol=1e-6, atol=0, msg=lambda m: f"seed {seed}: {m}")
    w = slots >= 0
    pg, sl = slots[w] // page, slots[w] % page
    s = isc[pg, sl]
    amax = ik[w].float().abs().amax(-1)
    torch.testing.assert_close(s, amax / 448, rtol=1e-6, atol=0)
    for cache in (ic, ric):
        deq = cache[pg, sl].float() * s[:, None]
        err = (deq - ik[w].float()).abs().amax(-1)
        assert torch.all(err <= amax * 2 ** -4), f"seed {seed}: fp8 index keys off"
        assert torch.all(cache[pg, sl].float().abs().amax(-1) == 448), f"seed {seed}"
    skipped = torch.ones(num_pages * page, dtype=torch.bool)
    skipped[slots[w].cpu()] = False
    assert torch.all(isc.reshape(-1).cpu()[skipped] == -1.0), f"seed {seed}: a -1 slot written"


def test_fp8_index_cache_needs_its_scales():
    hkv, d, di, page = SHAPE
    kv, ic = _caches(2, DTYPE)
    x = torch.zeros(1, hkv, d, dtype=DTYPE, device=DEVICE)
    ik = torch.zeros(1, di, dtype=DTYPE, device=DEVICE)
    slots = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="fp8 idx_cache needs idx_scales"):
        write_sparse_cache(x, x, ik, kv, ic.to(FP8), slots)
    with pytest.raises(ValueError, match="fp8 idx_cache needs idx_scales"):
        write_sparse_cache(x, x, ik, kv, ic, slots, idx_scales=torch.ones(2, page, device=DEVICE))
