# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 with Quark OCP MXFP4 checkpoints (the amd/MiniMax-M3-MXFP4
format: ``quant_method: quark``, MXFP4 weights with E8M0 scales per 32 inputs
and dynamic MXFP4 activations on the routed and shared experts only).

What vLLM v0.23.0 can do with it: the Quark OCP MX MoE method picks a native
MXFP4 x MXFP4 backend where one exists (AMD), else its emulation
(``OCP_MXQuantizationEmulationTritonExperts``: Triton experts on weights
dequantized on the fly, activations quantize-dequantized), and the shared
expert's linears emulate in PyTorch; both emulations call the ``amd-quark``
package. On CPU that path does not exist (the emulated experts are Triton GPU
kernels); the model refuses at construction, naming the checkpoint and the
alternatives. On an NVIDIA GPU without ``amd-quark`` it refuses likewise.

The series' own path, on every platform: ``VLLM_MINIMAX_M3_MXFP4=bf16`` loads the
MXFP4 weights dequantized (``common/mxfp4.py``) into an unquantized model, a
weights-only approximation; its tests are at the end of this file (the engine
parity one also runs in the GPU job's mxfp8ckpt suite).

CPU stand-in (CPU_MXFP4_STANDIN: the CPU refusal lifted, MXFP4 weights
dequantized with ``mxfp4_checkpoint``'s reference, activations left in bf16 --
a weights-only approximation of the checkpoint's scheme): the real Quark
config resolution (exclude list, ``*experts*`` pattern), the real loading of
packed MXFP4 expert rows and their E8M0 scale rows (our gate/up interleave)
and of the shared expert's Quark linears; parity with transformers on the
dequantized weights (the bf16 criterion of test_minimax_m3_mxfp8.py) and a
checkpoint with reversed expert scale rows failing it. The GPU path (Quark's
emulation with MXFP4 activations, amd-quark) has no parity test yet.
"""

import json
import os
import shutil

import pytest
import torch

from minimax_m3_utils import build_checkpoint, hf_token_logprobs, read_checkpoint, run_vllm
from mxfp4_checkpoint import (EXPERT_RE, convert_to_quark_mxfp4, dequantize_checkpoint,
                              dequantize_mxfp4, quantize_mxfp4)
from mxfp8_checkpoint import vary_rows

pytest.importorskip("transformers.models.minimax_m3_vl")

_MXFP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
          "is_dynamic": False, "scale_format": "e8m0", "round_method": "half_even",
          "observer_cls": "PerBlockMXObserver", "symmetric": None, "scale_type": "float",
          "mx_element_dtype": None, "scale_calculation_mode": "even"}
QUARK_MXFP4 = {
    "quant_method": "quark",
    "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized",
               "weight_merge_groups": None, "min_kv_scale": 0.0},
    "global_quant_config": {"weight": None, "input_tensors": None, "output_tensors": None,
                            "bias": None, "target_device": None},
    "layer_type_quant_config": {},
    "layer_quant_config": {
        pattern: {"weight": dict(_MXFP4), "input_tensors": dict(_MXFP4, is_dynamic=True),
                  "output_tensors": None, "bias": None, "target_device": None}
        for pattern in ("*block_sparse_moe.experts.*", "*block_sparse_moe.shared_experts.*")
    },
    "exclude": ["lm_head"],
    "algo_config": None,
    "quant_mode": "eager_mode",
}


def test_quark_ocp_mx_is_detected():
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
    from vllm.models.minimax_m3.common.model import _quark_ocp_mx

    assert _quark_ocp_mx(QuarkConfig.from_config(json.loads(json.dumps(QUARK_MXFP4))))
    fp8 = json.loads(json.dumps(QUARK_MXFP4))
    for c in fp8["layer_quant_config"].values():
        c["weight"] = dict(c["weight"], dtype="fp8_e4m3", qscheme="per_channel")
        c["input_tensors"] = None
    assert not _quark_ocp_mx(QuarkConfig.from_config(fp8))
    assert not _quark_ocp_mx(None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
def test_mxfp4_quark_on_cpu_is_refused_clearly(tmp_path):
    path = build_checkpoint(str(tmp_path / "src"))
    dst = str(tmp_path / "mxfp4")
    shutil.copytree(path, dst)
    p = os.path.join(dst, "config.json")
    cfg = json.load(open(p))
    cfg["quantization_config"] = QUARK_MXFP4
    json.dump(cfg, open(p, "w"))
    res = run_vllm(str(tmp_path / "run"), dst, [[5, 6, 7]], 1, timeout=300,
                   llm_kwargs=dict(dtype="bfloat16", block_size=32, max_model_len=128))
    err = res.get("error", "") + res.get("traceback", "")
    assert "amd/MiniMax-M3-MXFP4" in err and "cannot run on CPU" in err, err[-3000:]
    assert "serve the BF16 checkpoint MiniMaxAI/MiniMax-M3" in err, err[-3000:]
    assert "VLLM_MINIMAX_M3_MXFP4=bf16" in err, err[-3000:]   # the path that works here


CPU_MXFP4_STANDIN = """
import sys, torch
sys.path.insert(0, %r)
from mxfp4_checkpoint import dequantize_mxfp4
from vllm.models.minimax_m3.common import model as m3model
from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
from vllm.model_executor.layers.quantization.quark import quark_moe
from vllm.model_executor.layers.quantization.quark.schemes import quark_ocp_mx
from vllm.model_executor.utils import replace_parameter

m3model._check_mx_platform = lambda quant_config: None  # the CPU refusal, lifted
quark_moe.select_mxfp4_moe_backend = (
    lambda moe, activation_key=None: (Mxfp4MoeBackend.NONE, None))

def linear_apply(self, layer, x, bias=None):
    w = dequantize_mxfp4(layer.weight.data, layer.weight_scale.data).to(x.dtype)
    return torch.nn.functional.linear(x, w, bias)

def dequantized_experts(self, layer):
    for w in ("w13", "w2"):
        q, s = getattr(layer, w + "_weight"), getattr(layer, w + "_weight_scale")
        replace_parameter(layer, w + "_weight",
                          dequantize_mxfp4(q.data, s.data).to(torch.bfloat16))
        delattr(layer, w + "_weight_scale")
        if getattr(layer, w + "_bias", 0) is None:  # Quark sets None; CPU MoE checks hasattr
            delattr(layer, w + "_bias")
    method = UnquantizedFusedMoEMethod(layer.moe_config)
    layer._replace_quant_method(method)
    method.process_weights_after_loading(layer)

quark_ocp_mx.QuarkOCP_MX.apply_weights = linear_apply
quark_moe.QuarkOCP_MX_MoEMethod.process_weights_after_loading = dequantized_experts
""" % os.path.dirname(os.path.abspath(__file__))


def test_mxfp4_generator_format(tmp_path):
    src = build_checkpoint(str(tmp_path / "src"))
    out = convert_to_quark_mxfp4(src, str(tmp_path / "mx4"))
    before, after = read_checkpoint(src), read_checkpoint(out)
    experts = [n for n in before if EXPERT_RE.match(n)]
    assert len(experts) == 2 * 4 * 3 + 2 * 3  # routed w1/w3/w2 and shared, 2 MoE layers
    for n in experts:
        w, q, s = before[n], after[n], after[n[: -len("weight")] + "weight_scale"]
        assert q.dtype == torch.uint8 and q.shape == (w.shape[0], w.shape[1] // 2), n
        assert s.dtype == torch.uint8 and s.shape == (w.shape[0], w.shape[1] // 32), n
        d = dequantize_mxfp4(q, s)
        scale = torch.exp2(s.float() - 127).repeat_interleave(32, dim=1)
        # E2M1 steps are at most 2 (between 4 and 6): error <= 1 unit of the scale
        assert bool(((d - w.float()).abs() <= scale + 1e-12).all()), n
    for n in before:
        if n not in experts:
            assert torch.equal(after[n], before[n]), n
    cfg = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    assert "language_model.lm_head" in cfg["exclude"]
    assert "language_model.model.layers.1.self_attn.index_q_proj" in cfg["exclude"]
    assert not any("experts" in e for e in cfg["exclude"])


def _corrupt(path):
    from safetensors.torch import save_file

    t = read_checkpoint(path)
    for n in t:
        if ".experts." in n and n.endswith(".weight_scale"):
            t[n] = t[n].flip(0).contiguous()
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def _assert_bf16_parity(label: str, got, bad, deq: str, prompts) -> None:
    """The engine's prompt logprobs ``got`` match transformers on the dequantized
    checkpoint ``deq`` as closely as transformers' own bf16 matches its fp32 (the
    criterion of test_minimax_m3_mxfp8.py), and ``bad`` (reversed expert scale rows)
    does not."""
    from transformers.models.minimax_m3_vl import MiniMaxM3SparseForConditionalGeneration

    def hf(dtype):
        m = MiniMaxM3SparseForConditionalGeneration.from_pretrained(deq, dtype=dtype).eval()
        return torch.tensor([x for p in prompts for x in hf_token_logprobs(m, p)])

    ref32, ref16 = hf(torch.float32), hf(torch.bfloat16)
    hf_err = (ref16 - ref32).abs().mean().item()
    err = (got - ref32).abs().mean().item()
    bad_err = (bad - ref32).abs().mean().item()
    print(f"{label}: mean |diff| {err:.4f} (transformers bf16 {hf_err:.4f}); "
          f"reversed expert scale rows {bad_err:.4f}")
    assert err <= 1.5 * hf_err + 0.02, (err, hf_err)
    assert (got - ref16).abs().median().item() < 0.15
    assert bad_err > max(1.5 * hf_err + 0.02, 2 * err), (bad_err, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU stand-in")
def test_mxfp4_cpu_standin_matches_transformers_on_dequantized_weights(tmp_path):
    base = build_checkpoint(str(tmp_path / "base"), initializer_range=0.1)
    src = vary_rows(base, str(tmp_path / "src"), EXPERT_RE)
    mx = convert_to_quark_mxfp4(src, str(tmp_path / "mx4"))
    deq = dequantize_checkpoint(mx, str(tmp_path / "deq"))
    g = torch.Generator().manual_seed(4321)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist()
               for n in (5, 17, 32, 48, 64, 100, 150, 200)]
    kw = dict(dtype="bfloat16", block_size=32, max_model_len=256, max_num_seqs=8,
              enable_prefix_caching=False)
    probe = """
def probe(model):
    out = {}
    for n, m in model.named_modules():
        if n.endswith((".qkv_proj", ".gate_up_proj", ".down_proj", ".index_q_proj")):
            s = getattr(m, "scheme", None)
            out[n] = type(s if s is not None else m.quant_method).__name__
        elif n.endswith(".experts"):
            out[n] = type(m.base_quant_method).__name__
    return out
"""

    def lps(name, path, **more):
        res = run_vllm(str(tmp_path / f"run_{name}"), path, prompts, 1, prompt_logprobs=0,
                       llm_kwargs=kw, setup=CPU_MXFP4_STANDIN, **more)
        assert "error" not in res, res.get("traceback", res)
        return res, torch.tensor([x for o in res["rounds"][0] for x in o["prompt_logprobs"][1:]])

    res, got = lps("mx4", mx, probe=probe)
    schemes = res["probe"]
    assert schemes["model.layers.1.block_sparse_moe.experts"] == "QuarkOCP_MX_MoEMethod"
    assert schemes["model.layers.1.block_sparse_moe.shared_experts.gate_up_proj"] == "QuarkOCP_MX"
    assert schemes["model.layers.0.self_attn.qkv_proj"] == "UnquantizedLinearMethod"
    assert schemes["model.layers.2.mlp.down_proj"] == "UnquantizedLinearMethod"
    assert schemes["model.layers.1.self_attn.index_q_proj"] == "UnquantizedLinearMethod"

    _, bad = lps("corrupt", _corrupt(convert_to_quark_mxfp4(src, str(tmp_path / "bad"))))
    _assert_bf16_parity("mxfp4 stand-in", got, bad, deq, prompts)


# ---- the weights-only path: VLLM_MINIMAX_M3_MXFP4=bf16 (common/mxfp4.py) ----

def test_mxfp4_dequantizer_matches_the_reference_and_names_bad_tensors():
    """The product's dequantizer (its own code) against this file's reference, on
    every code and a spread of scales; scales as float8_e8m0fnu are read as uint8;
    a shape or dtype mismatch and the E8M0 NaN code are errors naming the tensor."""
    from vllm.models.minimax_m3.common.mxfp4 import dequantize_mxfp4 as product

    g = torch.Generator().manual_seed(7)
    packed = torch.randint(0, 256, (6, 64), dtype=torch.uint8, generator=g)
    packed[0, :8] = torch.arange(8, dtype=torch.uint8) * 17 + torch.tensor(
        [0, 8, 0, 8, 0, 8, 0, 8], dtype=torch.uint8)   # every code, both nibbles
    scales = torch.randint(100, 150, (6, 4), dtype=torch.uint8, generator=g)
    want = dequantize_mxfp4(packed, scales)
    assert torch.equal(product(packed, scales, torch.float32), want)
    assert torch.equal(product(packed, scales, torch.bfloat16), want.to(torch.bfloat16))
    if hasattr(torch, "float8_e8m0fnu"):
        assert torch.equal(product(packed, scales.view(torch.float8_e8m0fnu),
                                   torch.float32), want)
    with pytest.raises(ValueError, match="experts.3.w1.weight holds .* but .* scales"):
        product(packed, scales[:, :3], torch.bfloat16, "experts.3.w1.weight")
    with pytest.raises(ValueError, match="must be uint8"):
        product(packed.to(torch.int16), scales, torch.bfloat16)
    nan = scales.clone()
    nan[2, 1] = 255
    with pytest.raises(ValueError, match="NaN"):
        product(packed, nan, torch.bfloat16, "experts.0.w2.weight")


def test_mxfp4_stream_pairs_weights_with_scales_in_any_order():
    from vllm.models.minimax_m3.common.mxfp4 import dequantized_weights

    q, s = quantize_mxfp4(torch.randn(4, 64))
    dense = torch.randn(3, 3)
    stream = [("a.weight_scale", s), ("x.weight", dense), ("a.weight", q),
              ("b.weight", q), ("b.weight_scale", s)]
    out = dict(dequantized_weights(stream, torch.float32))
    assert set(out) == {"a.weight", "x.weight", "b.weight"}
    assert torch.equal(out["a.weight"], dequantize_mxfp4(q, s)) and out["x.weight"] is dense
    with pytest.raises(ValueError, match="c.weight but no c.weight_scale"):
        list(dequantized_weights([("c.weight", q)], torch.float32))


def test_mxfp4_knob_refuses_unknown_values(monkeypatch):
    from vllm.models.minimax_m3.common import envs

    monkeypatch.setenv("VLLM_MINIMAX_M3_MXFP4", "fp4")
    with pytest.raises(ValueError, match="'emulate' .* or 'bf16'"):
        envs.VLLM_MINIMAX_M3_MXFP4
    monkeypatch.delenv("VLLM_MINIMAX_M3_MXFP4")
    assert envs.VLLM_MINIMAX_M3_MXFP4 == "emulate"


def test_mxfp4_weights_only_refuses_other_quark_schemes(monkeypatch):
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
    from vllm.models.minimax_m3.common.model import _mxfp4_as_bf16

    monkeypatch.setenv("VLLM_MINIMAX_M3_MXFP4", "bf16")
    assert _mxfp4_as_bf16(QuarkConfig.from_config(json.loads(json.dumps(QUARK_MXFP4))))
    mixed = json.loads(json.dumps(QUARK_MXFP4))
    mixed["layer_quant_config"]["*self_attn*"] = {
        "weight": dict(_MXFP4, dtype="fp8_e4m3", qscheme="per_tensor", group_size=None),
        "input_tensors": None, "output_tensors": None, "bias": None, "target_device": None}
    with pytest.raises(ValueError, match="also declares weight fp8_e4m3"):
        _mxfp4_as_bf16(QuarkConfig.from_config(mixed))
    monkeypatch.setenv("VLLM_MINIMAX_M3_MXFP4", "emulate")
    assert not _mxfp4_as_bf16(QuarkConfig.from_config(mixed))


def test_mxfp4_weights_only_matches_transformers_on_dequantized_weights(tmp_path):
    """The product path, nothing patched: VLLM_MINIMAX_M3_MXFP4=bf16 serves the
    synthetic amd/MiniMax-M3-MXFP4-format checkpoint (its weights dequantized while
    loading, the model unquantized) and matches transformers on the dequantized
    weights (the bf16 criterion of the stand-in test); a checkpoint with reversed
    expert scale rows fails it; a checkpoint missing a scale tensor is refused
    naming it."""
    from safetensors.torch import save_file

    base = build_checkpoint(str(tmp_path / "base"), initializer_range=0.1)
    src = vary_rows(base, str(tmp_path / "src"), EXPERT_RE)
    mx = convert_to_quark_mxfp4(src, str(tmp_path / "mx4"))
    deq = dequantize_checkpoint(mx, str(tmp_path / "deq"))
    g = torch.Generator().manual_seed(4321)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 32, 100, 200)]
    kw = dict(dtype="bfloat16", block_size=32, max_model_len=256, max_num_seqs=8,
              enable_prefix_caching=False)
    env = {"VLLM_MINIMAX_M3_MXFP4": "bf16"}
    probe = """
def probe(model):
    return sorted({type(m.quant_method).__name__ for m in model.modules()
                   if getattr(m, "quant_method", None) is not None})
"""

    def lps(name, path, **more):
        res = run_vllm(str(tmp_path / f"run_{name}"), path, prompts, 1, prompt_logprobs=0,
                       llm_kwargs=kw, env=env, **more)
        return res, (None if "error" in res else torch.tensor(
            [x for o in res["rounds"][0] for x in o["prompt_logprobs"][1:]]))

    res, got = lps("mx4", mx, probe=probe)
    assert got is not None, res.get("traceback", res)
    assert not any("Quark" in m or "Fp8" in m for m in res["probe"]), res["probe"]

    _, bad = lps("corrupt", _corrupt(convert_to_quark_mxfp4(src, str(tmp_path / "bad"))))
    _assert_bf16_parity("mxfp4 weights-only", got, bad, deq, prompts)

    gone = convert_to_quark_mxfp4(src, str(tmp_path / "gone"))
    t = read_checkpoint(gone)
    missing = next(n for n in t if ".experts." in n and n.endswith(".weight_scale"))
    del t[missing]
    save_file(t, os.path.join(gone, "model.safetensors"), metadata={"format": "pt"})
    res, _ = lps("gone", gone)
    err_text = res.get("error", "") + res.get("traceback", "")
    assert f"has {missing[:-len('_scale')]} but no {missing}" in err_text, err_text[-3000:]
