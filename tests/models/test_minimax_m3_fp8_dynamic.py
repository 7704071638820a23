# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 from compressed-tensors FP8-dynamic checkpoints (the format of
the community MiniMax-M3-FP8-dynamic release) and FP8 KV-cache scales.

CPU, without FP8 GEMM:
  * the converter's output format (names, dtypes, scale shapes, config) and
    how vLLM's compressed-tensors config resolves it on our module names,
    for the three ``ignore`` naming styles;
  * the w13 gate/up interleave of FP8 weight rows and their per-channel
    scale rows, through FusedMoE's own w13 loader, at TP 1/2/4;
  * block-quantized FP8 experts are refused with a clear message (engine);
  * KV-cache scales load into dense and sparse layers (engine, FP8 KV cache)
    and through every checkpoint naming (direct ``_load_kv_scale`` calls).

End to end: an FP8-dynamic checkpoint served vs. its bf16 source (same
engine settings, bf16 activations, 8 prompts of 5-200 tokens, teacher-forced
prompt logprobs). The source gets row magnitudes spread over [1/8, 8] (what
per-channel scales are for) and initializer range 0.1. ``native`` (GPU only;
skipped on CPU, see FP8_ON_CPU_REASON) runs vLLM's FP8 kernels;
``cpu_standin`` runs the real FP8 linears and the real FP8 checkpoint loading
with the experts dequantized after loading (CPU_FP8_STANDIN).
Tolerances: an FP8 emulation in transformers (per-row FP8 weights, per-token
FP8 activations) puts the mean |prompt logprob diff| to bf16 at 0.13-0.18
nats over 3 random models and 0.195 for this one, with the first generated
token equal on 4-7 of 8 prompts; the CPU stand-in measured 0.198 (0.202 with
the indexer quantized too), first tokens 6/8, and 0.68 (first tokens 0/8)
for a checkpoint whose expert scale rows are reversed (scale/row
misalignment). Asserted: mean diff <= 0.35 and >= 3 of 8 first tokens equal;
the corrupted checkpoint must exceed both 0.35 and 2x the good one's diff.
"""

import json
import math
import os
import re
import shutil

import pytest
import torch

from fp8_dynamic_checkpoint import (
    _INDEXER_RE,
    _TARGET_RE,
    add_kv_cache_scales,
    convert_to_fp8_dynamic,
    quantize_per_channel,
)
from minimax_m3_utils import (build_checkpoint, needs_fp8_kv_engine, read_checkpoint,
                              run_vllm)

pytest.importorskip("transformers.models.minimax_m3_vl")

FP8_ON_CPU_REASON = (
    "compressed-tensors W8A8 FP8 does not run on vLLM v0.23.0's CPU platform: "
    "without a device capability the linears fall back to "
    "CompressedTensorsW8A16Fp8, which has no CPU kernel ('Failed to find a "
    "kernel that can implement the ScaledMM linear layer'), and the CPU FP8 "
    "MoE experts take only block-quantized weights with silu. Run on a GPU."
)
ON_GPU = torch.cuda.is_available()

# CPU stand-in for the parts vLLM's CPU platform lacks (see FP8_ON_CPU_REASON):
# the capability gate is lifted, so the linears take the real W8A8 FP8 scheme
# (vLLM's ChannelWiseTorchFP8ScaledMMLinearKernel: torch._scaled_mm on FP8
# weights and per-token FP8 activations); the experts load through the real
# W8A8 FP8 MoE method (FP8 w13/w2 + per-channel scales, our gate/up
# interleave) and are then dequantized into vLLM's unquantized CPU experts.
CPU_FP8_STANDIN = """
from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.quantization.compressed_tensors import (
    compressed_tensors as ct)
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
    compressed_tensors_moe_w8a8_fp8 as ct_moe)
from vllm.model_executor.utils import replace_parameter

ct.CompressedTensorsConfig._check_scheme_supported = staticmethod(
    lambda min_capability, error=True, match_exact=False: not match_exact)

def dequantized_experts(self, layer):
    for w in ("w13", "w2"):
        q, s = getattr(layer, w + "_weight"), getattr(layer, w + "_weight_scale")
        replace_parameter(layer, w + "_weight", (q.float() * s).to(layer.orig_dtype))
        delattr(layer, w + "_weight_scale")
    method = UnquantizedFusedMoEMethod(layer.moe_config)
    layer._replace_quant_method(method)
    method.process_weights_after_loading(layer)

