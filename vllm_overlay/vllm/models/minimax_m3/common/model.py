# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""MiniMax-M3 text backbone (dense + MSA sparse attention, dense MLP + MoE).

Loads the released tensor names (``language_model.model.layers.N...``,
``block_sparse_moe.experts.E.w1/w3/w2``) and every layout transformers
(>= 5.17) writes; ``normalize_checkpoint_weights`` maps them all onto the
released names first:

* transformers 5.24 ``save_pretrained``: the released names;
* transformers 5.17 ``save_pretrained``: the released names, except that the
  dense MLP of a dense layer is written under ``block_sparse_moe.`` too
  (``block_sparse_moe.{gate,up,down}_proj``);
* transformers' in-memory module layout (a raw ``state_dict``):
  ``model.language_model.`` prefix, ``mlp.`` for the MoE block, the router
  bias under ``mlp.gate.``, ``self_attn.indexer.{q,k}_{proj,norm}``, fused
  ``gate_up_proj`` ([gate; up] rows) for dense MLPs and shared experts, and
  stacked experts ``experts.gate_up_proj`` [E, 2I, H] / ``experts.down_proj``
  [E, H, I].

Vision tensors are skipped: this is the language model only.

With the ``fuse_shared_expert`` option (see ``layers.py``; enable with
``--hf-overrides '{"fuse_shared_expert": true}'``) the shared expert's
``block_sparse_moe.shared_experts.{gate,up,down}_proj`` tensors are loaded
into the FusedMoE layer as expert ``num_local_experts`` (``w13`` gate/up
shards, ``w2``) instead of a separate MLP.

Quantized checkpoints go through vLLM's quantization configs; for
compressed-tensors FP8-dynamic (per-channel FP8 weights ``<name>.weight`` +
``<name>.weight_scale`` [out, 1], dynamic per-token activations) the linears
use the W8A8 FP8 scheme and the routed experts the W8A8 FP8 MoE method. An
expert's gate (w1) and up (w3) tensors, weights and per-channel scales alike,
are loaded as a pair with their rows interleaved (see ``layers.py``). FP8
KV-cache scales (``self_attn.k_scale`` / ``v_scale`` and the other namings
vLLM knows) load into dense layers' attention as in any vLLM model and into
sparse layers' scalar ``_k_scale`` / ``_v_scale``.

