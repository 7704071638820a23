"""Upstream's MiniMax-M3 on vLLM's CPU build (the v0.26.0 flavor's CPU entry): its fused
CUDA ops fall back to torch ops, and the model imports where CUDA-only ops are absent.

The engine itself runs on CPU only once the sparse layers have CPU MSA ops (the next
entry; test_upstream_m3_series_msa.py checks it against transformers).
"""

import pytest
import torch

EPS = 1e-6


def _gemma_rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1 + w)


def _cos_sin(positions: int, rotary_dim: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    ang = torch.arange(positions).float()[:, None] * inv[None]
    return torch.cat((ang.cos(), ang.sin()), dim=-1)


@pytest.fixture
def case():
    torch.manual_seed(0)
    n, hq, hkv, d, hidx, didx, rd, page = 5, 4, 2, 16, 2, 8, 8, 4
    width = (hq + 2 * hkv) * d + (hidx + 1) * didx
    return dict(n=n, hq=hq, hkv=hkv, d=d, hidx=hidx, didx=didx, rd=rd, page=page,
                qkv=torch.randn(n, width), wq=torch.randn(d) * 0.1, wk=torch.randn(d) * 0.1,
                wiq=torch.randn(didx) * 0.1, wik=torch.randn(didx) * 0.1)


def _run(case, positions, slots):
    from vllm import _custom_ops as ops

    c = case
    qkv = c["qkv"].clone()
    kv_cache = torch.zeros(3, c["hkv"], c["page"], 2 * c["d"])
    index_cache = torch.zeros(3, c["page"], c["didx"])
    ops.fused_minimax_m3_qknorm_rope_kv_insert(
        qkv, c["wq"], c["wk"], _cos_sin(16, c["rd"]), positions, c["hq"], c["hkv"], c["rd"],
        EPS, c["wiq"], c["wik"], c["hidx"], slots, None, kv_cache, index_cache, c["page"])
    return qkv, kv_cache, index_cache


def test_fused_qknorm_rope_kv_insert_falls_back_to_torch_ops_on_cpu(case):
    """Position 0 rotates nothing: q and k are the per-head Gemma RMSNorm of the
    input, K/V rows land at their slots (K then V), the index key too, and a
    negative slot writes nothing."""
    c = case
    assert not hasattr(torch.ops._C, "fused_minimax_m3_qknorm_rope_kv_insert")
    n, hq, hkv, d = c["n"], c["hq"], c["hkv"], c["d"]
    slots = torch.tensor([0, 5, -1, 6, 11])
    qkv, kv_cache, index_cache = _run(case, torch.zeros(n, dtype=torch.long), slots)
    src = c["qkv"]
    q_ref = _gemma_rms(src[:, :hq * d].view(n, hq, d), c["wq"])
    k_ref = _gemma_rms(src[:, hq * d:(hq + hkv) * d].view(n, hkv, d), c["wk"])
    v_ref = src[:, (hq + hkv) * d:(hq + 2 * hkv) * d].view(n, hkv, d)
    torch.testing.assert_close(qkv[:, :hq * d].view(n, hq, d), q_ref)
    base = (hq + 2 * hkv) * d
    ik_ref = _gemma_rms(src[:, base + c["hidx"] * c["didx"]:], c["wik"])
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        page, off = divmod(slot, c["page"])
        torch.testing.assert_close(kv_cache[page, :, off, :d], k_ref[t])
        torch.testing.assert_close(kv_cache[page, :, off, d:], v_ref[t])
        torch.testing.assert_close(index_cache[page, off], ik_ref[t])
    written = {divmod(s, c["page"]) for s in slots.tolist() if s >= 0}
    for page in range(3):
        for off in range(c["page"]):
            if (page, off) not in written:
                assert not kv_cache[page, :, off].any() and not index_cache[page, off].any()


def test_rope_rotates_only_the_rotary_channels_and_keeps_their_norm(case):
    c = case
    n, hq, d, rd = c["n"], c["hq"], c["d"], c["rd"]
    at0, _, _ = _run(case, torch.zeros(n, dtype=torch.long), torch.full((n,), -1))
    at7, _, _ = _run(case, torch.full((n,), 7, dtype=torch.long), torch.full((n,), -1))
    q0, q7 = at0[:, :hq * d].view(n, hq, d), at7[:, :hq * d].view(n, hq, d)
    torch.testing.assert_close(q7[..., rd:], q0[..., rd:])
    torch.testing.assert_close(q7[..., :rd].norm(dim=-1), q0[..., :rd].norm(dim=-1))
    assert not torch.allclose(q7[..., :rd], q0[..., :rd])


def test_upstream_model_and_gemma_norm_import_on_cpu():
    """The fused all-reduce norm's CUDA-only imports no longer escape on CPU, and the
    model's Gemma RMSNorm runs in torch ops there."""
    import vllm.model_executor.layers.fused_allreduce_gemma_rms_norm  # noqa: F401
    from vllm.models.minimax_m3.common import torch_ops

    x, w = torch.randn(3, 32), torch.randn(32) * 0.1
    torch.testing.assert_close(torch_ops.gemma_rms_norm(x, w, EPS), _gemma_rms(x, w))
