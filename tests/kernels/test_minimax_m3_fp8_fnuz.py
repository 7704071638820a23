# SPDX-License-Identifier: Apache-2.0
"""FP8 caches on ROCm: MI300X / MI325X (gfx942) store e4m3fnuz (max 240,
exponent bias 8: the same bits are half the e4m3fn value), MI355X (gfx950)
and NVIDIA the OCP e4m3fn (max 448).  The reference ops and the Triton
kernels (interpreter off-GPU) take either; the cache dtype, never a fixed
448, sets the clamp and the per-token scales; the platform picks the dtype;
checkpoint (e4m3fn) KV scales double for an fnuz cache."""

import os
import random
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from vllm.models.minimax_m3.common import sparse_ops  # noqa: E402
from vllm.models.minimax_m3.common.triton_ops import (  # noqa: E402
    block_sparse_attention, index_block_topk, write_sparse_cache)

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
DTYPE = torch.float16
HKV, D, DI, PAGE, SB = 1, 32, 32, 8, 16


def _seed() -> int:
    s = random.SystemRandom().randrange(1 << 31)
    torch.manual_seed(s)
    return s


def test_fnuz_is_not_fn():
    """The premise: max 240 against 448, and one bit pattern two values."""
    assert torch.finfo(FNUZ).max == 240.0 and torch.finfo(FN).max == 448.0
    bits = torch.tensor([0x40], dtype=torch.uint8)  # exponent field 8, mantissa 0
    assert bits.view(FN).float().item() == 2.0 and bits.view(FNUZ).float().item() == 1.0
    assert set(sparse_ops.FP8_DTYPES) == {FN, FNUZ}


@pytest.mark.parametrize("fp8", [FN, FNUZ])
def test_reference_write_uses_the_cache_dtype_max(fp8):
    """Per-token-head and index-key scales are amax / the dtype's max, the
    quotients reach but never pass it, and the cache dequantises back."""
    seed = _seed()
    T, pages = 9, 3
    k = torch.randn(T, HKV, D) * 7
    v = torch.randn(T, HKV, D) * 3
    ik = torch.randn(T, DI) * 5
    kv = torch.zeros(pages, 2, PAGE, HKV, D, dtype=fp8)
    kvs = torch.zeros(pages, 2, PAGE, HKV)
    ipages = torch.zeros(pages, PAGE, DI + 4, dtype=fp8)
    ic, isc = sparse_ops.fp8_index_cache_views(ipages, DI)
    slots = torch.arange(T, dtype=torch.int64)
    sparse_ops.write_sparse_cache(k, v, ik, kv, ic, slots, kv_scales=kvs, idx_scales=isc)
    fmax = torch.finfo(fp8).max
    got_k = kv[:, 0].reshape(-1, HKV, D)[:T].float()
    got_ks = kvs[:, 0].reshape(-1, HKV)[:T]
    torch.testing.assert_close(got_ks, k.abs().amax(-1) / fmax, rtol=0, atol=0,
                               msg=f"seed {seed}")
    assert got_k.abs().amax().item() == fmax, f"seed {seed}"
    # e4m3 keeps 3 mantissa bits: half an ulp, 2**-4 relative, of each value
    # (subnormals: steps of 2**-9 (fn) / 2**-10 (fnuz) times the scale)
    torch.testing.assert_close(got_k * got_ks[..., None], k, rtol=2 ** -4,
                               atol=float(got_ks.max()) * 2 ** -9, msg=f"seed {seed}")
    got_is = isc.reshape(-1)[:T]
    torch.testing.assert_close(got_is, ik.abs().amax(-1) / fmax, rtol=0, atol=0)
    deq = ic.reshape(-1, DI)[:T].float() * got_is[:, None]
    torch.testing.assert_close(deq, ik, rtol=2 ** -4, atol=float(got_is.max()) * 2 ** -9,
                               msg=f"seed {seed}")


def _interpreter_takes(fp8, launch) -> bool:
    """Runs ``launch``; False when it is Triton's interpreter refusing an
    e4m3fnuz tensor (``fp8e4b8``: Triton 3.6's interpreter has no such type;
    its code generation for gfx942 does, ``test_minimax_m3_rocm_compile.py``).
    The day the interpreter takes it, this fails so the comparison runs."""
    if ON_GPU or fp8 != FNUZ:
        launch()
        return True
    from triton.runtime.errors import InterpreterError
    with pytest.raises(InterpreterError, match="fp8e4b8"):
        launch()
    return False