MiniMax-M3-MXFP8 (``quant_method: mxfp8``, rewritten to vLLM's ModelOpt MXFP8
config by the model config, see ``transformers_utils/configs/minimax_m3.py``):
E4M3 ``<name>.weight`` with uint8 E8M0 ``<name>.weight_scale_inv`` [out, K / 32]
for attention, the indexer projections, dense MLPs, shared and routed experts.
``weight_scale_inv`` is loaded as ModelOpt's ``weight_scale`` (same values:
E8M0 exponents), expert gate/up scale rows are interleaved with their weight
rows. vLLM runs it with Marlin (weights MXFP8, activations bf16) on NVIDIA
sm_80+; without an MXFP8 kernel (CPU) the model refuses to build, naming the
checkpoint. A float8 tensor for an unquantized layer, or a full-precision one
for a quantized layer (an ignore list that does not match the file), is
refused while loading. Quark OCP MX checkpoints (amd/MiniMax-M3-MXFP4) are
refused on CPU (vLLM's MX MoE emulation is Triton) and need ``amd-quark`` for
the emulation on NVIDIA GPUs.
"""

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.layernorm import GemmaRMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.logger import init_logger
from vllm.model_executor.model_loader.weight_utils import (
    default_weight_loader,
    maybe_remap_kv_scale_name,
)
from vllm.model_executor.models.utils import WeightsMapper, maybe_prefix
from vllm.sequence import IntermediateTensors
from vllm.transformers_utils.configs.minimax_m3 import (
    SPARSE_LAYER,
    validate_minimax_m3_text_config,
)

from .attention import MiniMaxM3SparseAttention
from .layers import (
    MiniMaxM3Attention,
    MiniMaxM3MLP,
    MiniMaxM3MoE,
    fuse_shared_expert_enabled,
)

# Checkpoint prefixes that belong to the vision tower / projector / MTP.
_SKIPPED_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "patch_merge_mlp.",
    "mtp.",
)

# transformers' in-memory names for the parts above.
_HF_MODULE_SKIPPED_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.")
_HF_MODULE_TEXT_PREFIX = "model.language_model."

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")
_INDEXER_RE = re.compile(r"\.self_attn\.indexer\.([qk])_(proj|norm)\.")
_HF_MOE_RE = re.compile(r"\.mlp\.(experts|gate|shared_experts)\.")
_DENSE_AS_MOE_RE = re.compile(r"\.block_sparse_moe\.(gate_proj|up_proj|down_proj)\.")
# fused shared expert: checkpoint projection -> (FusedMoE parameter, shard id)
_FUSED_SHARED = {"gate_proj": ("w13_weight", "w1"), "up_proj": ("w13_weight", "w3"),
                 "down_proj": ("w2_weight", "w2")}
_SHARED_RE = re.compile(
    r"^(.*\.block_sparse_moe\.)shared_experts\.(gate_proj|up_proj|down_proj)\.weight$"
)
# Attention (KV-cache) scale tensors, in the namings vLLM's
# maybe_remap_kv_scale_name maps onto ``self_attn.attn.{k,v,q}_scale``
# (compressed-tensors ``self_attn.k_scale``, ModelOpt ``self_attn.k_proj.k_scale``...)
_KV_SCALE_SUFFIXES = (
    ".k_scale", ".v_scale", ".q_scale", ".kv_scale",
    ".k_zero_point", ".v_zero_point", ".q_zero_point",
    ".k_cache.scale", ".v_cache.scale", ".q.scale",
)
# expert tensors with one row per output channel: their gate (w1) and up (w3)
# halves are loaded as a pair, rows interleaved (MiniMaxM3MoE.interleave_gate_up)
_GATE_UP_ROW_SUFFIXES = ("weight", "weight_scale")

logger = init_logger(__name__)


def _split_rows(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if t.shape[dim] % 2:
        raise ValueError(
            f"MiniMax-M3: fused gate/up tensor of shape {tuple(t.shape)} has an "
            f"odd size on dim {dim}; cannot split it into gate and up."
        )
    gate, up = t.chunk(2, dim=dim)
    return gate, up


def normalize_checkpoint_weights(
    weights: Iterable[tuple[str, torch.Tensor]], mlp_layer_types: list[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Map checkpoint tensors (names already stripped of ``language_model.``)
    onto the released names, whatever transformers version wrote them (see
    the module docstring). Tensor values are passed through unchanged, only
    renamed or split (fused gate/up rows, stacked experts). Vision/projector
    tensors in transformers' in-memory naming are dropped here; the released
    vision names are left for the caller to skip."""
    for name, w in weights:
        if name.startswith(_HF_MODULE_SKIPPED_PREFIXES):
            continue
        if name.startswith(_HF_MODULE_TEXT_PREFIX):
            name = "model." + name[len(_HF_MODULE_TEXT_PREFIX):]
        name = _INDEXER_RE.sub(r".self_attn.index_\1_\2.", name)
        if name.endswith(".mlp.gate.e_score_correction_bias"):
            name = name[: -len("mlp.gate.e_score_correction_bias")]
            name += "block_sparse_moe.e_score_correction_bias"
        name = _HF_MOE_RE.sub(r".block_sparse_moe.\1.", name)
        m = _LAYER_RE.match(name)
        layer = int(m.group(1)) if m is not None else -1
        if 0 <= layer < len(mlp_layer_types) and mlp_layer_types[layer] == "dense":
            # transformers 5.17 writes a dense layer's MLP as block_sparse_moe.
            name = _DENSE_AS_MOE_RE.sub(r".mlp.\1.", name)

        if name.endswith((".block_sparse_moe.experts.gate_up_proj",
                          ".block_sparse_moe.experts.gate_up_proj.weight")):
            # stacked experts [E, 2I, H], rows [gate; up] per expert
            base = name[: name.rindex(".experts.") + len(".experts.")]
            if w.dim() != 3:
                raise ValueError(
                    f"MiniMax-M3: stacked expert tensor {name!r} has shape "
                    f"{tuple(w.shape)}; expected [experts, 2 * intermediate, hidden]."
                )
            gate, up = _split_rows(w, 1)
            for e in range(w.shape[0]):
                yield f"{base}{e}.w1.weight", gate[e]
                yield f"{base}{e}.w3.weight", up[e]
            continue
        if name.endswith((".block_sparse_moe.experts.down_proj",
                          ".block_sparse_moe.experts.down_proj.weight")):
            # stacked experts [E, H, I]
            base = name[: name.rindex(".experts.") + len(".experts.")]
            if w.dim() != 3:
                raise ValueError(
                    f"MiniMax-M3: stacked expert tensor {name!r} has shape "
                    f"{tuple(w.shape)}; expected [experts, hidden, intermediate]."
                )
            for e in range(w.shape[0]):
                yield f"{base}{e}.w2.weight", w[e]
            continue
        if name.endswith(".gate_up_proj.weight") and (
            ".mlp." in name or ".shared_experts." in name
        ):
            # fused dense MLP / shared expert [2I, H], rows [gate; up]
            base = name[: -len("gate_up_proj.weight")]
            gate, up = _split_rows(w, 0)
            yield base + "gate_proj.weight", gate
            yield base + "up_proj.weight", up
            continue
        yield name, w


class MiniMaxM3DecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, config, layer_idx: int, prefix: str):
        super().__init__()
        quant_config = vllm_config.quant_config
        sparse = config.layer_types[layer_idx] == SPARSE_LAYER
        self.self_attn = MiniMaxM3Attention(
            config,
            layer_idx,
            sparse,
            vllm_config.cache_config,
            quant_config,
            prefix=f"{prefix}.self_attn",
        )
        if config.mlp_layer_types[layer_idx] == "sparse":
            self.block_sparse_moe = MiniMaxM3MoE(
                config, quant_config, prefix=f"{prefix}.block_sparse_moe"
            )
            self.mlp = None
        else:
            self.mlp = MiniMaxM3MLP(
                config,
                config.hidden_size,
                config.dense_intermediate_size,
                quant_config,
                prefix=f"{prefix}.mlp",
            )
        eps = config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_layernorm(hidden))
        h = self.post_attention_layernorm(hidden)
        h = self.mlp(h) if self.mlp is not None else self.block_sparse_moe(h)
        return hidden + h


