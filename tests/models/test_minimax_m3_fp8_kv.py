# SPDX-License-Identifier: Apache-2.0
"""FP8 KV cache of the MiniMax-M3 sparse layers with per (token, KV head) scales.

``--kv-cache-dtype fp8 --hf-overrides '{"msa_kv_cache_scales":
"per_token_head"}'``: each sparse layer computes a scale per K/V row when it
writes the cache (stored in the row's padding) and attention dequantises per
element. Engines on the tiny checkpoint in bf16 (vLLM's CPU attention takes an
FP8 cache only with bf16 activations and 32-token pages), dense layer 0 kept in
bf16 (``kv_cache_dtype_skip_layers``) so only the sparse layers differ:
  * the cache holds one scale per written row and the row's largest value
    maps to 448 (the e4m3 maximum);
  * teacher-forced logprobs of a 150-token prompt (block selection active)
    stay as close to the bf16-cache engine as the scalar-scale FP8 engine's
    do (within 2x + 0.05; measured 0.18 vs 0.11 mean |diff| on this random
    model: same e4m3 precision, other roundings) -- a misapplied scale
    gives errors of order 1.
A K/V cache dtype that is not FP8 is refused with a clear error.
``--kv-cache-dtype-skip-layers`` applies to the sparse layers as to vLLM's
Attention: a listed sparse layer keeps a model-dtype cache (and no scales).
"""

import pytest
import torch

from minimax_m3_utils import build_checkpoint, needs_fp8_kv_engine, run_vllm

pytest.importorskip("transformers.models.minimax_m3_vl")

PROMPT_LEN = 150
PTH = {"msa_kv_cache_scales": "per_token_head"}
PROBE = '''
def probe(model):
    import torch
    from vllm.models.minimax_m3.common.attention import MiniMaxM3SparseAttention
    out = []
    for m in model.modules():
        if isinstance(m, MiniMaxM3SparseAttention) and m.impl.kv_scale_mode.name == "PER_TOKEN_HEAD":
            d = m.head_size
            s = m.kv_cache[..., d:d + 4].view(torch.float32).squeeze(-1)
            written = (s > 0) & torch.isfinite(s)
            amax = m.kv_cache[..., :d].float().abs().amax(-1)[written]
            out.append({"row": int(m.kv_cache.shape[-1]), "head": d,
                        "rows": int(written.sum()), "amax": sorted({float(a) for a in amax})})
    return out
'''


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("m3kv") / "ckpt"))


def _run(tmp, ckpt, **llm):
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, 500, (PROMPT_LEN,), generator=g).tolist()
    kw = dict(dtype="bfloat16", block_size=32, max_model_len=256,
              enable_prefix_caching=False, kv_cache_dtype_skip_layers=["0"], **llm)
    return run_vllm(str(tmp), ckpt, [prompt], 4, llm_kwargs=kw, prompt_logprobs=0,
                    probe=PROBE)


def _mean_diff(a, b):
    a, b = a["rounds"][0][0]["prompt_logprobs"][1:], b["rounds"][0][0]["prompt_logprobs"][1:]
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


@needs_fp8_kv_engine
def test_per_token_head_fp8_kv(ckpt, tmp_path):
    runs = {name: _run(tmp_path / name, ckpt, **llm) for name, llm in (
        ("bf16", {}), ("scalar", dict(kv_cache_dtype="fp8")),
        ("pth", dict(kv_cache_dtype="fp8", hf_overrides=PTH)))}
    for name, r in runs.items():
        assert "error" not in r, (name, r.get("traceback", r))
    layers = runs["pth"]["probe"]
    assert len(layers) == 3 and not runs["scalar"]["probe"]
    for layer in layers:
        assert layer["row"] == layer["head"] + 16, layer
        assert layer["rows"] == (PROMPT_LEN + 3) * 2 * 2, layer  # tokens x K/V x KV heads
        assert layer["amax"] == [448.0], layer
    scalar = _mean_diff(runs["bf16"], runs["scalar"])
    pth = _mean_diff(runs["bf16"], runs["pth"])
    assert pth != scalar  # the scales are applied
    assert pth < 2 * scalar + 0.05, f"per-token-head {pth:.4f} vs scalar {scalar:.4f}"


def test_per_token_head_scales_need_an_fp8_cache(ckpt, tmp_path):
    res = _run(tmp_path / "bad", ckpt, hf_overrides=PTH)
    assert "per_token_head" in res.get("error", ""), res
    assert "--kv-cache-dtype fp8" in res["error"], res


LAYER_PROBE = '''
def probe(model):
    from vllm.models.minimax_m3.common.attention import MiniMaxM3SparseAttention
    return {m.layer_name: [str(m.kv_cache.dtype), m.impl.kv_scale_mode.name,
                           int(m.kv_cache.shape[-1])]
            for m in model.modules() if isinstance(m, MiniMaxM3SparseAttention)}
'''


@needs_fp8_kv_engine
def test_skip_layers_apply_to_sparse_layers(ckpt, tmp_path):
    """Layers 1-3 are sparse; skipping "2" leaves its cache bf16 without the
    scale padding, while layers 1 and 3 hold FP8 rows with per-row scales."""
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, 500, (PROMPT_LEN,), generator=g).tolist()
    kw = dict(dtype="bfloat16", block_size=32, max_model_len=256, enable_prefix_caching=False,
              kv_cache_dtype="fp8", kv_cache_dtype_skip_layers=["0", "2"], hf_overrides=PTH)
    res = run_vllm(str(tmp_path / "skip"), ckpt, [prompt], 4, llm_kwargs=kw, probe=LAYER_PROBE)
    assert "error" not in res, res.get("traceback", res)
    layers = {name.split(".layers.")[1].split(".")[0]: v for name, v in res["probe"].items()}
    head = layers["2"][2]
    assert layers["2"] == ["torch.bfloat16", "NONE", head], layers
    for i in ("1", "3"):
        assert layers[i] == ["torch.float8_e4m3fn", "PER_TOKEN_HEAD", head + 16], layers
    assert len(res["rounds"][0][0]["tokens"]) == 4
