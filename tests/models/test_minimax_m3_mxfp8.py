# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 from MXFP8 checkpoints in the format of the official
MiniMax-M3-MXFP8 release (``quant_method: mxfp8``, E4M3 weights, uint8 E8M0
``weight_scale_inv`` per 32 inputs), served through vLLM's ModelOpt MXFP8
config (``modelopt_mxfp8``).

vLLM v0.23.0 runs MXFP8 with Marlin on NVIDIA GPUs (sm_80+; W8A16: weights
MXFP8, activations bf16) and has no MXFP8 linear or MoE kernel on its CPU
platform (MXFP8_ON_CPU_REASON). So:

CPU, without the engine: the generator's format and its dequantizing
reference; vLLM's config resolution (``mxfp8`` -> ``modelopt_mxfp8``, on
vLLM's own ModelConfig) and the ignore list on our module prefixes (no list,
released explicit names, transformers' names); config errors; the w13
gate/up interleave of E4M3 rows with their E8M0 scale rows through FusedMoE's
w13 loader at TP 1/2/4.

CPU, engine: the clear refusal on CPU naming the checkpoint; and
``cpu_standin``: the real checkpoint loading (ModelOpt MXFP8 parameters, our
rename and interleave), vLLM's MXFP8 emulation linear kernel (dequantize to
bf16, then GEMM) for every linear, the experts dequantized after loading into
vLLM's unquantized CPU experts (CPU_MXFP8_STANDIN).

Parity (``native`` on the GPU: Marlin linears and Marlin MoE; ``cpu_standin``
on CPU): the engine on the MXFP8 checkpoint (bf16 activations, vLLM's only
MXFP8 activation dtype) vs transformers (the oracle) on the dequantized
weights, teacher-forced prompt logprobs of 8 prompts (5-200 tokens, the
sparse block selection active). Same criterion as the bf16 engine test:
mean |diff| to the fp32 oracle <= 1.5 x transformers' own bf16 error + 0.02,
median |diff| to transformers bf16 < 0.15. With an FP8 KV cache (the seed's
second MXFP8 configuration; needs a GPU or AVX-512/AMX): the MXFP8 engine
must be as close to the fp32 oracle as the same engine on the dequantized
bf16 checkpoint with the same FP8 KV cache (1.5 x + 0.02). A checkpoint whose
expert scale rows are reversed must fail the auto-KV criterion.
"""

import json
import os

import pytest
import torch

from minimax_m3_utils import (build_checkpoint, fp8_kv_engines_run_here, hf_token_logprobs,
                              read_checkpoint, run_vllm)
from mxfp8_checkpoint import (MX_BLOCK, ROUTER_RE, TARGET_RE, convert_to_mxfp8,
                              dequantize_checkpoint, dequantize_mxfp8, quantize_mxfp8,
                              vary_rows)

pytest.importorskip("transformers.models.minimax_m3_vl")

ON_GPU = torch.cuda.is_available()
MXFP8_ON_CPU_REASON = (
    "vLLM v0.23.0 has no MXFP8 kernel on its CPU platform: the MXFP8 linear kernels "
    "are listed for CUDA (FlashInfer CUTLASS, Marlin, emulation), ROCm and XPU only, "
    "and the MXFP8 MoE backends are FlashInfer TRT-LLM, Marlin and XPU. Run on a GPU."
)
# the shapes Marlin takes (N multiple of 64, K of 128) with production head dims
MXFP8_TEXT = dict(hidden_size=256, head_dim=128, num_attention_heads=4, num_key_value_heads=2,
                  rotary_dim=64, index_head_dim=128, intermediate_size=128,
                  shared_intermediate_size=128, dense_intermediate_size=256,
                  initializer_range=0.1)

CPU_MXFP8_STANDIN = """
from vllm.model_executor.kernels.linear.mxfp8.emulation import EmulationMxfp8LinearKernel
from vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel import Mxfp8LinearLayerConfig
from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend
from vllm.model_executor.layers.quantization import modelopt
from vllm.model_executor.layers.quantization.utils.mxfp8_utils import dequant_mxfp8_to_bf16
from vllm.model_executor.utils import replace_parameter

modelopt.init_mxfp8_linear_kernel = lambda: EmulationMxfp8LinearKernel(Mxfp8LinearLayerConfig())
modelopt.select_mxfp8_moe_backend = lambda config: (Fp8MoeBackend.MARLIN, None)