@support_torch_compile
class MiniMaxM3Model(nn.Module):
    """Embeddings, decoder layers, final norm. Compiled by vLLM (torch.compile
    + piecewise CUDA graphs split at the attention ops, including
    ``vllm::minimax_m3_sparse_attention``)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = _text_config(vllm_config)
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size,
            config.hidden_size,
            prefix=f"{prefix}.embed_tokens",
        )
        self.layers = nn.ModuleList(
            MiniMaxM3DecoderLayer(vllm_config, config, i, f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden = inputs_embeds
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden)


def _check_fp8_dtype(param: torch.Tensor, name: str, w: torch.Tensor) -> None:
    """A weight's float8-ness must match its parameter's: a mismatch means
    the quantization config (its ignore list) does not describe the file, and
    the loader's copy would silently cast."""
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    if not name.endswith(".weight") or (param.dtype in fp8) == (w.dtype in fp8):
        return
    if w.dtype in fp8:
        raise ValueError(
            f"MiniMax-M3: checkpoint tensor {name!r} is {w.dtype} but its layer "
            f"was built unquantized ({param.dtype}): the checkpoint's "
            "quantization_config excludes it (ignore list / ignored_layers) although "
            "the file holds quantized weights. Fix the config's ignore list."
        )
    raise ValueError(
        f"MiniMax-M3: checkpoint tensor {name!r} is {w.dtype} but its layer expects "
        f"{param.dtype} weights (quantized per the checkpoint's quantization_config). "
        "If the file leaves this layer unquantized, list it in the config's ignore "
        "list (ignored_layers)."
    )


def _mxfp8_tensor(name: str, w: torch.Tensor) -> tuple[str, torch.Tensor]:
    """A MiniMax-M3-MXFP8 tensor as vLLM's ModelOpt MXFP8 parameters take it:
    ``weight_scale_inv`` (E8M0 exponents, despite the name) -> ``weight_scale``
    in uint8."""
    if not name.endswith(".weight_scale_inv"):
        return name, w
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if e8m0 is not None and w.dtype == e8m0:
        w = w.view(torch.uint8)
    if w.dtype != torch.uint8:
        raise ValueError(
            f"MiniMax-M3: MXFP8 scale {name!r} is {w.dtype}; MiniMax-M3-MXFP8 "
            "stores E8M0 exponents as uint8 (or float8_e8m0fnu), one per 32 inputs."
        )
    return name[: -len("_inv")], w


