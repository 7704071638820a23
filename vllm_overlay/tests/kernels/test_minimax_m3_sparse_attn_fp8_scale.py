# SPDX-License-Identifier: Apache-2.0
"""FP8 KV-cache scale modes of the MiniMax-M3 block-sparse attention kernel.

Scalar (per layer, ``kv_scale_mode=1``) and per (token, KV head)
(``kv_scale_mode=2``) e4m3 KV caches, prefill and decode (with and without
the split-over-blocks path), against

  * a dense masked float64 attention over the dequantised cache, and
  * the same kernel run on a BF16 (fp16/fp32 in the Triton interpreter) cache
    that holds the dequantised values (``kv_scale_mode=0``).

Scalar mode folds k_scale into the softmax scale and applies v_scale once to
the normalised accumulator; the checks also pin that v_scale acts linearly on
the output and that a changed k_scale tensor is picked up without
re-compilation (scales stay device tensors, as CUDA graphs need).

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` at small shapes;
with one, compiled, in bf16 at the real shapes (16 query heads per KV head,
head_dim 128, 128-token sparse blocks, top-16).
"""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    # must happen before the kernel modules are imported (@triton.jit decides)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from vllm.models.minimax_m3.common.triton_ops import block_sparse_attention  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
FP8 = torch.float8_e4m3fn
if ON_GPU:
    DTYPE = torch.bfloat16
    HQ, HKV, D, B, PAGE, TOPK = 16, 1, 128, 128, 64, 16
    ATOL, RTOL = 2.5e-2, 3e-2
else:
    DTYPE = torch.float16
    HQ, HKV, D, B, PAGE, TOPK = 6, 2, 32, 16, 8, 4
    ATOL, RTOL = 5e-3, 1e-2


def _seed() -> int:
    s = random.SystemRandom().randrange(1 << 31)
    torch.manual_seed(s)
    random.seed(s)
    return s