ct_moe.CompressedTensorsW8A8Fp8MoEMethod.process_weights_after_loading = (
    dequantized_experts)
"""

# mean |prompt logprob diff| to bf16, nats: measured 0.20 on CPU (experts without
# activation quantization there); headroom for the GPU's FP8 experts
GOOD_TOL = 0.35
MIN_FIRST_EQUAL = 3  # of 8 prompts (emulated 4-7, measured 6)
PROMPT_LENS = [5, 17, 32, 48, 64, 100, 150, 200]


def _prompts():
    g = torch.Generator().manual_seed(4321)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("m3fp8")
    return {"dir": d, "path": build_checkpoint(str(d / "src"))}


# ------------------------------------------------------------ converter format


@pytest.mark.parametrize("layout", ["saved", "transformers_5_17"])
def test_converter_output_format(src, tmp_path, layout):
    path = src["path"]
    if layout != "saved":  # the other transformers version's on-disk names
        from minimax_m3_utils import hf_state_dict, write_layout
        from transformers.models.minimax_m3_vl import MiniMaxM3SparseForConditionalGeneration
        sd = hf_state_dict(MiniMaxM3SparseForConditionalGeneration.from_pretrained(path))
        path = write_layout(path, str(tmp_path / layout), sd, layout)
    out = convert_to_fp8_dynamic(path, str(tmp_path / "fp8"))
    before, after = read_checkpoint(path), read_checkpoint(out)
    targeted = [n for n in before if _TARGET_RE.match(n)]
    # attention q/k/v/o (4 layers), dense MLP (2 layers), experts (2 layers x 4
    # experts x w1/w3/w2), shared experts (2 layers)
    assert len(targeted) == 4 * 4 + 2 * 3 + 2 * 4 * 3 + 2 * 3
    for n in targeted:
        w, q = before[n], after[n]
        s = after[n[: -len("weight")] + "weight_scale"]
        assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape, n
        assert s.dtype == torch.float32 and s.shape == (w.shape[0], 1), n
        torch.testing.assert_close(s, w.float().abs().amax(1, keepdim=True) / 448.0)
        err = (q.float() * s - w.float()).abs()
        assert bool((err <= w.float().abs() / 16 + s * 2.0**-9).all()), n
    kept = [n for n in before if n not in targeted]
    for n in kept:  # lm_head, router gates, indexer, norms, embeddings, vision
        assert after[n].dtype == before[n].dtype and torch.equal(after[n], before[n]), n
    assert set(after) == set(before) | {n[: -len("weight")] + "weight_scale" for n in targeted}
    for n in ("language_model.lm_head.weight",
              "language_model.model.layers.1.block_sparse_moe.gate.weight",
              "language_model.model.layers.1.self_attn.index_q_proj.weight",
              "language_model.model.embed_tokens.weight"):
        assert n in kept and n[: -len("weight")] + "weight_scale" not in after

    cfg = json.load(open(os.path.join(out, "config.json")))
    q = cfg["quantization_config"]
    assert "quantization_config" not in cfg["text_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "float-quantized"
    (group,) = q["config_groups"].values()
    assert group["targets"] == ["Linear"]
    assert {k: group["weights"][k] for k in ("num_bits", "type", "strategy", "symmetric",
                                              "dynamic")} == dict(
        num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False)
    assert {k: group["input_activations"][k] for k in ("num_bits", "type", "strategy",
                                                        "symmetric", "dynamic")} == dict(
        num_bits=8, type="float", strategy="token", symmetric=True, dynamic=True)
    assert q["kv_cache_scheme"] is None
    assert r"re:.*block_sparse_moe\.gate$" in q["ignore"] and "re:.*lm_head$" in q["ignore"]

    # vLLM finds it at the top level of the VL wrapper config
    import vllm.config  # noqa: F401  (import order: the convertor needs it first)
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3VLConfig
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )
    hf = MiniMaxM3VLConfig.from_pretrained(out)
    conv = ModelArchConfigConvertorBase(hf, hf.text_config)
    assert conv.get_quantization_config()["quant_method"] == "compressed-tensors"


def _ct_config(path):
    """The compressed-tensors config vLLM builds for our model class."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (  # noqa: E501
        CompressedTensorsConfig,
    )
    from vllm.models.minimax_m3.common.model import MiniMaxM3SparseForCausalLM

    cfg = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
    qc = CompressedTensorsConfig.from_config(cfg)
    qc.apply_vllm_mapper(MiniMaxM3SparseForCausalLM.hf_to_vllm_mapper)
    qc.packed_modules_mapping = MiniMaxM3SparseForCausalLM.packed_modules_mapping
    return qc