def _exact_rows(shape, fp8, scale=2.0 ** -5):
    """Rows x = q * scale with q representable in ``fp8`` and each row's
    largest |q| the dtype's max, so every quotient (by the scalar ``scale``
    or by the row's own amax / max) is exact: the interpreter's float -> e4m3
    cast can lose a carry into the next binade
    (``test_minimax_m3_cache_write.py``); on a GPU any values would do."""
    fmax = torch.finfo(fp8).max
    q = (torch.randn(shape, device=DEVICE) * fmax / 4).clamp(-fmax, fmax).to(fp8).float()
    q[..., 0] = fmax
    return (q * scale).to(DTYPE)


@pytest.mark.parametrize("fp8", [FN, FNUZ])
def test_triton_write_matches_reference(fp8):
    """The Triton write is bitwise the reference's for both dtypes: scalar
    scales, per-token-head scales and fp8 index keys with their scales."""
    seed = _seed()
    T, pages = 11, 3
    ks = torch.tensor([2.0 ** -5], device=DEVICE)
    vs = torch.tensor([2.0 ** -5], device=DEVICE)
    k = _exact_rows((T, HKV, D), fp8)
    v = _exact_rows((T, HKV, D), fp8)
    ik = _exact_rows((T, DI), fp8)
    slots = torch.randperm(pages * PAGE, device=DEVICE)[:T].to(torch.int64)
    slots[::4] = -1

    def caches():
        ip = torch.zeros(pages, PAGE, DI + 4, dtype=fp8, device=DEVICE)
        return (torch.zeros(pages, 2, PAGE, HKV, D, dtype=fp8, device=DEVICE),
                *sparse_ops.fp8_index_cache_views(ip, DI))

    def same(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    got, ref = caches(), caches()
    if not _interpreter_takes(fp8, lambda: write_sparse_cache(
            k, v, ik, got[0], got[1], slots, ks, vs, idx_scales=got[2])):
        return
    sparse_ops.write_sparse_cache(k, v, ik, ref[0], ref[1], slots, ks, vs, idx_scales=ref[2])
    assert same(got[0], ref[0]) and same(got[1], ref[1]), f"seed {seed}"
    assert torch.equal(got[2], ref[2]), f"seed {seed}"
    assert got[0].float().abs().max().item() == torch.finfo(fp8).max

    kvs_got = torch.zeros(pages, 2, PAGE, HKV, device=DEVICE)
    kvs_ref = torch.zeros(pages, 2, PAGE, HKV, device=DEVICE)
    got, ref = caches(), caches()
    write_sparse_cache(k, v, ik, got[0], got[1], slots, kv_scales=kvs_got, idx_scales=got[2])
    sparse_ops.write_sparse_cache(k, v, ik, ref[0], ref[1], slots, kv_scales=kvs_ref,
                                  idx_scales=ref[2])
    assert torch.equal(kvs_got, kvs_ref), f"seed {seed}"
    assert same(got[0], ref[0]), f"seed {seed}"
    # each written row's scale is its amax over the dtype's max: 2**-5 here
    assert set(kvs_got[kvs_got != 0].unique().tolist()) == {2.0 ** -5}


def _batch(T_ctx=40, pages=8):
    bt = torch.randperm(pages, dtype=torch.int32, device=DEVICE)[None]
    pos = torch.arange(T_ctx - 6, T_ctx, dtype=torch.int32, device=DEVICE)
    req = torch.zeros_like(pos)
    return bt, req, pos


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("fp8", [FN, FNUZ])
def test_attention_and_index_on_either_fp8(fp8, mode):
    """A cache of either FP8 dtype through the reference ops attends as the
    unquantised model (within fp8 error) and selects as it; the Triton
    attention and fp8 index on it match the reference (e4m3fnuz: on a GPU;
    Triton's interpreter refuses the type, ``_interpreter_takes``); the same
    bytes read as the other dtype are off by the bias (2x)."""
    seed = _seed()
    pages, HQ = 8, 4
    bt, req, pos = _batch(pages=pages)
    T = pos.shape[0]
    k = torch.randn(pages * PAGE, HKV, D, device=DEVICE).to(DTYPE)
    v = torch.randn(pages * PAGE, HKV, D, device=DEVICE).to(DTYPE)
    ik = torch.randn(pages * PAGE, DI, device=DEVICE).to(DTYPE)
    # token j of the request at slot bt[j // PAGE] * PAGE + j % PAGE
    slots = (bt[0].long()[:, None] * PAGE + torch.arange(PAGE, device=DEVICE)).reshape(-1)
    ks = torch.tensor([0.02], device=DEVICE) if mode == 1 else None
    vs = torch.tensor([0.015], device=DEVICE) if mode == 1 else None

    def write(dtype):
        kv = torch.zeros(pages, 2, PAGE, HKV, D, dtype=dtype, device=DEVICE)
        ip = torch.zeros(pages, PAGE, DI + 4, dtype=dtype, device=DEVICE)
        ic, isc = sparse_ops.fp8_index_cache_views(ip, DI)
        kvs = torch.zeros(pages, 2, PAGE, HKV, device=DEVICE) if mode == 2 else None
        sparse_ops.write_sparse_cache(k, v, ik, kv, ic, slots, ks, vs, kvs, idx_scales=isc)
        return kv, ic, isc, kvs

    kv, ic, isc, kvs = write(fp8)
    exact = torch.zeros(pages, 2, PAGE, HKV, D, dtype=DTYPE, device=DEVICE)
    exact_ic = torch.zeros(pages, PAGE, DI, dtype=DTYPE, device=DEVICE)
    sparse_ops.write_sparse_cache(k, v, ik, exact, exact_ic, slots)
    q = torch.randn(T, HQ, D, device=DEVICE).to(DTYPE)
    iq = torch.randn(T, HKV, DI, device=DEVICE).to(DTYPE)
    topk = 2
    ref_sel = sparse_ops.index_block_topk(iq, ic, bt, req, pos, SB, topk, 1, 0,
                                          idx_k_scales=isc)
    ref = sparse_ops.block_sparse_attention(q, kv, bt, req, pos, ref_sel, SB, D ** -0.5, mode,
                                            ks, vs, kvs)
    unquantised = sparse_ops.block_sparse_attention(q, exact, bt, req, pos, ref_sel, SB,
                                                    D ** -0.5)
    torch.testing.assert_close(ref.float(), unquantised.float(), rtol=0.1, atol=0.1,
                               msg=f"seed {seed}")
    # the bias: the same bytes as the other e4m3 are 2x (fnuz -> fn) or 0.5x, and
    # fnuz's +-240 (0x7f / 0xff) are fn's NaNs
    other = FN if fp8 == FNUZ else FNUZ
    wrong = sparse_ops.block_sparse_attention(q, kv.view(other), bt, req, pos, ref_sel, SB,
                                              D ** -0.5, mode, ks, vs, kvs)
    assert not torch.allclose(wrong.float(), ref.float(), rtol=0.1, atol=0.1), f"seed {seed}"

    holder = {}
    if not _interpreter_takes(fp8, lambda: holder.update(sel=index_block_topk(
            iq, ic, bt, req, pos, SB, topk, 1, 0, idx_k_scales=isc))):
        return
    assert torch.equal(holder["sel"].sort(-1).values, ref_sel.sort(-1).values), f"seed {seed}"
    out = block_sparse_attention(q, kv, bt, req, pos, ref_sel, SB, D ** -0.5, mode, ks, vs, kvs)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2,
                               msg=f"seed {seed}")


