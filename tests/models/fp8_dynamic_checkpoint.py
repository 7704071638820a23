# SPDX-License-Identifier: Apache-2.0
"""Turn a tiny MiniMax-M3 checkpoint (as written by
``minimax_m3_utils.build_checkpoint``) into a compressed-tensors FP8-dynamic
checkpoint, the format of the community "MiniMax-M3-FP8-dynamic" release:

* every targeted linear weight (attention q/k/v/o, dense MLP gate/up/down,
  routed experts w1/w3/w2, shared-expert gate/up/down; optionally the indexer
  projections) is stored as float8_e4m3fn with a per-output-channel float32
  ``<name>.weight_scale`` of shape [out, 1] (amax over the row / 448), under
  the released tensor names;
* activations are quantized dynamically per token at run time (no input
  scales in the checkpoint);
* lm_head, the MoE router gates, embeddings, norms, the routing bias and the
  vision parts stay in the source dtype and are listed in ``ignore``;
* ``config.json`` gets a top-level ``quantization_config`` (where llm-compressor
  writes it for this VL wrapper; vLLM also looks in ``text_config``).

Optionally FP8 KV-cache scales (``self_attn.k_scale`` / ``self_attn.v_scale``,
compressed-tensors' names, with a ``kv_cache_scheme``) are added per layer.

``ignore`` styles (all three occur in compressed-tensors checkpoints):
  "regex"        patterns, as given to llm-compressor's recipe / model_free_ptq
  "released"     explicit module names in the released (safetensors) naming
  "transformers" explicit module names of transformers' in-memory model (what
                 compressed-tensors' ``QuantizationConfig.from_pretrained``
                 writes after an in-memory llm-compressor run)
"""

import json
import os
import re

import torch
from minimax_m3_utils import load_weights_copy_rest

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448

# released tensor names of the targeted linears (text model only)
_TARGET_RE = re.compile(
    r"^language_model\.model\.layers\.\d+\.("
    r"self_attn\.[qkvo]_proj"
    r"|mlp\.(gate|up|down)_proj"
    r"|block_sparse_moe\.(gate|up|down)_proj"  # a dense MLP as transformers 5.17 saves it
    r"|block_sparse_moe\.experts\.\d+\.w[123]"
    r"|block_sparse_moe\.shared_experts\.(gate|up|down)_proj"
    r")\.weight$"
)
_INDEXER_RE = re.compile(
    r"^language_model\.model\.layers\.\d+\.self_attn\.index_[qk]_proj\.weight$"
)
_ROUTER_RE = re.compile(r"^language_model\.model\.layers\.(\d+)\.block_sparse_moe\.gate\.weight$")

FP8_DYNAMIC_SCHEME = {
    "targets": ["Linear"],
    "weights": {
        "num_bits": 8,
        "type": "float",
        "strategy": "channel",
        "symmetric": True,
        "dynamic": False,
        "group_size": None,
        "block_structure": None,
        "actorder": None,
        "observer": "minmax",
        "observer_kwargs": {},
    },
    "input_activations": {
        "num_bits": 8,
        "type": "float",
        "strategy": "token",
        "symmetric": True,
        "dynamic": True,
        "group_size": None,
        "block_structure": None,
        "actorder": None,
        "observer": None,
        "observer_kwargs": {},
    },
    "output_activations": None,
    "format": None,
}

