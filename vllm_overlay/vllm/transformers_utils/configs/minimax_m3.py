# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""MiniMax-M3 configuration for vLLM.

Two on-disk forms exist and both load here:

* the released checkpoint form: ``model_type: minimax_m3_vl`` whose
  ``text_config`` carries legacy keys (``sparse_attention_config``,
  ``moe_layer_freq``, ``hidden_act: swigluoai``, ``rope_theta``,
  ``partial_rotary_factor``, ...);
* the form written by transformers' ``save_pretrained`` (``index_*`` keys,
  ``layer_types``, ``mlp_layer_types``, ``rope_parameters``).

transformers (>= 5.17) ships ``MiniMaxM3VLConfig``; we subclass it, keep the
legacy keys it does not model (init blocks, score type, index value path,
activation name), and validate what vLLM's implementation relies on.

Quantization: the released MXFP8 checkpoint declares ``quantization_config =
{"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size":
[1, 32]}`` (plus an optional ignore list). In vLLM 0.23 the name ``mxfp8``
means online quantization of a full-precision checkpoint, so the top-level
config rewrites that declaration into vLLM's ModelOpt MXFP8 form
(``modelopt_mxfp8``: E4M3 weights, uint8 E8M0 scales per 32 inputs) whenever
it is set (``normalize_quantization_config``).
"""

from __future__ import annotations

import re
from typing import Any

try:
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import (
        MiniMaxM3VLConfig as _HFMiniMaxM3VLConfig,
    )
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import (
        MiniMaxM3VLTextConfig as _HFMiniMaxM3VLTextConfig,
    )
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import (
        MiniMaxM3VLVisionConfig as _HFMiniMaxM3VLVisionConfig,
    )

    _HF_IMPORT_ERROR: Exception | None = None
except ImportError as e:  # pragma: no cover - depends on the installed version
    _HF_IMPORT_ERROR = e

SPARSE_LAYER = "minimax_m3_sparse"
DENSE_LAYER = "full_attention"
KNOWN_ACTIVATIONS = ("swigluoai", "silu")  # "silu" is what transformers writes
# vLLM's KV cache pages are multiples of 16 tokens and must divide the block.
SPARSE_BLOCK_MULTIPLE = 16

__all__ = [
    "MiniMaxM3VLConfig",
    "MiniMaxM3TextConfig",
    "validate_minimax_m3_text_config",
]


def _bad(msg: str) -> ValueError:
    return ValueError(f"Invalid MiniMax-M3 config: {msg}")


def validate_minimax_m3_text_config(cfg: Any) -> None:
    """Raise ValueError with an actionable message if ``cfg`` is unusable."""
    n_layers = cfg.num_hidden_layers
    layer_types = list(cfg.layer_types or [])
    mlp_types = list(cfg.mlp_layer_types or [])
    if len(layer_types) != n_layers:
        raise _bad(
            f"layer_types (or sparse_attention_config.sparse_attention_freq) has "
            f"{len(layer_types)} entries but num_hidden_layers is {n_layers}; "
            "give one entry per layer."
        )
    bad = sorted(set(layer_types) - {SPARSE_LAYER, DENSE_LAYER})
    if bad:
        raise _bad(
            f"unknown layer_types {bad}; use '{DENSE_LAYER}' or '{SPARSE_LAYER}'."
        )
    if len(mlp_types) != n_layers:
        raise _bad(
            f"mlp_layer_types (or moe_layer_freq) has {len(mlp_types)} entries "
            f"but num_hidden_layers is {n_layers}; give one entry per layer."
        )
    bad = sorted(set(mlp_types) - {"dense", "sparse"})
    if bad:
        raise _bad(f"unknown mlp_layer_types {bad}; use 'dense' or 'sparse'.")

    act = getattr(cfg, "mlp_activation", "swigluoai")
    if act not in KNOWN_ACTIVATIONS:
        raise _bad(
            f"hidden_act {act!r} is not supported; MiniMax-M3 uses 'swigluoai' "
            f"(known: {list(KNOWN_ACTIVATIONS)})."
        )

    head_dim = cfg.head_dim
    rope = cfg.rope_parameters or {}
    prf = float(rope.get("partial_rotary_factor", 1.0))
    rotary = int(head_dim * prf)
    if not 0.0 < prf <= 1.0 or rotary > head_dim or rotary % 2:
        raise _bad(
            f"partial_rotary_factor {prf} gives {rotary} rotary channels for "
            f"head_dim {head_dim}; it must be an even number <= head_dim."
        )
    declared = getattr(cfg, "rotary_dim", None)
    if declared is not None and "partial_rotary_factor" in rope and declared != rotary:
        raise _bad(
            f"rotary_dim {declared} disagrees with head_dim * "
            f"partial_rotary_factor = {rotary}; fix one of them."
        )

    if SPARSE_LAYER not in layer_types:
        return
    if cfg.index_n_heads != cfg.num_key_value_heads:
        raise _bad(
            f"index_n_heads (sparse_num_index_heads) = {cfg.index_n_heads} must "
            f"equal num_key_value_heads = {cfg.num_key_value_heads}: each index "
            "head selects the blocks of one KV head."
        )
    if cfg.index_topk_blocks < 1:
        raise _bad(f"index_topk_blocks must be >= 1, got {cfg.index_topk_blocks}.")
    bs = cfg.index_block_size
    if bs <= 0 or bs % SPARSE_BLOCK_MULTIPLE:
        raise _bad(
            f"index_block_size (sparse_block_size) = {bs} must be a positive "
            f"multiple of {SPARSE_BLOCK_MULTIPLE} so that KV cache pages divide it."
        )
    local = cfg.index_local_blocks
    init = getattr(cfg, "index_init_blocks", 0) or 0
    if local < 0 or init < 0:
        raise _bad("index_local_blocks and sparse_init_block must be >= 0.")
    if local + init > cfg.index_topk_blocks:
        raise _bad(
            f"{local} local + {init} init blocks are always selected but only "
            f"index_topk_blocks = {cfg.index_topk_blocks} fit; raise topk."
        )
    if rotary > cfg.index_head_dim:
        raise _bad(
            f"{rotary} rotary channels do not fit index_head_dim "
            f"{cfg.index_head_dim}."
        )
    score = getattr(cfg, "index_score_type", "max")
    if score != "max":
        raise _bad(f"sparse_score_type {score!r} is not supported (only 'max').")
    if not getattr(cfg, "index_disable_value", True):
        raise _bad(
            "sparse_disable_index_value = false (an index value path) is not "
            "supported; released checkpoints set it to true."
        )


def _legacy_extras(kwargs: dict) -> dict:
    """Legacy keys transformers drops or ignores, mapped to our names."""
    sparse = kwargs.get("sparse_attention_config") or {}
    out = {}
    if "sparse_init_block" in sparse:
        out["index_init_blocks"] = int(sparse["sparse_init_block"])
    if "sparse_score_type" in sparse:
        out["index_score_type"] = sparse["sparse_score_type"]
    if "sparse_disable_index_value" in sparse:
        out["index_disable_value"] = bool(sparse["sparse_disable_index_value"])
    if sparse and not sparse.get("use_sparse_attention", True):
        out["_sparse_disabled"] = True
    return out


# What the released MXFP8 checkpoint leaves in full precision besides what
# this model builds unquantized anyway (embeddings, norms, router gates): the
# LM head and the vision parts. Added to the checkpoint's own ignore list.
MXFP8_ALWAYS_UNQUANTIZED = (
    "lm_head",
    "*block_sparse_moe.gate",
    "vision_tower*",
    "multi_modal_projector*",
    "patch_merge_mlp*",
)
MXFP8_BLOCK = [1, 32]
# key kept in the rewritten config: the checkpoint's own declaration
MXFP8_SOURCE_KEY = "minimax_m3_mxfp8"


def _ignore_entry(name: str) -> str:
    """An ignore-list entry in transformers' module naming mapped onto the
    released one (the model's mapper handles prefixes and the indexer)."""
    name = re.sub(r"\.mlp\.gate$", ".block_sparse_moe.gate", name)
    return re.sub(r"\.mlp\.experts(\.|$)", r".block_sparse_moe.experts\1", name)


def normalize_quantization_config(qc: Any) -> Any:
    """MiniMax-M3's ``quant_method: mxfp8`` checkpoint declaration as vLLM's
    ModelOpt MXFP8 config dict (resolved to ``modelopt_mxfp8``); any other
    value is returned unchanged. Raises ValueError for an MXFP8 declaration
    this model cannot serve."""
    if not isinstance(qc, dict) or str(qc.get("quant_method", "")).lower() != "mxfp8":
        return qc
    block = qc.get("weight_block_size", MXFP8_BLOCK)
    if block is None or list(block) != MXFP8_BLOCK:
        raise _bad(
            f"quantization_config.weight_block_size {block} is not supported for "
            f"quant_method 'mxfp8'; MiniMax-M3-MXFP8 uses {MXFP8_BLOCK} (one E8M0 "
            "scale per 32 inputs of a row)."
        )
    act = qc.get("activation_scheme", "dynamic")
    if act not in (None, "dynamic"):
        raise _bad(
            f"quantization_config.activation_scheme {act!r} is not supported for "
            "quant_method 'mxfp8'; MiniMax-M3-MXFP8 uses 'dynamic' (no activation "
            "scales in the checkpoint)."
        )
    for key, want in (("fmt", "e4m3"), ("scale_fmt", "ue8m0")):
        if qc.get(key) not in (None, want):
            raise _bad(
                f"quantization_config.{key} {qc[key]!r} is not supported for "
                f"quant_method 'mxfp8'; expected {want!r}."
            )
    ignore = qc.get("ignored_layers")
    if ignore is None:
        ignore = qc.get("modules_to_not_convert") or []
    if isinstance(ignore, str):
        ignore = [ignore]
    if not isinstance(ignore, list) or not all(isinstance(n, str) for n in ignore):
        raise _bad(
            "quantization_config.ignored_layers must be a list of module names, "
            f"got {ignore!r}."
        )
    names = [_ignore_entry(n) for n in ignore]
    names += [n for n in MXFP8_ALWAYS_UNQUANTIZED if n not in names]
    return {
        "quant_method": "modelopt",
        "quant_algo": "MXFP8",
        "ignore": names,
        "kv_cache_scheme": None,
        MXFP8_SOURCE_KEY: dict(qc),
    }


if _HF_IMPORT_ERROR is None:

    class MiniMaxM3TextConfig(_HFMiniMaxM3VLTextConfig):
        """transformers' text config plus legacy keys and validation."""

        def __post_init__(self, **kwargs):
            extras = _legacy_extras(kwargs)
            raw_act = self.hidden_act
            scoring = kwargs.get("scoring_func", "sigmoid")
            gemma = kwargs.get("use_gemma_norm", True)
            n_shared = kwargs.get("n_shared_experts", 1)
            super().__post_init__(**kwargs)
            # transformers rewrites hidden_act to "silu"; keep what was asked.
            if raw_act == "silu":  # transformers' normalized form
                raw_act = kwargs.get("mlp_activation", "swigluoai")
            self.mlp_activation = raw_act
            self.index_init_blocks = extras.get(
                "index_init_blocks", kwargs.get("index_init_blocks", 0)
            )
            self.index_score_type = extras.get(
                "index_score_type", kwargs.get("index_score_type", "max")
            )
            self.index_disable_value = extras.get(
                "index_disable_value", kwargs.get("index_disable_value", True)
            )
            if extras.get("_sparse_disabled"):
                self.layer_types = [DENSE_LAYER] * self.num_hidden_layers
            if scoring != "sigmoid":
                raise _bad(f"scoring_func {scoring!r} is not supported (sigmoid).")
            if not gemma:
                raise _bad("use_gemma_norm = false is not supported.")
            if n_shared not in (None, 1):
                raise _bad(
                    f"n_shared_experts = {n_shared} is not supported (exactly 1)."
                )
            validate_minimax_m3_text_config(self)

        def __setattr__(self, name, value):
            if name == "quantization_config":
                value = normalize_quantization_config(value)
            super().__setattr__(name, value)

    class MiniMaxM3VLConfig(_HFMiniMaxM3VLConfig):
        """Top-level ``minimax_m3_vl`` config using the validated text part."""

        # transformers >= 5.24 builds sub-configs from this table; older
        # releases (5.17) hard-code their own text config class in
        # ``__post_init__`` instead, so the text part is built here first.
        sub_configs_defaults = {
            "text_config": MiniMaxM3TextConfig,
            "vision_config": _HFMiniMaxM3VLVisionConfig,
        }

        def __post_init__(self, **kwargs):
            self.text_config = _as_text_config(self.text_config)
            super().__post_init__(**kwargs)

        def __setattr__(self, name, value):
            # vLLM sets quantization_config again from config.json after
            # construction (transformers_utils.config.get_config): rewrite
            # it on every assignment.
            if name == "quantization_config":
                value = normalize_quantization_config(value)
            super().__setattr__(name, value)

    def _as_text_config(tc: Any) -> MiniMaxM3TextConfig:
        """``text_config`` (dict, None or a config object) as our validated
        class, independent of how the installed transformers builds it."""
        if isinstance(tc, MiniMaxM3TextConfig):
            return tc
        if tc is None:
            return MiniMaxM3TextConfig()
        if isinstance(tc, _HFMiniMaxM3VLTextConfig):
            # transformers' own class: rebuild ours from its serialized fields
            # (its __post_init__ already normalized legacy keys and dropped
            # what it does not model, exactly as for a plain transformers load).
            tc = tc.to_dict()
        if not isinstance(tc, dict):
            raise TypeError(
                "MiniMax-M3: text_config must be a dict, None or a MiniMax-M3 "
                f"text config, got {type(tc).__name__}."
            )
        tc = dict(tc)  # never mutate the caller's dict
        tc.pop("model_type", None)
        return MiniMaxM3TextConfig(**tc)

else:  # pragma: no cover

    class _Missing:
        def __init__(self, *args, **kwargs):
            raise ImportError(
                "MiniMax-M3 needs transformers >= 5.17 (module "
                "transformers.models.minimax_m3_vl); upgrade transformers: "
                f"{_HF_IMPORT_ERROR}"
            )

    MiniMaxM3TextConfig = _Missing  # type: ignore[misc,assignment]
    MiniMaxM3VLConfig = _Missing  # type: ignore[misc,assignment]