@pytest.mark.parametrize("quantize_indexer", [False, True])
@pytest.mark.parametrize("style", ["regex", "released", "transformers"])
def test_ignore_and_targets_match_model_prefixes(src, tmp_path, style, quantize_indexer):
    """Each ``ignore`` naming (regex patterns, released module names,
    transformers' module names) resolves on the prefixes our model builds
    its layers with: the linears get the FP8 scheme, the experts too (vLLM
    looks them up as ``<experts>.0.gate_proj``), the indexer only when it
    was quantized, lm_head never. (The router gate is built without a quant
    config, so its ignore entry needs no match.)"""
    from compressed_tensors.quantization import QuantizationStrategy

    from vllm.model_executor.layers.fused_moe import FusedMoE
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    out = convert_to_fp8_dynamic(src["path"], str(tmp_path / "fp8"),
                                 ignore_style=style, quantize_indexer=quantize_indexer)
    qc = _ct_config(out)
    mod = {c: object.__new__(c) for c in (QKVParallelLinear, RowParallelLinear,
                                         MergedColumnParallelLinear, ReplicatedLinear,
                                         ParallelLMHead, FusedMoE)}
    fp8 = [
        ("model.layers.0.self_attn.qkv_proj", QKVParallelLinear),
        ("model.layers.1.self_attn.o_proj", RowParallelLinear),
        ("model.layers.0.mlp.gate_up_proj", MergedColumnParallelLinear),
        ("model.layers.2.mlp.down_proj", RowParallelLinear),
        ("model.layers.3.block_sparse_moe.shared_experts.gate_up_proj",
         MergedColumnParallelLinear),
        ("model.layers.1.block_sparse_moe.shared_experts.down_proj", RowParallelLinear),
    ]
    plain = [("lm_head", ParallelLMHead)]
    indexer = [("model.layers.1.self_attn.index_q_proj", ReplicatedLinear),
               ("model.layers.3.self_attn.index_k_proj", ReplicatedLinear)]
    (fp8 if quantize_indexer else plain).extend(indexer)
    for name, cls in fp8:
        d = qc.get_scheme_dict(mod[cls], name)
        assert d is not None, name
        assert d["weights"].strategy == QuantizationStrategy.CHANNEL, name
        assert d["input_activations"].strategy == QuantizationStrategy.TOKEN, name
        assert d["input_activations"].dynamic, name
    for name, cls in plain:
        assert qc.get_scheme_dict(mod[cls], name) is None, name
    qc._add_fused_moe_to_target_scheme_map()  # what the MoE method lookup does
    for e in ("1", "3"):
        base = f"model.layers.{e}.block_sparse_moe.experts"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            d = qc.get_scheme_dict(mod[FusedMoE], f"{base}.0.{proj}")
            assert d is not None and d["weights"].strategy == QuantizationStrategy.CHANNEL


# ------------------------------------------------------------ w13 interleave