@pytest.mark.parametrize("fnuz", [False, True])
def test_platform_picks_the_cache_dtype_and_scales_double(monkeypatch, fnuz):
    """``--kv-cache-dtype fp8`` and the fp8 index cache take the platform's FP8
    dtype; a checkpoint's e4m3fn k/v scale is doubled for an fnuz cache (as
    vLLM's BaseKVCacheMethod does)."""
    from vllm.models.minimax_m3.common import attention as m3_attention
    from vllm.models.minimax_m3.common.model import MiniMaxM3SparseForCausalLM
    from vllm.platforms import current_platform

    want = FNUZ if fnuz else FN
    monkeypatch.setattr(type(current_platform), "fp8_dtype", classmethod(lambda cls: want))
    assert m3_attention._sparse_cache_dtype("fp8", torch.bfloat16) == want
    assert m3_attention._sparse_cache_dtype("fp8_e4m3", torch.bfloat16) == want
    assert m3_attention._sparse_cache_dtype("auto", torch.bfloat16) == torch.bfloat16

    layer = types.SimpleNamespace(cache_torch_dtype=want,
                                  _k_scale=torch.ones((), dtype=torch.float32),
                                  _v_scale=torch.ones((), dtype=torch.float32))
    name = "model.layers.3.self_attn.attn"
    loaded: set = set()
    MiniMaxM3SparseForCausalLM._load_kv_scale(
        f"{name}.k_scale", torch.tensor(0.25), {f"{name}.k_scale": None}, {},
        {name: layer}, loaded)
    assert layer._k_scale.item() == (0.5 if fnuz else 0.25)
    assert layer._v_scale.item() == 1.0