def _make_batch(reqs):
    """reqs: list of (cached tokens, new tokens).  Returns a dict with the
    block table, token -> (request, position) maps and a slot-validity mask."""
    seq = [c + n for c, n in reqs]
    pages = [-(-s // PAGE) for s in seq]
    num_pages = sum(pages) + 2
    perm = torch.randperm(num_pages)
    bt = torch.full((len(reqs), max(pages) + 1), int(perm[-1]), dtype=torch.int32)
    valid = torch.zeros(num_pages, PAGE, dtype=torch.bool)
    k = 0
    for r, s in enumerate(seq):
        for p in range(pages[r]):
            bt[r, p] = perm[k]
            k += 1
        for j in range(s):
            valid[bt[r, j // PAGE], j % PAGE] = True
    req, pos = [], []
    for r, (c, n) in enumerate(reqs):
        req += [r] * n
        pos += list(range(c, c + n))
    return dict(bt=bt.to(DEVICE), req=torch.tensor(req, dtype=torch.int32, device=DEVICE),
                pos=torch.tensor(pos, dtype=torch.int32, device=DEVICE),
                valid=valid.to(DEVICE), num_pages=num_pages, T=len(pos))


def _selection(b):
    sel = torch.full((b["T"], HKV, TOPK), -1, dtype=torch.int32)
    for t in range(b["T"]):
        nb = int(b["pos"][t]) // B + 1
        for g in range(HKV):
            k = min(TOPK, nb) if random.random() < 0.7 else random.randint(1, min(TOPK, nb))
            sel[t, g, :k] = torch.randperm(nb)[:k].to(torch.int32)
    return sel.to(DEVICE)


def _fp8_cache(b, mode):
    """Returns (fp8 cache, k_scale, v_scale, kv_scales, dequantised float64 cache)."""
    x = torch.randn(b["num_pages"], 2, PAGE, HKV, D, device=DEVICE)
    if mode == 1:
        # one scale per layer for K and one for V (values spread over the range)
        amax = x.abs().amax(dim=(0, 2, 3, 4))
        ks, vs = (amax / 448.0 * torch.tensor([1.3, 0.8], device=DEVICE)).unbind(0)
        ks, vs = ks.reshape(1).contiguous(), vs.reshape(1).contiguous()
        scale = torch.stack([ks, vs]).view(1, 2, 1, 1, 1)
        kv_scales = None
        q8 = (x / scale).clamp(-448, 448).to(FP8)
        deq = q8.double() * scale.double()
    else:
        # per (token, KV head) scales, as written with the cache
        ks = vs = None
        kv_scales = (x.abs().amax(-1) / 448.0 * (0.5 + torch.rand(x.shape[:-1], device=DEVICE)))
        q8 = (x / kv_scales[..., None]).clamp(-448, 448).to(FP8)
        deq = q8.double() * kv_scales[..., None].double()
    u = q8.view(torch.uint8)  # poison slots that hold no key: e4m3fn NaN
    u[:, 0][~b["valid"]] = 0x7F
    u[:, 1][~b["valid"]] = 0x7F
    return q8, ks, vs, kv_scales, deq


def _ref(b, q, deq, sel, scale):
    T = b["T"]
    G = HQ // HKV
    out = torch.zeros(T, HQ, D, dtype=torch.float64, device=DEVICE)
    for t in range(T):
        r, p = int(b["req"][t]), int(b["pos"][t])
        n = p + 1
        rows = b["bt"][r, : -(-n // PAGE)].long()
        k = deq[rows, 0].flatten(0, 1)[:n]
        v = deq[rows, 1].flatten(0, 1)[:n]
        kb = torch.arange(n, device=DEVICE) // B
        for g in range(HKV):
            blocks = sel[t, g][sel[t, g] >= 0].long()
            allowed = (kb[:, None] == blocks[None, :]).any(-1)
            s = (q[t, g * G:(g + 1) * G].double() @ k[:, g].T) * scale
            s = s.masked_fill(~allowed[None, :], float("-inf"))
            out[t, g * G:(g + 1) * G] = torch.softmax(s, -1) @ v[:, g]
    return out


CASES = {
    # decode: one new token per request, contexts shorter than / exactly /
    # longer than the selected blocks
    "decode": lambda: [(5 * B + 3, 1), (B - 1, 1), (2 * B - 1, 1)] + (
        [(40000, 1), (131071, 1)] if ON_GPU else []),
    # prefill: chunked (earlier context) and from scratch
    "prefill": lambda: [(3 * B - 5, 9), (0, B // 2 + 3)] + ([(8000, 300)] if ON_GPU else []),
}


@pytest.mark.parametrize("mode", [1, 2], ids=["scalar", "per_token_head"])
@pytest.mark.parametrize("case", list(CASES))
def test_fp8_kv_scales_vs_dequantized(mode, case):
    seed = _seed()
    b = _make_batch(CASES[case]())
    q = torch.randn(b["T"], HQ, D, device=DEVICE).to(DTYPE)
    kv8, ks, vs, kvs, deq = _fp8_cache(b, mode)
    sel = _selection(b)
    scale = D ** -0.5
    ref = _ref(b, q, deq, sel, scale)
    # dequantised cache in the model dtype, run through the no-scale path
    deq_cache = deq.to(DTYPE)
    args = (b["bt"], b["req"], b["pos"], sel, B, scale)
    for splits in (1, 2) if case == "decode" else (1,):
        out = torch.full_like(q, float("nan"))
        got = block_sparse_attention(q, kv8, *args, mode, ks, vs, kvs, out=out, num_splits=splits)
        torch.testing.assert_close(got.double(), ref, atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"[seed {seed} splits {splits}] vs float64: {m}")
        base = block_sparse_attention(q, deq_cache, *args, 0, out=torch.full_like(q, float("nan")),
                                      num_splits=splits)
        torch.testing.assert_close(got.float(), base.float(), atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"[seed {seed} splits {splits}] vs dequantized "
                                                 f"{DTYPE} cache: {m}")


def test_fp8_scalar_scales_are_live_tensors():
    """Scalar scales are read from device tensors at run time: doubling v_scale
    doubles the output; changing k_scale in place changes the softmax like
    the reference does (nothing is baked in at compile time)."""
    seed = _seed()
    b = _make_batch([(2 * B + 3, 1), (B + 1, 6)])
    q = torch.randn(b["T"], HQ, D, device=DEVICE).to(DTYPE)
    kv8, ks, vs, _, _ = _fp8_cache(b, 1)
    sel = _selection(b)
    args = (b["bt"], b["req"], b["pos"], sel, B, D ** -0.5)
    o1 = block_sparse_attention(q, kv8, *args, 1, ks, vs, None).float()
    vs.mul_(2.0)
    o2 = block_sparse_attention(q, kv8, *args, 1, ks, vs, None).float()
    torch.testing.assert_close(o2, 2 * o1, atol=2 * ATOL, rtol=RTOL,
                               msg=lambda m: f"[seed {seed}] v_scale: {m}")
    ks.mul_(3.0)
    o3 = block_sparse_attention(q, kv8, *args, 1, ks, vs, None).double()
    deq = kv8.double()
    deq[:, 0] *= ks.double()
    deq[:, 1] *= vs.double()
    ref = _ref(b, q, deq, sel, D ** -0.5)
    torch.testing.assert_close(o3, ref, atol=2 * ATOL, rtol=RTOL,
                               msg=lambda m: f"[seed {seed}] k_scale: {m}")
