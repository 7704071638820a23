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