def _fused_moe_w13_loader(tp_size):
    """FusedMoE's own w13 shard loader (``_load_w13``) on a stand-in layer."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.fused_moe import FusedMoE

    fake = SimpleNamespace(
        moe_config=SimpleNamespace(
            is_act_and_mul=True, moe_parallel_config=SimpleNamespace(tp_size=tp_size)),
        _get_hidden_dim=FusedMoE._get_hidden_dim,
        _narrow_expert_data_for_padding=FusedMoE._narrow_expert_data_for_padding,
    )
    return lambda **kw: FusedMoE._load_w13(fake, **kw)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_w13_interleave_moves_fp8_rows_and_scale_rows_together(tp_size):
    from vllm.models.minimax_m3.common.layers import interleave_gate_up_rows

    inter, hidden = 8, 16
    g = torch.Generator().manual_seed(0)
    rows = torch.exp(torch.randn(2 * inter, 1, generator=g))  # row magnitudes differ
    gate_w = torch.randn(inter, hidden, generator=g) * rows[:inter]
    up_w = torch.randn(inter, hidden, generator=g) * rows[inter:]
    (gate_q, gate_s), (up_q, up_s) = quantize_per_channel(gate_w), quantize_per_channel(up_w)
    first_q, second_q = interleave_gate_up_rows(gate_q, up_q, tp_size)
    first_s, second_s = interleave_gate_up_rows(gate_s, up_s, tp_size)
    assert first_q.dtype == torch.float8_e4m3fn and first_s.shape == (inter, 1)
    load = _fused_moe_w13_loader(tp_size)
    n = inter // tp_size
    for rank in range(tp_size):
        w13 = torch.zeros(2 * n, hidden, dtype=torch.float8_e4m3fn)
        s13 = torch.zeros(2 * n, 1)
        for dst, a, b in ((w13, first_q, second_q), (s13, first_s, second_s)):
            load(expert_data=dst, shard_dim=0, shard_id="w1", loaded_weight=a, tp_rank=rank)
            load(expert_data=dst, shard_dim=0, shard_id="w3", loaded_weight=b, tp_rank=rank)
        # direct formula: rank r holds gate/up rows r*n .. r*n+n-1, interleaved
        for i in range(n):
            src_row = rank * n + i
            assert torch.equal(w13[2 * i].view(torch.uint8), gate_q[src_row].view(torch.uint8))
            assert torch.equal(w13[2 * i + 1].view(torch.uint8), up_q[src_row].view(torch.uint8))
            assert s13[2 * i] == gate_s[src_row] and s13[2 * i + 1] == up_s[src_row]
        # dequantized: the interleaved rows of the original weights (to FP8 error)
        want = torch.stack((gate_w[rank * n:(rank + 1) * n],
                            up_w[rank * n:(rank + 1) * n]), dim=1).reshape(2 * n, hidden)
        torch.testing.assert_close(w13.float() * s13, want, rtol=0.07, atol=1e-3)


def test_interleave_refuses_odd_tp_split():
    from vllm.models.minimax_m3.common.layers import interleave_gate_up_rows

    with pytest.raises(ValueError, match="not divisible by the tensor parallel size 4"):
        interleave_gate_up_rows(torch.zeros(6, 4), torch.zeros(6, 4), 4)


def _with_quant_config(src_path, dst, qcfg):
    shutil.copytree(src_path, dst)
    p = os.path.join(dst, "config.json")
    cfg = json.load(open(p))
    cfg["quantization_config"] = qcfg
    json.dump(cfg, open(p, "w"), indent=2)
    return dst


def test_block_quantized_fp8_experts_are_refused(src):
    """Block FP8 experts: one scale spans a block of gate or up rows, which the
    interleave would split; the engine refuses at model construction, naming
    the scheme and what to serve instead. (Only the experts are targeted, so
    the CPU build gets as far as the MoE layer.)"""
    block = {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [16, 16],
        "symmetric": True, "dynamic": False,
    }
    act = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 16,
           "symmetric": True, "dynamic": True}
    qcfg = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": [r"re:.*block_sparse_moe\.experts\..*"],
                                      "weights": block, "input_activations": act}},
        "ignore": [],
    }
    path = _with_quant_config(src["path"], str(src["dir"] / "block_fp8"), qcfg)
    res = run_vllm(str(src["dir"] / "run_block"), path, [[5, 6, 7]], 1, timeout=300,
                   llm_kwargs=dict(dtype="bfloat16", block_size=32, max_model_len=128))
    err = res.get("error", "") + res.get("traceback", "")
    assert "CompressedTensorsW8A8Fp8MoEMethod" in err, err[-3000:]
    assert "holds block scales (block [16, 16])" in err, err[-3000:]
    assert "per-channel FP8" in err and "MiniMax-M3-FP8-dynamic" in err, err[-3000:]


# ------------------------------------------------------------ KV-cache scales

KV_SCALES = {0: (0.5, 0.25), 1: (0.75, 0.125), 2: (1.5, 0.0625), 3: (0.375, 2.0)}

_KV_PROBE = '''
def probe(model):
    out = {}
    for n, m in model.named_modules():
        if n.endswith("self_attn.attn"):
            out[n] = [float(m._k_scale.reshape(-1)[0]), float(m._v_scale.reshape(-1)[0]),
                      type(m).__name__, str(m.kv_cache_dtype)]
    return out
'''


@needs_fp8_kv_engine
def test_kv_cache_scales_load_into_dense_and_sparse_layers(src):
    """A compressed-tensors checkpoint with FP8 KV-cache scales (a KV-cache-only
    recipe: no weight quantization) runs with an FP8 KV cache; the dense
    layer's Attention and the sparse layers' MSA attention hold the
    checkpoint's k/v scales."""
    path = add_kv_cache_scales(src["path"], str(src["dir"] / "kv_scales"), KV_SCALES)
    res = run_vllm(str(src["dir"] / "run_kv"), path, [list(range(3, 80))], 4, probe=_KV_PROBE,
                   llm_kwargs=dict(dtype="bfloat16", block_size=32, max_model_len=256,
                                   enable_prefix_caching=False))
    assert "error" not in res, res.get("traceback", res)
    assert len(res["rounds"][0][0]["tokens"]) == 4
    got = res["probe"]
    for layer, (k, v) in KV_SCALES.items():
        k_got, v_got, cls, dtype = got[f"model.layers.{layer}.self_attn.attn"]
        assert cls == ("Attention" if layer == 0 else "MiniMaxM3SparseAttention")
        assert dtype == "fp8", (layer, dtype)  # the checkpoint's kv_cache_scheme
        assert (k_got, v_got) == (k, v), (layer, k_got, v_got)


