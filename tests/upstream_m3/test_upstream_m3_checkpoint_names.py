"""The v0.26.0 flavor loads the tensor names every transformers release writes for
MiniMax-M3, not only the released ones (transformers 5.17's save_pretrained puts a
dense layer's MLP under ``block_sparse_moe.``; upstream's loader skipped those names
and left the dense MLP uninitialized: NaN logits on the GPU)."""

import json
import os
import re
import shutil

import pytest
import torch
from minimax_m3_utils import hf_token_logprobs, load_weights_copy_rest, run_vllm
from upstream_checkpoint import build_upstream_checkpoint

FP32_TOL = 1e-3


@pytest.mark.parametrize("name, want", [
    ("language_model.model.layers.0.block_sparse_moe.gate_proj.weight",
     "language_model.model.layers.0.mlp.gate_proj.weight"),
    ("language_model.model.layers.0.block_sparse_moe.down_proj.weight_scale_inv",
     "language_model.model.layers.0.mlp.down_proj.weight_scale_inv"),
    # an MoE layer's names are the released ones already
    ("language_model.model.layers.1.block_sparse_moe.gate.weight", None),
    ("language_model.model.layers.1.block_sparse_moe.shared_experts.up_proj.weight", None),
    ("language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight", None),
    ("language_model.model.layers.0.mlp.up_proj.weight", None),
])
def test_released_weight_name(name, want):
    from vllm.models.minimax_m3.common.checkpoint_names import released_weight_name

    assert released_weight_name(name) == (want or name)


def test_dense_mlp_saved_by_transformers_5_17_loads(tmp_path):
    """The released checkpoint with its dense layer's MLP renamed as transformers 5.17
    saves it gives transformers' logprobs through the engine (fp32, CPU)."""
    from safetensors.torch import save_file
    from transformers.models.minimax_m3_vl import MiniMaxM3SparseForConditionalGeneration

    hf_dir, released = build_upstream_checkpoint(str(tmp_path / "ckpt"))
    dst = str(tmp_path / "saved_by_5_17")
    tensors = load_weights_copy_rest(released, dst)
    shutil.copy(os.path.join(released, "config.json"), dst)
    renamed = {re.sub(r"(\.layers\.\d+)\.mlp\.", r"\1.block_sparse_moe.", k): v
               for k, v in tensors.items()}
    dense = json.load(open(os.path.join(released, "config.json")))["text_config"]["moe_layer_freq"]
    assert sum(".block_sparse_moe.down_proj." in k for k in renamed) == dense.count(0) > 0
    save_file(renamed, os.path.join(dst, "model.safetensors"))

    prompt = [3 + (7 * i) % 500 for i in range(200)]
    res = run_vllm(str(tmp_path / "engine"), dst, [prompt], max_tokens=1, prompt_logprobs=0,
                   llm_kwargs=dict(dtype="float32", block_size=128, max_model_len=512,
                                   language_model_only=True, enable_prefix_caching=False))
    assert "error" not in res, res.get("traceback", "") + res.get("log", "")[-4000:]
    model = MiniMaxM3SparseForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32).eval()
    ref = torch.tensor(hf_token_logprobs(model, prompt))
    diff = (torch.tensor(res["rounds"][0][0]["prompt_logprobs"][1:]) - ref).abs()
    assert diff.max().item() < FP32_TOL, (diff.max().item(), int(diff.argmax()))