KV_CACHE_SCHEME = {
    "num_bits": 8,
    "type": "float",
    "strategy": "tensor",
    "symmetric": True,
    "dynamic": False,
    "group_size": None,
    "block_structure": None,
    "actorder": None,
    "observer": "minmax",
    "observer_kwargs": {},
}


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (float8_e4m3fn [out, in], float32 scale [out, 1]),
    w ~= q.float() * scale, scale = row amax / 448."""
    w = w.float()
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = (amax / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _module(name: str) -> str:
    return name[: -len(".weight")]


def _ignore_list(src_names, quantized_modules, style: str, quantize_indexer: bool) -> list:
    if style == "regex":
        out = ["re:.*lm_head$", r"re:.*block_sparse_moe\.gate$",
               r"re:.*vision_tower\..*", r"re:.*multi_modal_projector\..*",
               r"re:.*patch_merge_mlp\..*"]
        if not quantize_indexer:
            out.append(r"re:.*self_attn\.index_[qk]_proj$")
        return out
    # explicit names of the text model's unquantized linears (vision parts as
    # patterns: their module names differ between the two namings anyway)
    linear_modules = sorted(
        _module(n) for n in src_names
        if n.endswith(".weight") and n.startswith("language_model.")
        and (_ROUTER_RE.match(n) or _INDEXER_RE.match(n) or n == "language_model.lm_head.weight")
    )
    names = [m for m in linear_modules if m not in quantized_modules]
    if style == "transformers":
        def to_hf(m: str) -> str:
            if m == "language_model.lm_head":
                return "lm_head"
            m = "model.language_model." + m[len("language_model.model."):]
            m = re.sub(r"\.self_attn\.index_([qk])_proj$", r".self_attn.indexer.\1_proj", m)
            return m.replace(".block_sparse_moe.gate", ".mlp.gate")
        names = [to_hf(m) for m in names]
    elif style != "released":
        raise ValueError(f"unknown ignore style {style!r}")
    return names + [r"re:.*vision_tower\..*", r"re:.*multi_modal_projector\..*",
                    r"re:.*patch_merge_mlp\..*"]


def convert_to_fp8_dynamic(
    src: str,
    dst: str,
    *,
    quantize_indexer: bool = False,
    ignore_style: str = "regex",
    kv_scales: dict | None = None,
    config_location: str = "top",
) -> str:
    """Write the FP8-dynamic form of checkpoint ``src`` to ``dst``.

    kv_scales: {layer index: (k_scale, v_scale)} adds compressed-tensors
    KV-cache scales for those layers (and a ``kv_cache_scheme``).
    config_location: "top" (config.json top level) or "text" (text_config)."""
    from safetensors.torch import save_file

    tensors = load_weights_copy_rest(src, dst)

    out: dict[str, torch.Tensor] = {}
    quantized: set[str] = set()
    for name, w in tensors.items():
        if _TARGET_RE.match(name) or (quantize_indexer and _INDEXER_RE.match(name)):
            q, s = quantize_per_channel(w)
            out[name] = q.contiguous()
            out[_module(name) + ".weight_scale"] = s.contiguous()
            quantized.add(_module(name))
        else:
            out[name] = w.contiguous()
    if not quantized:
        raise ValueError(f"no targeted linear weights found in {src}")
    for layer, (k, v) in (kv_scales or {}).items():
        base = f"language_model.model.layers.{layer}.self_attn."
        out[base + "k_scale"] = torch.tensor([float(k)], dtype=torch.float32)
        out[base + "v_scale"] = torch.tensor([float(v)], dtype=torch.float32)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})

    qcfg = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": json.loads(json.dumps(FP8_DYNAMIC_SCHEME))},
        "ignore": _ignore_list(tensors, quantized, ignore_style, quantize_indexer),
        "kv_cache_scheme": dict(KV_CACHE_SCHEME) if kv_scales else None,
        "sparsity_config": {},
        "transform_config": {},
        "global_compression_ratio": None,
    }
    cfg = json.load(open(os.path.join(src, "config.json")))
    if config_location == "top":
        cfg["quantization_config"] = qcfg
    elif config_location == "text":
        cfg["text_config"]["quantization_config"] = qcfg
    else:
        raise ValueError(f"unknown config_location {config_location!r}")
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dst


def add_kv_cache_scales(src: str, dst: str, kv_scales: dict) -> str:
    """Copy of ``src`` (weights unchanged) with compressed-tensors FP8 KV-cache
    scales only: ``self_attn.{k,v}_scale`` per listed layer and a
    ``quantization_config`` holding just a ``kv_cache_scheme`` (what an
    llm-compressor KV-cache-only recipe writes)."""
    from safetensors.torch import save_file

    tensors = load_weights_copy_rest(src, dst)
    for layer, (k, v) in kv_scales.items():
        base = f"language_model.model.layers.{layer}.self_attn."
        tensors[base + "k_scale"] = torch.tensor([float(k)], dtype=torch.float32)
        tensors[base + "v_scale"] = torch.tensor([float(v)], dtype=torch.float32)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {},
        "ignore": [],
        "kv_cache_scheme": dict(KV_CACHE_SCHEME),
    }
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dst