def test_kv_scale_namings_route_to_sparse_buffers():
    """Every checkpoint naming vLLM knows for KV scales reaches a sparse
    layer's scalar buffers; per-head scales reduce to their max; a dense
    layer's scale goes to its parameter; bad scales are refused."""
    from torch import nn

    from vllm.models.minimax_m3.common.model import MiniMaxM3SparseForCausalLM

    load = MiniMaxM3SparseForCausalLM._load_kv_scale

    class Sparse(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("_k_scale", torch.ones(()))
            self.register_buffer("_v_scale", torch.ones(()))

    sp = Sparse()
    dense_k = nn.Parameter(torch.ones(1), requires_grad=False)
    params = {"model.layers.0.self_attn.attn.k_scale": dense_k}
    sparse_attn = {"model.layers.1.self_attn.attn": sp}
    names = dict(params)
    for a in ("k_scale", "v_scale", "q_scale", "k_zero_point", "v_zero_point",
              "q_zero_point"):
        names[f"model.layers.1.self_attn.attn.{a}"] = None
    loaded = set()

    def put(name, value):
        load(name, torch.tensor(value), names, params, sparse_attn, loaded)

    put("model.layers.1.self_attn.k_scale", [0.5])  # compressed-tensors
    put("model.layers.1.self_attn.v_proj.v_scale", 0.25)  # ModelOpt
    assert (float(sp._k_scale), float(sp._v_scale)) == (0.5, 0.25)
    put("model.layers.1.self_attn.attn.k_scale", [[[0.1]], [[0.7]]])  # per head
    assert float(sp._k_scale) == pytest.approx(0.7)
    put("model.layers.1.self_attn.kv_scale", 0.3)  # deprecated single scale
    assert (float(sp._k_scale), float(sp._v_scale)) == pytest.approx((0.3, 0.3))
    put("model.layers.1.self_attn.q_scale", [9.0])  # not used by the MSA backend
    put("model.layers.1.self_attn.k_zero_point", [0.0])
    assert float(sp._k_scale) == pytest.approx(0.3)
    put("model.layers.0.self_attn.k_scale", [0.2])  # dense layer: its parameter
    assert float(dense_k) == pytest.approx(0.2) and loaded == {
        "model.layers.0.self_attn.attn.k_scale"}
    with pytest.raises(ValueError, match="must be positive and finite"):
        put("model.layers.1.self_attn.v_scale", [0.0])


# ------------------------------------------------------------ end to end (GPU)


def _vary_rows(path, dst, max_factor=8.0, seed=3):
    """Copy of a checkpoint whose targeted linears' rows are scaled by
    log-uniform factors in [1/max_factor, max_factor]."""
    from safetensors.torch import save_file

    shutil.copytree(path, dst, ignore=shutil.ignore_patterns("*.safetensors*"))
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, w in sorted(read_checkpoint(path).items()):
        if _TARGET_RE.match(n) or _INDEXER_RE.match(n):
            f = torch.exp((torch.rand(w.shape[0], 1, generator=g) * 2 - 1)
                          * math.log(max_factor))
            w = (w.float() * f).to(w.dtype)
        out[n] = w.contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def _corrupt_expert_scales(path):
    """Reverse the rows of every routed expert's weight_scale (w1, w3, w2):
    each expert row then gets another row's scale."""
    from safetensors.torch import save_file

    t = read_checkpoint(path)
    for n in t:
        if re.search(r"\.experts\.\d+\.w[123]\.weight_scale$", n):
            t[n] = t[n].flip(0).contiguous()
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


_SCHEME_PROBE = '''
def probe(model):
    out = {}
    for n, m in model.named_modules():
        if n.endswith((".qkv_proj", ".o_proj", ".gate_up_proj", ".down_proj",
                       ".index_q_proj", ".index_k_proj", "block_sparse_moe.gate")):
            s = getattr(m, "scheme", None)
            out[n] = type(s if s is not None else m.quant_method).__name__
        elif n.endswith(".experts"):
            out[n] = type(m.base_quant_method).__name__
        elif n == "lm_head":
            out[n] = type(m.quant_method).__name__
    return out
'''


def _prompt_lp_diff(a, b):
    d = [abs(x - y) for oa, ob in zip(a, b)
         for x, y in zip(oa["prompt_logprobs"][1:], ob["prompt_logprobs"][1:])]
    return sum(d) / len(d)


@pytest.mark.parametrize("backend", [
    pytest.param("native", marks=pytest.mark.skipif(not ON_GPU, reason=FP8_ON_CPU_REASON)),
    pytest.param("cpu_standin", marks=pytest.mark.skipif(
        ON_GPU, reason="the GPU runs the native FP8 kernels instead")),
])
def test_fp8_dynamic_checkpoint_serves_close_to_bf16(tmp_path, backend):
    """FP8-dynamic checkpoints (default ignore list; indexer quantized with
    transformers-style ignore names) vs. the bf16 source on the same engine
    settings; a checkpoint with misaligned expert scale rows must fail the same
    check. ``native``: vLLM's FP8 kernels (GPU). ``cpu_standin``: real FP8
    linears and real FP8 checkpoint loading, experts dequantized after loading
    (CPU_FP8_STANDIN)."""
    base = build_checkpoint(str(tmp_path / "base"), initializer_range=0.1)
    src_path = _vary_rows(base, str(tmp_path / "src"))
    variants = {
        "fp8": convert_to_fp8_dynamic(src_path, str(tmp_path / "fp8")),
        # indexer quantized too; transformers-style explicit ignore names
        "fp8_idx": convert_to_fp8_dynamic(src_path, str(tmp_path / "fp8_idx"),
                                          quantize_indexer=True,
                                          ignore_style="transformers"),
        "corrupt": _corrupt_expert_scales(
            convert_to_fp8_dynamic(src_path, str(tmp_path / "corrupt"))),
    }
    prompts = _prompts()
    kw = dict(dtype="bfloat16", block_size=32, max_model_len=256, max_num_seqs=8,
              enable_prefix_caching=False)

    def run(name, path, **extra):
        if backend == "cpu_standin":
            extra["setup"] = CPU_FP8_STANDIN
        res = run_vllm(str(tmp_path / f"run_{name}"), path, prompts, 4, prompt_logprobs=0,
                       llm_kwargs=kw, **extra)
        assert "error" not in res, res.get("traceback", res)
        return res

    ref = run("bf16", src_path)["rounds"][0]
    diffs = {}
    for name, path in variants.items():
        res = run(name, path, probe=_SCHEME_PROBE)
        outs, schemes = res["rounds"][0], res["probe"]
        diffs[name] = _prompt_lp_diff(outs, ref)
        first_equal = sum(o["tokens"][0] == r["tokens"][0] for o, r in zip(outs, ref))
        print(f"{name}: mean |prompt logprob diff| {diffs[name]:.4f}, "
              f"first tokens equal {first_equal}/{len(prompts)}")
        assert schemes["model.layers.0.self_attn.qkv_proj"] == "CompressedTensorsW8A8Fp8"
        assert schemes["model.layers.2.mlp.down_proj"] == "CompressedTensorsW8A8Fp8"
        assert schemes["model.layers.1.block_sparse_moe.shared_experts.gate_up_proj"] \
            == "CompressedTensorsW8A8Fp8"
        assert schemes["model.layers.1.block_sparse_moe.experts"] \
            == "CompressedTensorsW8A8Fp8MoEMethod"
        assert schemes["model.layers.3.block_sparse_moe.gate"] == "UnquantizedLinearMethod"
        assert "Unquantized" in schemes["lm_head"]
        want_idx = ("CompressedTensorsW8A8Fp8" if name == "fp8_idx"
                    else "UnquantizedLinearMethod")
        assert schemes["model.layers.1.self_attn.index_q_proj"] == want_idx
        if name != "corrupt":
            assert diffs[name] <= GOOD_TOL, (name, diffs[name])
            assert first_equal >= MIN_FIRST_EQUAL, (name, first_equal)
    assert diffs["corrupt"] > max(GOOD_TOL, 2 * diffs["fp8"]), diffs