def _load_param(params: dict, target: str, name: str, w: torch.Tensor) -> None:
    """Load checkpoint tensor ``name`` into parameter ``target`` with its loader."""
    if target not in params:
        raise ValueError(
            f"MiniMax-M3: checkpoint tensor {name!r} has no matching "
            "parameter in vLLM's model."
        )
    param = params[target]
    _check_fp8_dtype(param, name, w)
    getattr(param, "weight_loader", default_weight_loader)(param, w)


def _is_mxfp8(quant_config) -> bool:
    return quant_config is not None and quant_config.get_name() == "modelopt_mxfp8"


MXFP8_CHECKPOINT = "MiniMaxAI/MiniMax-M3-MXFP8"
MXFP4_CHECKPOINT = "amd/MiniMax-M3-MXFP4"
BF16_CHECKPOINT = "MiniMaxAI/MiniMax-M3"
_OCP_MX_DTYPES = ("fp4", "fp6_e3m2", "fp6_e2m3")


def _quark_ocp_mx(quant_config) -> bool:
    """Whether a Quark config quantizes some weights to OCP MX (MXFP4/6)."""
    if quant_config is None or quant_config.get_name() != "quark":
        return False

    def walk(x) -> bool:
        if isinstance(x, dict):
            w = x.get("weight")
            if isinstance(w, dict) and w.get("dtype") in _OCP_MX_DTYPES:
                return True
            return any(walk(v) for v in x.values())
        if isinstance(x, list):
            return any(walk(v) for v in x)
        return False

    return walk(getattr(quant_config, "quant_config", None))


def _check_mx_platform(quant_config) -> None:
    """Refuse Quark OCP MX checkpoints where vLLM 0.23 cannot run them."""
    import importlib.util

    from vllm.platforms import current_platform

    if not _quark_ocp_mx(quant_config):
        return
    if current_platform.is_cpu():
        raise ValueError(
            f"MiniMax-M3: this Quark OCP MX checkpoint (the {MXFP4_CHECKPOINT} format: "
            "MXFP4 weights and dynamic MXFP4 activations on the experts) cannot run "
            "on CPU: vLLM 0.23's MX MoE has no CPU kernel (its emulation runs "
            f"Triton GPU kernels). On CPU serve the BF16 checkpoint {BF16_CHECKPOINT}; "
            "serve this one on a GPU."
        )
    if current_platform.is_cuda() and importlib.util.find_spec("quark") is None:
        raise ValueError(
            f"MiniMax-M3: this Quark OCP MX checkpoint (the {MXFP4_CHECKPOINT} format) "
            "runs emulated on NVIDIA GPUs (MXFP4 dequantized to bf16 on the fly, "
            "activations quantize-dequantized), which needs the amd-quark package: "
            f"pip install amd-quark. Or serve {MXFP8_CHECKPOINT} (native Marlin "
            "MXFP8) or the BF16 checkpoint instead."
        )


def _mxfp8_platform_error(e: Exception) -> ValueError:
    from vllm.platforms import current_platform

    where = "CPU" if current_platform.is_cpu() else current_platform.device_name
    why = " ".join(str(e).split()).rstrip(":.")
    return ValueError(
        f"MiniMax-M3: this MXFP8 checkpoint (the {MXFP8_CHECKPOINT} format: E4M3 "
        f"weights, E8M0 scales per 32 inputs) cannot be served on {where} ({why}). "
        "vLLM 0.23 runs MXFP8 linears and experts with Marlin on NVIDIA GPUs "
        "(sm_80 and newer, e.g. the H200), FlashInfer on sm_100, or XPU kernels; "
        f"its CPU build has none. Serve it on such a GPU, or serve {BF16_CHECKPOINT} "
        "(BF16) here."
    )


def _text_config(vllm_config: VllmConfig):
    config = vllm_config.model_config.hf_text_config
    if not hasattr(config, "index_topk_blocks"):
        raise ValueError(
            "MiniMax-M3: the model config lacks the MSA fields (index_* / "
            "sparse_attention_config); is this a MiniMax-M3 checkpoint?"
        )
    validate_minimax_m3_text_config(config)
    return config