def dequantized_experts(self, layer):
    for w in ("w13", "w2"):
        q, s = getattr(layer, w + "_weight"), getattr(layer, w + "_weight_scale")
        replace_parameter(layer, w + "_weight", dequant_mxfp8_to_bf16(q, s).to(layer.orig_dtype))
        delattr(layer, w + "_weight_scale")
    method = UnquantizedFusedMoEMethod(layer.moe_config)
    layer._replace_quant_method(method)
    method.process_weights_after_loading(layer)

modelopt.ModelOptMxFp8FusedMoE.process_weights_after_loading = dequantized_experts
"""

PROMPT_LENS = [5, 17, 32, 48, 64, 100, 150, 200]
BF16_REL, BF16_ABS, BF16_MEDIAN = 1.5, 0.02, 0.15


def _prompts():
    g = torch.Generator().manual_seed(4321)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("m3mxfp8")
    base = build_checkpoint(str(d / "base"), **MXFP8_TEXT)
    return {"dir": d, "path": vary_rows(base, str(d / "src"))}


# ------------------------------------------------------------ generator format


def test_quantize_mxfp8_blocks():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4 * MX_BLOCK, generator=g) * torch.exp(torch.randn(6, 1, generator=g) * 3)
    w[1, :MX_BLOCK] = 0.0
    q, s = quantize_mxfp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8 and s.shape == (6, 4)
    blocks = q.float().reshape(6, 4, MX_BLOCK).abs().amax(-1)
    nonzero = w.reshape(6, 4, MX_BLOCK).abs().amax(-1) > 0
    # the exponent is the smallest that fits the block's amax into E4M3 (<= 448)
    assert bool((blocks[nonzero] >= 224).all() and (blocks <= 448).all())
    d = dequantize_mxfp8(q, s)
    scale = torch.exp2(s.float() - 127).repeat_interleave(MX_BLOCK, dim=1)
    assert bool(((d - w).abs() <= w.abs() / 16 + scale * 2.0**-9).all())
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp8(torch.zeros(2, 48))


@pytest.mark.parametrize("ignored", [None, "released"])
def test_converter_output_format(src, tmp_path, ignored):
    out = convert_to_mxfp8(src["path"], str(tmp_path / "mx"), ignored_layers=ignored)
    before, after = read_checkpoint(src["path"]), read_checkpoint(out)
    targeted = [n for n in before if TARGET_RE.match(n)]
    # q/k/v/o (4 layers), indexer q/k (3 sparse layers), dense MLP (2 layers),
    # experts (2 layers x 4 x w1/w3/w2), shared experts (2 layers)
    assert len(targeted) == 4 * 4 + 3 * 2 + 2 * 3 + 2 * 4 * 3 + 2 * 3
    for n in targeted:
        w, q = before[n], after[n]
        s = after[n[: -len("weight")] + "weight_scale_inv"]
        assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape, n
        assert s.dtype == torch.uint8 and s.shape == (w.shape[0], w.shape[1] // 32), n
        assert torch.equal(quantize_mxfp8(w)[1], s), n
    for n in before:
        if n in targeted:
            continue
        if ROUTER_RE.match(n):  # routers: float32, as released
            assert after[n].dtype == torch.float32 and torch.equal(after[n], before[n].float())
        else:  # lm_head, embeddings, norms, routing bias, vision
            assert after[n].dtype == before[n].dtype and torch.equal(after[n], before[n]), n
    assert set(after) == set(before) | {n[: -len("weight")] + "weight_scale_inv"
                                        for n in targeted}
    cfg = json.load(open(os.path.join(out, "config.json")))
    q = cfg["quantization_config"]
    assert {k: q[k] for k in ("quant_method", "activation_scheme", "weight_block_size")} == {
        "quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32]}
    assert ("ignored_layers" in q) == (ignored == "released")

    deq = read_checkpoint(dequantize_checkpoint(out, str(tmp_path / "deq")))
    assert set(deq) == set(before)
    for n in targeted:
        s = after[n[: -len("weight")] + "weight_scale_inv"]
        want = after[n].float() * torch.exp2(s.float() - 127).repeat_interleave(32, dim=1)
        assert deq[n].dtype == torch.float32 and torch.equal(deq[n], want), n
    assert "quantization_config" not in json.load(open(tmp_path / "deq" / "config.json"))


# ------------------------------------------------------------ config resolution


def _model_config(path):
    from vllm.config import ModelConfig

    return ModelConfig(model=path, tokenizer=path, skip_tokenizer_init=True, dtype="bfloat16")


def _mxfp8_quant_config(model_config):
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.models.minimax_m3.common.model import MiniMaxM3SparseForCausalLM

    cls = get_quantization_config(model_config.quantization)
    qc = cls.from_config(model_config.hf_config.quantization_config)
    qc.apply_vllm_mapper(MiniMaxM3SparseForCausalLM.hf_to_vllm_mapper)
    qc.packed_modules_mapping = MiniMaxM3SparseForCausalLM.packed_modules_mapping
    return qc


QUANTIZED = ["model.layers.0.self_attn.qkv_proj", "model.layers.1.self_attn.o_proj",
             "model.layers.1.self_attn.index_q_proj", "model.layers.3.self_attn.index_k_proj",
             "model.layers.0.mlp.gate_up_proj", "model.layers.2.mlp.down_proj",
             "model.layers.1.block_sparse_moe.shared_experts.gate_up_proj",
             "model.layers.3.block_sparse_moe.shared_experts.down_proj",
             "model.layers.1.block_sparse_moe.experts"]
UNQUANTIZED = ["lm_head", "model.layers.1.block_sparse_moe.gate",
               "vision_tower.encoder.layers.0.mlp.fc1", "multi_modal_projector.linear_1"]


@pytest.mark.parametrize("ignored", [None, "released", "transformers"])
def test_mxfp8_resolves_to_modelopt_mxfp8_and_ignore_list(src, tmp_path, ignored):
    out = convert_to_mxfp8(src["path"], str(tmp_path / "mx"),
                           ignored_layers="released" if ignored else None)
    if ignored == "transformers":  # transformers' module names for the same modules
        p = os.path.join(out, "config.json")
        cfg = json.load(open(p))
        cfg["quantization_config"]["ignored_layers"] = [
            "lm_head", "model.language_model.layers.1.mlp.gate",
            "model.language_model.layers.3.mlp.gate", "model.vision_tower"]
        json.dump(cfg, open(p, "w"))
    mc = _model_config(out)
    assert mc.quantization == "modelopt_mxfp8"
    qcfg = mc.hf_config.quantization_config
    assert qcfg["quant_method"] == "modelopt" and qcfg["quant_algo"] == "MXFP8"
    assert qcfg["minimax_m3_mxfp8"]["quant_method"] == "mxfp8"  # the declaration, kept
    qc = _mxfp8_quant_config(mc)
    assert qc.get_name() == "modelopt_mxfp8"
    for name in QUANTIZED:
        assert not qc.is_layer_excluded(name), name
    for name in UNQUANTIZED:
        assert qc.is_layer_excluded(name), name


@pytest.mark.parametrize("over, match", [
    ({"weight_block_size": [128, 128]}, r"weight_block_size \[128, 128\] is not supported"),
    ({"activation_scheme": "static"}, "activation_scheme 'static' is not supported"),
    ({"scale_fmt": "fp32"}, "scale_fmt 'fp32' is not supported"),
    ({"ignored_layers": "lm_head,gate"}, None),  # a single string is one name
    ({"ignored_layers": [1, 2]}, "ignored_layers must be a list of module names"),
])
def test_mxfp8_config_errors(over, match):
    from vllm.transformers_utils.configs.minimax_m3 import normalize_quantization_config

    qc = {"quant_method": "mxfp8", "activation_scheme": "dynamic",
          "weight_block_size": [1, 32], **over}
    if match is None:
        assert normalize_quantization_config(qc)["ignore"][0] == "lm_head,gate"
        return
    with pytest.raises(ValueError, match=match):
        normalize_quantization_config(qc)


def test_other_quant_configs_pass_through():
    from vllm.transformers_utils.configs.minimax_m3 import normalize_quantization_config

    ct = {"quant_method": "compressed-tensors", "config_groups": {}}
    assert normalize_quantization_config(ct) is ct
    assert normalize_quantization_config(None) is None


# ------------------------------------------------------------ w13 interleave


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_w13_interleave_moves_mx_rows_and_scale_rows_together(tp_size):
    """E4M3 rows and their E8M0 scale rows ([rows, K / 32]) land interleaved
    together through FusedMoE's own w13 loader (``_load_w13``), as ModelOpt's
    MXFP8 MoE parameters hold them."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.fused_moe import FusedMoE
    from vllm.models.minimax_m3.common.layers import interleave_gate_up_rows

    fake = SimpleNamespace(
        moe_config=SimpleNamespace(
            is_act_and_mul=True, moe_parallel_config=SimpleNamespace(tp_size=tp_size)),
        _get_hidden_dim=FusedMoE._get_hidden_dim,
        _narrow_expert_data_for_padding=FusedMoE._narrow_expert_data_for_padding,
    )
    inter, hidden = 8, 64
    g = torch.Generator().manual_seed(0)
    rows = torch.exp(torch.randn(2 * inter, 1, generator=g) * 2)
    gate_w = torch.randn(inter, hidden, generator=g) * rows[:inter]
    up_w = torch.randn(inter, hidden, generator=g) * rows[inter:]
    (gate_q, gate_s), (up_q, up_s) = quantize_mxfp8(gate_w), quantize_mxfp8(up_w)
    first_q, second_q = interleave_gate_up_rows(gate_q, up_q, tp_size)
    first_s, second_s = interleave_gate_up_rows(gate_s, up_s, tp_size)
    n = inter // tp_size
    for rank in range(tp_size):
        w13 = torch.zeros(2 * n, hidden, dtype=torch.float8_e4m3fn)
        s13 = torch.zeros(2 * n, hidden // 32, dtype=torch.uint8)
        for dst, a, b in ((w13, first_q, second_q), (s13, first_s, second_s)):
            FusedMoE._load_w13(fake, expert_data=dst, shard_dim=0, shard_id="w1",
                               loaded_weight=a, tp_rank=rank)
            FusedMoE._load_w13(fake, expert_data=dst, shard_dim=0, shard_id="w3",
                               loaded_weight=b, tp_rank=rank)
        want = torch.stack((gate_w[rank * n:(rank + 1) * n],
                            up_w[rank * n:(rank + 1) * n]), dim=1).reshape(2 * n, hidden)
        got = dequantize_mxfp8(w13, s13)
        assert bool(((got - want).abs() <= want.abs() / 16 + 1e-6 * rows.max()).all())
        for i in range(n):
            assert torch.equal(s13[2 * i], gate_s[rank * n + i])
            assert torch.equal(s13[2 * i + 1], up_s[rank * n + i])


# ------------------------------------------------------------ engine


_SCHEME_PROBE = '''
def probe(model):
    out = {}
    for n, m in model.named_modules():
        if n.endswith((".qkv_proj", ".o_proj", ".gate_up_proj", ".down_proj",
                       ".index_q_proj", ".index_k_proj", "block_sparse_moe.gate")):
            out[n] = [type(m.quant_method).__name__, str(m.weight.dtype)]
        elif n.endswith(".experts"):
            out[n] = [type(m.base_quant_method).__name__, str(m.w13_weight.dtype)]
        elif n == "lm_head":
            out[n] = [type(m.quant_method).__name__, str(m.weight.dtype)]
    return out
'''
KW = dict(dtype="bfloat16", block_size=32, max_model_len=256, max_num_seqs=8,
          enable_prefix_caching=False)


@pytest.mark.skipif(ON_GPU, reason="the refusal is for platforms without MXFP8 kernels")
def test_mxfp8_on_cpu_is_refused_clearly(src, tmp_path):
    out = convert_to_mxfp8(src["path"], str(tmp_path / "mx"))
    res = run_vllm(str(tmp_path / "run"), out, [[5, 6, 7]], 1, timeout=300, llm_kwargs=KW)
    err = res.get("error", "") + res.get("traceback", "")
    assert "MiniMaxAI/MiniMax-M3-MXFP8" in err and "cannot be served on CPU" in err, err[-3000:]
    assert "MiniMaxAI/MiniMax-M3" in err and "Marlin" in err, err[-3000:]


@pytest.mark.skipif(ON_GPU, reason="CPU stand-in (the GPU loads through Marlin)")
def test_ignore_list_that_does_not_match_the_file_is_refused(src, tmp_path):
    """An ignore list naming a layer the file holds quantized: the engine
    refuses while loading, naming the tensor (instead of casting E4M3 bytes
    into a bf16 weight)."""
    out = convert_to_mxfp8(src["path"], str(tmp_path / "mx"), ignored_layers="released")
    p = os.path.join(out, "config.json")
    cfg = json.load(open(p))
    cfg["quantization_config"]["ignored_layers"].append(
        "language_model.model.layers.2.mlp.down_proj")
    json.dump(cfg, open(p, "w"))
    res = run_vllm(str(tmp_path / "run"), out, [[5, 6, 7]], 1, timeout=300,
                   llm_kwargs=KW, setup=CPU_MXFP8_STANDIN)
    err = res.get("error", "") + res.get("traceback", "")
    assert "layers.2.mlp.down_proj.weight" in err and "built unquantized" in err, err[-3000:]


def _corrupt_expert_scales(path):
    """Reverse the rows of every routed expert's weight_scale_inv."""
    from safetensors.torch import save_file

    t = read_checkpoint(path)
    for n in t:
        if ".experts." in n and n.endswith(".weight_scale_inv"):
            t[n] = t[n].flip(0).contiguous()
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def _hf(path, dtype):
    from transformers.models.minimax_m3_vl import MiniMaxM3SparseForConditionalGeneration

    return MiniMaxM3SparseForConditionalGeneration.from_pretrained(path, dtype=dtype).eval()


def _prompt_lps(res):
    assert "error" not in res, res.get("traceback", res)
    return torch.tensor([x for o in res["rounds"][0] for x in o["prompt_logprobs"][1:]])


@pytest.mark.parametrize("kv", ["auto", pytest.param("fp8", marks=pytest.mark.skipif(
    not fp8_kv_engines_run_here(),
    reason="vLLM's CPU attention needs AVX-512 or AMX for an FP8 KV cache"))])
@pytest.mark.parametrize("backend", [
    pytest.param("native", marks=pytest.mark.skipif(not ON_GPU, reason=MXFP8_ON_CPU_REASON)),
    pytest.param("cpu_standin", marks=pytest.mark.skipif(
        ON_GPU, reason="the GPU runs vLLM's Marlin MXFP8 kernels instead")),
])
def test_mxfp8_checkpoint_matches_transformers_on_dequantized_weights(src, tmp_path,
                                                                      backend, kv):
    mx = convert_to_mxfp8(src["path"], str(tmp_path / "mx"), ignored_layers="released")
    deq = dequantize_checkpoint(mx, str(tmp_path / "deq"))
    prompts = _prompts()
    extra = dict(setup=CPU_MXFP8_STANDIN) if backend == "cpu_standin" else {}
    kw = dict(KW, kv_cache_dtype=kv)

    def run(name, path, **more):
        return run_vllm(str(tmp_path / f"run_{name}"), path, prompts, 1, prompt_logprobs=0,
                        llm_kwargs=kw, **extra, **more)

    res = run("mx", mx, probe=_SCHEME_PROBE)
    got = _prompt_lps(res)
    schemes = res["probe"]
    for n in ("model.layers.0.self_attn.qkv_proj", "model.layers.1.self_attn.index_q_proj",
              "model.layers.3.self_attn.index_k_proj", "model.layers.2.mlp.down_proj",
              "model.layers.1.block_sparse_moe.shared_experts.gate_up_proj"):
        assert schemes[n][0] == "ModelOptMxFp8LinearMethod", (n, schemes[n])
    assert schemes["model.layers.1.block_sparse_moe.experts"][0] == "ModelOptMxFp8FusedMoE"
    assert schemes["model.layers.3.block_sparse_moe.gate"][0] == "UnquantizedLinearMethod"
    assert schemes["lm_head"][1] == "torch.bfloat16"

    seqs = [p for p in prompts]
    m32, m16 = _hf(deq, torch.float32), _hf(deq, torch.bfloat16)
    ref32 = torch.tensor([x for s in seqs for x in hf_token_logprobs(m32, s)])
    ref16 = torch.tensor([x for s in seqs for x in hf_token_logprobs(m16, s)])
    hf_err = (ref16 - ref32).abs().mean().item()
    err = (got - ref32).abs().mean().item()
    print(f"{backend} kv={kv}: mean |diff| to fp32 oracle {err:.4f} "
          f"(transformers bf16 {hf_err:.4f}), median to bf16 "
          f"{(got - ref16).abs().median().item():.4f}")
    if kv == "auto":
        assert err <= BF16_REL * hf_err + BF16_ABS, (err, hf_err)
        assert (got - ref16).abs().median().item() < BF16_MEDIAN
        bad = _prompt_lps(run("corrupt", _corrupt_expert_scales(
            convert_to_mxfp8(src["path"], str(tmp_path / "corrupt")))))
        bad_err = (bad - ref32).abs().mean().item()
        print(f"reversed expert scale rows: mean |diff| {bad_err:.4f}")
        assert bad_err > max(BF16_REL * hf_err + BF16_ABS, 2 * err), (bad_err, err)
    else:  # same FP8 KV cache on the dequantized bf16 checkpoint: the bar
        ref_engine = (_prompt_lps(run("deq", deq)) - ref32).abs().mean().item()
        print(f"dequantized bf16 checkpoint, same kv: mean |diff| {ref_engine:.4f}")
        assert err <= BF16_REL * ref_engine + BF16_ABS, (err, ref_engine)


def test_fp8_dtype_mismatch_messages():
    """Both directions of a quantized/unquantized mismatch are refused by name."""
    from vllm.models.minimax_m3.common.model import _check_fp8_dtype, _mxfp8_tensor

    fp8_param = torch.zeros(4, 32, dtype=torch.float8_e4m3fn)
    bf16_param = torch.zeros(4, 32, dtype=torch.bfloat16)
    _check_fp8_dtype(fp8_param, "a.weight", torch.zeros(4, 32, dtype=torch.float8_e4m3fn))
    _check_fp8_dtype(bf16_param, "a.weight", torch.zeros(4, 32))
    _check_fp8_dtype(bf16_param, "a.weight_scale", torch.zeros(4, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="'x.o_proj.weight' is torch.bfloat16 but its layer "
                                         "expects torch.float8_e4m3fn"):
        _check_fp8_dtype(fp8_param, "x.o_proj.weight", torch.zeros(4, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="built unquantized"):
        _check_fp8_dtype(bf16_param, "x.o_proj.weight",
                         torch.zeros(4, 32, dtype=torch.float8_e4m3fn))
    s = torch.full((4, 1), 127, dtype=torch.uint8)
    assert _mxfp8_tensor("x.o_proj.weight_scale_inv", s)[0] == "x.o_proj.weight_scale"
    assert _mxfp8_tensor("x.o_proj.weight", s)[0] == "x.o_proj.weight"
    if hasattr(torch, "float8_e8m0fnu"):
        name, t = _mxfp8_tensor("x.weight_scale_inv", s.view(torch.float8_e8m0fnu))
        assert t.dtype == torch.uint8 and torch.equal(t, s)
    with pytest.raises(ValueError, match="stores E8M0 exponents as uint8"):
        _mxfp8_tensor("x.weight_scale_inv", torch.ones(4, 1))


@pytest.mark.parametrize("case", ["mx_marlin", "mx_trtllm", "block_rows", "no_block_size"])
def test_gate_up_layout_check_for_mx_scales(case):
    """The layer-build check that the gate/up row interleave fits the experts'
    tensors: MX scales [E, 2I, H / 32] (blocks [1, 32]) fit with Marlin; a
    backend that reorders rows itself or blocks of several rows do not."""
    from types import SimpleNamespace

    from torch import nn

    from vllm.model_executor.layers.fused_moe import FusedMoeWeightScaleSupported
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend
    from vllm.models.minimax_m3.common.layers import _gate_up_layout_problem

    e, inter, hidden = 2, 64, 128
    block = {"block_rows": [16, 16]}.get(case, [1, 32])
    experts = nn.Module()
    rows = 2 * inter // block[0]
    experts.register_parameter("w13_weight", nn.Parameter(
        torch.zeros(e, 2 * inter, hidden, dtype=torch.float8_e4m3fn), requires_grad=False))
    scale = nn.Parameter(torch.zeros(e, rows, hidden // block[1], dtype=torch.uint8),
                         requires_grad=False)
    scale.quant_method = FusedMoeWeightScaleSupported.BLOCK.value
    experts.register_parameter("w13_weight_scale", scale)
    backend = Fp8MoeBackend.FLASHINFER_TRTLLM if case == "mx_trtllm" else Fp8MoeBackend.MARLIN
    experts.quant_method = SimpleNamespace(
        mxfp8_backend=backend, weight_block_size=None if case == "no_block_size" else block)
    experts.moe_config = SimpleNamespace(intermediate_size_per_partition=inter)
    experts.tp_size = 1
    why = _gate_up_layout_problem(experts, inter)
    if case in ("mx_marlin", "no_block_size"):
        assert why is None
    elif case == "mx_trtllm":
        assert "lays out gate and up rows itself" in why
    else:
        assert "holds block scales" in why
