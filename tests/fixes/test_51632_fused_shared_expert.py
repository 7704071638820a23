"""Regression test for the series entry porting vllm-project/vllm#51632.

A Triton fused MoE whose shared expert is fused as one extra expert row
(w1/w2 hold 8 routed experts + 1 shared; every token selects its 2 routed
experts plus id 8) must equal a plain PyTorch MoE. Before the fix, alignment
used global_num_experts (8) and silently dropped every token routed to row 8.

`variant="entry"` runs the installed (patched) TritonExperts. `variant="base"`
reproduces v0.23.0's alignment count (global_num_experts even without an
expert map) to show that this test detects the bug: there the comparison
must fail. Needs a GPU (Triton on CUDA/ROCm); on CPU it skips.
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="Triton fused MoE needs a CUDA/ROCm GPU")

ROUTED, HIDDEN, INTER, TOKENS = 8, 256, 128, 64


def _reference(h, w1, w2, weights, ids):
    out = torch.zeros(h.shape[0], w2.shape[1], dtype=torch.float32, device=h.device)
    for t in range(h.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            act = torch.nn.functional.silu(h[t].float() @ w1[e].float().T)
            out[t] += weights[t, j] * (act @ w2[e].float().T)
    return out


def _run_triton(h, w1, w2, weights, ids, monkeypatch, variant):
    from vllm.model_executor.layers.fused_moe import config as moe_config_mod
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts import triton_moe

    if variant == "base":
        monkeypatch.setattr(triton_moe, "_num_align_experts",
                            lambda w1, global_num_experts, expert_map: global_num_experts)
    cfg = moe_config_mod.FusedMoEConfig(
        num_experts=ROUTED, experts_per_token=ids.shape[1], hidden_dim=HIDDEN,
        intermediate_size_per_partition=INTER, num_local_experts=ROUTED,
        num_logical_experts=ROUTED,
        moe_parallel_config=moe_config_mod.FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU_NO_MUL, in_dtype=h.dtype, device="cuda",
        routing_method=moe_config_mod.RoutingMethodType.TopK, max_num_tokens=512)
    experts = triton_moe.TritonExperts(moe_config=cfg,
                                       quant_config=moe_config_mod.FUSED_MOE_UNQUANTIZED_CONFIG)
    m, k, topk = h.shape[0], h.shape[1], ids.shape[1]
    ws1, ws2, out_shape = experts.workspace_shapes(
        M=m, N=INTER, K=k, topk=topk, global_num_experts=ROUTED, local_num_experts=ROUTED,
        expert_tokens_meta=None, activation=MoEActivation.SILU_NO_MUL)
    w13 = torch.empty(ws1[0] * ws1[1] * ws1[2], dtype=h.dtype, device=h.device)
    w2s = torch.empty(ws2[0] * ws2[1] * ws2[2], dtype=h.dtype, device=h.device)
    out = torch.zeros(out_shape, dtype=h.dtype, device=h.device)
    experts.apply(output=out, hidden_states=h, w1=w1, w2=w2, topk_weights=weights,
                  topk_ids=ids, activation=MoEActivation.SILU_NO_MUL,
                  global_num_experts=ROUTED, expert_map=None, a1q_scale=None, a2_scale=None,
                  workspace13=w13, workspace2=w2s, expert_tokens_meta=None,
                  apply_router_weight_on_input=False)
    return out.float()


@pytest.mark.parametrize("variant", ["entry", "base"])
@torch.inference_mode()
def test_fused_shared_expert_is_not_dropped(variant, monkeypatch, record_property):
    torch.manual_seed(0)
    dev = "cuda"
    h = torch.randn(TOKENS, HIDDEN, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(ROUTED + 1, INTER, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.05
    w2 = torch.randn(ROUTED + 1, HIDDEN, INTER, device=dev, dtype=torch.bfloat16) * 0.05
    routed = torch.stack([torch.randperm(ROUTED, device=dev)[:2] for _ in range(TOKENS)])
    ids = torch.cat([routed, torch.full((TOKENS, 1), ROUTED, device=dev)], 1).to(torch.int32)
    weights = torch.cat([torch.softmax(torch.randn(TOKENS, 2, device=dev), -1),
                         torch.ones(TOKENS, 1, device=dev)], 1).float()
    ref = _reference(h, w1, w2, weights, ids)
    got = _run_triton(h, w1, w2, weights, ids, monkeypatch, variant)
    bad = (~torch.isclose(got, ref, atol=2e-2, rtol=2e-2)).sum().item()
    record_property("differing", f"{bad} of {ref.numel()}")
    if variant == "entry":
        assert bad == 0
    else:
        assert bad > 0, "v0.23.0's alignment should drop the fused shared expert"