class MiniMaxM3SparseForCausalLM(nn.Module):
    """MiniMax-M3 text model. Language-model only (no vision tower)."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    # Also applied to a quantization config's module names (compressed-tensors
    # ``ignore`` / targets): released names (``language_model.model.layers.N...``)
    # and transformers' module names (``model.language_model.layers.N...``,
    # ``self_attn.indexer.q_proj``, ``mlp.shared_experts``) both map onto ours.
    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_substr={
            ".self_attn.indexer.": ".self_attn.index_",
            ".mlp.shared_experts.": ".block_sparse_moe.shared_experts.",
        },
        orig_to_new_prefix={"language_model.": "", "model.language_model.": "model."},
    )

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = _text_config(vllm_config)
        self.config = config
        self.fuse_shared_expert = fuse_shared_expert_enabled(
            config, vllm_config.model_config.hf_config
        )
        self.mxfp8 = _is_mxfp8(vllm_config.quant_config)
        _check_mx_platform(vllm_config.quant_config)
        try:
            self.model = MiniMaxM3Model(
                vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model")
            )
        except ValueError as e:  # no MXFP8 linear / MoE kernel on this platform
            if self.mxfp8 and "MXFP8" in str(e):
                raise _mxfp8_platform_error(e) from e
            raise
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=vllm_config.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def get_expert_mapping(self) -> list[tuple[str, str, int, str]]:
        return FusedMoE.make_expert_params_mapping(
            self,
            ckpt_gate_proj_name="w1",
            ckpt_down_proj_name="w2",
            ckpt_up_proj_name="w3",
            num_experts=self.config.num_local_experts,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        stacked = [
            ("qkv_proj", "q_proj", "q"),
            ("qkv_proj", "k_proj", "k"),
            ("qkv_proj", "v_proj", "v"),
            ("gate_up_proj", "gate_proj", 0),
            ("gate_up_proj", "up_proj", 1),
        ]
        expert_mapping = self.get_expert_mapping()
        params = dict(self.named_parameters())
        moes = {n: m for n, m in self.named_modules() if isinstance(m, MiniMaxM3MoE)}
        sparse_attn = {
            n: m for n, m in self.named_modules()
            if isinstance(m, MiniMaxM3SparseAttention)
        }
        # KV scale names vLLM resolves against: dense layers' parameters, plus
        # the scale names of the sparse layers (scalar buffers, not parameters)
        kv_names = dict(params)
        for n in sparse_attn:
            for a in ("k_scale", "v_scale", "q_scale",
                      "k_zero_point", "v_zero_point", "q_zero_point"):
                kv_names[f"{n}.{a}"] = None
        pending: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        loaded: set[str] = set()
        for name, w in normalize_checkpoint_weights(
            self.hf_to_vllm_mapper.apply(weights), list(self.config.mlp_layer_types)
        ):
            if name.startswith(_SKIPPED_PREFIXES) or "rotary_emb.inv_freq" in name:
                continue
            if self.mxfp8:
                name, w = _mxfp8_tensor(name, w)
            if self.config.tie_word_embeddings and name.startswith("lm_head."):
                continue
            if name.endswith(_KV_SCALE_SUFFIXES):
                self._load_kv_scale(name, w, kv_names, params, sparse_attn, loaded)
                continue
            m = _SHARED_RE.match(name) if self.fuse_shared_expert else None
            if m is not None:
                # shared expert -> the extra FusedMoE expert (id n_routed)
                param_name, shard_id = _FUSED_SHARED[m.group(2)]
                name = f"{m.group(1)}experts.{param_name}"
                self._load_expert(params, moes, pending, name, "weight", w, shard_id,
                                  self.config.num_local_experts)
                loaded.add(name)
                continue
            if ".index_q_proj." in name or ".index_k_proj." in name:
                pass  # plain replicated linears, loaded below
            elif ".experts." in name and ".shared_experts." not in name:
                for param_name, weight_name, expert_id, shard_id in expert_mapping:
                    if weight_name not in name:
                        continue
                    suffix = name.split(weight_name, 1)[1]
                    name = name.replace(weight_name, param_name)
                    self._load_expert(params, moes, pending, name, suffix, w, shard_id,
                                      expert_id)
                    break
                else:
                    raise ValueError(f"MiniMax-M3: unexpected expert tensor {name}")
                loaded.add(name)
                continue
            else:
                for param_name, shard_name, shard_id in stacked:
                    if f".{shard_name}." not in name:
                        continue
                    name = name.replace(f".{shard_name}.", f".{param_name}.")
                    param = params[name]
                    _check_fp8_dtype(param, name, w)
                    param.weight_loader(param, w, shard_id)
                    break
                else:
                    shard_id = None
                if shard_id is not None:
                    loaded.add(name)
                    continue
            _load_param(params, name, name, w)
            loaded.add(name)
        if pending:
            (pname, expert_id), halves = next(iter(pending.items()))
            have = next(iter(halves))
            raise ValueError(
                f"MiniMax-M3: the checkpoint has expert {expert_id}'s {have} tensor "
                f"for {pname} but not its {'w3' if have == 'w1' else 'w1'} "
                "partner; an expert's gate (w1) and up (w3) are loaded together."
            )
        return loaded

    @staticmethod
    def _load_expert(params, moes, pending, pname: str, suffix: str,
                     w: torch.Tensor, shard_id: str, expert_id: int) -> None:
        """One expert tensor into FusedMoE parameter ``pname``. Gate (w1) and
        up (w3) tensors with one row per output channel (weights, per-channel
        scales) wait for their partner and are loaded as the pair that leaves
        w13's rows interleaved (``MiniMaxM3MoE.interleave_gate_up``)."""
        param = params[pname]
        _check_fp8_dtype(param, f"{pname}.{suffix}" if suffix == "weight" else pname, w)
        if shard_id not in ("w1", "w3") or suffix not in _GATE_UP_ROW_SUFFIXES:
            param.weight_loader(param, w, pname, shard_id=shard_id, expert_id=expert_id)
            return
        halves = pending.setdefault((pname, expert_id), {})
        if shard_id in halves:
            raise ValueError(
                f"MiniMax-M3: expert {expert_id}'s {shard_id} tensor for {pname} "
                "appears twice in the checkpoint."
            )
        halves[shard_id] = w
        if len(halves) < 2:
            return
        del pending[(pname, expert_id)]
        moe = moes[pname.rsplit(".experts.", 1)[0]]
        if moe.experts._map_global_expert_id_to_local_expert_id(expert_id) == -1:
            return  # another expert-parallel rank's expert
        first, second = moe.interleave_gate_up(halves["w1"], halves["w3"])
        param.weight_loader(param, first, pname, shard_id="w1", expert_id=expert_id)
        param.weight_loader(param, second, pname, shard_id="w3", expert_id=expert_id)

    @staticmethod
    def _load_kv_scale(name: str, w: torch.Tensor, kv_names: dict, params: dict,
                       sparse_attn: dict, loaded: set[str]) -> None:
        """A KV-cache scale tensor. Names are resolved as vLLM does for any
        model (``maybe_remap_kv_scale_name``); dense layers load it into the
        parameters their attention quant method created, sparse layers into
        their scalar ``_k_scale`` / ``_v_scale`` (a per-head scale is reduced
        to its maximum; q scales and zero points are not used there)."""
        target = maybe_remap_kv_scale_name(name, kv_names)
        if target is None:
            return  # no such scale in this model (vLLM warned)
        layer_name, attr = target.rsplit(".", 1)
        layer = sparse_attn.get(layer_name)
        if layer is None:
            _load_param(params, target, name, w)
            loaded.add(target)
            return
        if attr not in ("k_scale", "v_scale"):
            return
        s = w.detach().float().reshape(-1)
        if s.numel() == 0 or not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
            raise ValueError(
                f"MiniMax-M3: KV-cache scale {name!r} must be positive and finite, "
                f"got {w.tolist()}."
            )
        if s.numel() > 1:
            logger.warning_once(
                "MiniMax-M3 sparse attention layers use one K and one V scale per "
                "layer; per-head checkpoint scales (e.g. %s) are reduced to their "
                "maximum.", name,
            )
        scale = s.max()
        if getattr(layer, "cache_torch_dtype", None) == torch.float8_e4m3fnuz:
            # checkpoint scales are for OCP e4m3fn (max 448); an e4m3fnuz cache
            # (max 240, MI300X / MI325X) takes twice the scale, as vLLM's
            # BaseKVCacheMethod does on fnuz platforms
            scale = scale * 2
        getattr(layer, f"_{attr}").copy_(scale)
        if name.endswith(".kv_scale"):  # deprecated single scale: K and V
            layer._v_scale.copy_(scale)


class MiniMaxM3SparseForConditionalGeneration(MiniMaxM3SparseForCausalLM):
    """Released ``MiniMaxM3SparseForConditionalGeneration`` checkpoints served
    as text-only models: the vision tower is not built, its weights are skipped,
    and vLLM refuses image/video inputs (the model is registered as text-only).
    """
