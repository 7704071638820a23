# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""MiniMax-M3 MLP, MoE and attention blocks (text backbone).

Fused shared expert (option, off by default)
--------------------------------------------
By default the shared expert is a separate MLP (``MiniMaxM3MLP``) added to
``FusedMoE``'s routed sum: ``routed_sum * routed_scaling_factor + shared``.

With ``fuse_shared_expert`` set, the shared expert becomes one extra expert of
the ``FusedMoE`` layer: expert id ``num_local_experts`` (the last rows of
``w13_weight`` / ``w2_weight``), selected by every token. The router then
returns ``top_k + 1`` experts: the routed ones with their renormalized weights
multiplied by ``routed_scaling_factor`` (folded into the routing weights), and
the shared expert with weight 1.0, so the ``FusedMoE`` output already equals
``routed_sum * routed_scaling_factor + shared`` and no scaling follows it.
The shared expert's checkpoint tensors
(``shared_experts.{gate,up,down}_proj``) are loaded into that expert's rows
(``common/model.py``). On GPU this relies on the ported vllm#51632 fix (the
Triton experts align over ``w1.shape[0]`` rather than ``global_num_experts``
when there is no expert map); without it the extra expert id is dropped.

Enable it through hf_overrides, either form:

* ``--hf-overrides '{"fuse_shared_expert": true}'`` (top-level config key), or
* ``--hf-overrides '{"text_config": {"fuse_shared_expert": true}}'``.

The text config's value wins when both are set; the default is False.
Refused (ValueError at model construction) with expert parallelism (the extra
expert would need to be placed/replicated on every EP rank), with any
quantization (only unquantized experts are handled), and when
``shared_intermediate_size != intermediate_size`` (the extra expert must have
the routed experts' shape).

Gate/up row order and quantized experts
---------------------------------------
Checkpoints keep each expert's gate (w1) and up (w3) apart; vLLM's swigluoai
experts read them interleaved from the rows of ``w13`` (gate = even rows,
up = odd rows). ``model.py`` pairs each expert's w1/w3 tensors while loading
and hands FusedMoE's loader the pair from ``interleave_gate_up_rows``, so the
rows land interleaved on every TP rank. That happens on the checkpoint
tensors, before any quant method's ``process_weights_after_loading`` (which
may repack or requantize), and applies to the weight and to per-channel
scales alike: unquantized experts, per-channel FP8 checkpoints
(compressed-tensors FP8-dynamic) and MX checkpoints whose scales group inputs
of one row only (MXFP8 E8M0 scales [rows, K / 32], MiniMax-M3-MXFP8 through
vLLM's ModelOpt MXFP8 Marlin experts; Quark OCP MXFP4) are served. Other
expert schemes are refused when the layer is built (``_check_gate_up_layout``):
block FP8 whose blocks span several rows and per-shard tensor scales (one
scale would cover rows of both gate and up after interleaving), transposed
or padded layouts, and MXFP8 MoE backends other than Marlin (FlashInfer
TRT-LLM reorders gate/up rows itself).
"""

import torch
from torch import nn

from vllm.config import CacheConfig, get_current_vllm_config_or_none
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.fused_moe import FusedMoE, FusedMoeWeightScaleSupported
from vllm.model_executor.layers.layernorm import GemmaRMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.layers.rotary_embedding import get_rope

from .attention import MiniMaxM3SparseAttention, index_cache_dtype, kv_scale_mode

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def swigluoai_halves(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """swigluoai on [..., 2*I] laid out as [gate | up]."""
    gate, up = x.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1.0) * (gate * torch.sigmoid(gate * alpha))


class MiniMaxM3MLP(nn.Module):
    """Dense MLP / shared expert: gate_up -> swigluoai -> down."""

    def __init__(
        self,
        config,
        hidden_size: int,
        intermediate_size: int,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> None:
        super().__init__()
        self.alpha = config.swiglu_alpha
        self.limit = config.swiglu_limit
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(swigluoai_halves(gate_up, self.alpha, self.limit))
        return out


class MiniMaxM3MoE(nn.Module):
    """Sigmoid-routed MoE with correction bias, routed scale, shared expert."""

    def __init__(
        self,
        config,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> None:
        super().__init__()
        if (config.swiglu_alpha, config.swiglu_limit) != (SWIGLU_ALPHA, SWIGLU_LIMIT):
            raise ValueError(
                "MiniMax-M3 MoE: vLLM's fused swigluoai experts use alpha "
                f"{SWIGLU_ALPHA} and limit {SWIGLU_LIMIT}; the config has "
                f"{config.swiglu_alpha} / {config.swiglu_limit}."
            )
        _check_expert_parallel_platform()
        n_exp = config.num_local_experts
        self.n_routed_experts = n_exp
        self.routed_scaling_factor = float(config.routed_scaling_factor)
        self.fuse_shared_expert = fuse_shared_expert_enabled(config)
        if self.fuse_shared_expert:
            _check_fused_shared_expert(config, quant_config)
        n_fused = 1 if self.fuse_shared_expert else 0
        self.gate = ReplicatedLinear(
            config.hidden_size,
            n_exp,
            bias=False,
            quant_config=None,
            prefix=f"{prefix}.gate",
        )
        self.e_score_correction_bias = nn.Parameter(
            torch.zeros(n_exp, dtype=torch.float32), requires_grad=False
        )
        self.experts = FusedMoE(
            num_experts=n_exp + n_fused,
            top_k=config.num_experts_per_tok + n_fused,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            renormalize=True,
            custom_routing_function=self._route,
            activation="swigluoai",
            quant_config=quant_config,
            prefix=f"{prefix}.experts",
        )
        _check_gate_up_layout(self.experts, config.intermediate_size)
        _check_cpu_moe_tiles(self.experts)
        if self.fuse_shared_expert:
            # In FusedMoE as expert id n_exp; loaded there by model.py.
            self.shared_experts = None
        else:
            self.shared_experts = MiniMaxM3MLP(
                config,
                config.hidden_size,
                config.shared_intermediate_size,
                quant_config,
                f"{prefix}.shared_experts",
            )

    def _route(self, hidden_states, gating_output, topk, renormalize):
        n_routed = topk - 1 if self.fuse_shared_expert else topk
        scores = gating_output.float().sigmoid()
        biased = scores + self.e_score_correction_bias.float()
        _, ids = torch.topk(biased, n_routed, dim=-1, sorted=False)
        weights = scores.gather(1, ids)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.fuse_shared_expert:
            # routed * scale + shared * 1 == routed_sum * scale + shared
            weights = weights * self.routed_scaling_factor
            shared_id = torch.full_like(ids[:, :1], self.n_routed_experts)
            ids = torch.cat((ids, shared_id), dim=-1)
            weights = torch.cat((weights, torch.ones_like(weights[:, :1])), dim=-1)
        return weights, ids.to(torch.int32)

    def interleave_gate_up(
        self, gate: torch.Tensor, up: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Checkpoint experts keep gate (w1) and up (w3) apart; vLLM's
        swigluoai experts read them interleaved from w13's rows (gate =
        x[..., 0::2], up = x[..., 1::2]). Returns the two tensors to load as
        the w1 and w3 shards (through FusedMoE's weight loader, in that order)
        so that every TP rank's w13 rows come out interleaved. Works on any
        per-output-row tensor: the weight (any dtype, e.g. FP8) and per-channel
        scales [I, 1] alike, so a row keeps its scale. Done on the checkpoint
        tensors, before the quant method's process_weights_after_loading."""
        return interleave_gate_up_rows(gate, up, self.experts.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, _ = self.gate(x)
        if self.fuse_shared_expert:
            # scale and shared expert are inside (see _route)
            return self.experts(hidden_states=x, router_logits=logits)
        shared = self.shared_experts(x)
        routed = self.experts(hidden_states=x, router_logits=logits)
        return routed * self.routed_scaling_factor + shared


def interleave_gate_up_rows(
    gate: torch.Tensor, up: torch.Tensor, tp_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second) such that FusedMoE's w13 loader, which puts rank r's
    slice ``first[r*n:(r+1)*n]`` (w1) then ``second[r*n:(r+1)*n]`` (w3) into
    rank r's rows, leaves gate/up interleaved there:
    ``rows[2i] = gate[r*n + i]``, ``rows[2i + 1] = up[r*n + i]`` (n = I / tp)."""
    if gate.shape != up.shape:
        raise ValueError(
            f"MiniMax-M3: expert gate {tuple(gate.shape)} and up {tuple(up.shape)} "
            "tensors differ in shape."
        )
    rows, rest = gate.shape[0], gate.shape[1:]
    if rows % tp_size:
        raise ValueError(
            f"MiniMax-M3: expert intermediate size {rows} is not divisible by "
            f"the tensor parallel size {tp_size}."
        )
    n = rows // tp_size
    both = torch.stack(
        (gate.reshape(tp_size, n, *rest), up.reshape(tp_size, n, *rest)), dim=2
    ).reshape(tp_size, 2 * n, *rest)
    return both[:, :n].reshape(rows, *rest), both[:, n:].reshape(rows, *rest)


def _gate_up_layout_problem(experts, intermediate_size: int) -> str | None:
    """Why interleaving gate/up rows (``interleave_gate_up_rows``) would not
    be right for these experts' w13 tensors; None when it is."""
    method = experts.quant_method
    if getattr(method, "uses_meta_device", False):
        # online quantization: the checkpoint is full precision and is
        # quantized after loading, i.e. after the rows were interleaved
        return None
    n = experts.moe_config.intermediate_size_per_partition
    if n * experts.tp_size != intermediate_size:
        return (f"it pads the expert intermediate size per rank to {n} (checkpoint "
                f"{intermediate_size} over tensor parallel size {experts.tp_size})")
    rows = 2 * n
    params = dict(experts.named_parameters(recurse=False))
    if "w13_weight" not in params:
        names = sorted(k for k in params if k.startswith("w13"))
        return f"its w13 tensors {names} are packed or transposed"
    backend = getattr(method, "mxfp8_backend", None)
    if backend is not None and getattr(backend, "name", str(backend)) != "MARLIN":
        return (f"its MXFP8 MoE backend {getattr(backend, 'value', backend)} lays out "
                "gate and up rows itself (only Marlin takes them as loaded)")
    block = getattr(method, "weight_block_size", None)
    row_groups = (FusedMoeWeightScaleSupported.CHANNEL.value,
                  FusedMoeWeightScaleSupported.GROUP.value,
                  FusedMoeWeightScaleSupported.BLOCK.value)
    for name, p in params.items():
        if not name.startswith("w13"):
            continue
        per_row = p.dim() == 3 and p.shape[1] == rows
        kind = getattr(p, "quant_method", None)
        if name == "w13_weight" and per_row:
            continue
        if (name == "w13_weight_scale" and per_row and kind in row_groups
                and (kind != FusedMoeWeightScaleSupported.BLOCK.value
                     or block is None or block[0] == 1)):
            # per-channel, or groups of inputs within one row (MX [1, 32]):
            # one scale row per weight row, moves with its row
            continue
        if name == "w13_input_scale" and p.dim() == 1:
            continue  # one activation scale per expert: no rows
        if kind == FusedMoeWeightScaleSupported.BLOCK.value:
            block = getattr(experts, "weight_block_size", None)
            return (f"{name} {tuple(p.shape)} holds block scales (block {block}); "
                    "one scale covers a block of consecutive gate or up rows, and "
                    "interleaving the rows would split every block across gate and up")
        if kind == FusedMoeWeightScaleSupported.TENSOR.value:
            return (f"{name} {tuple(p.shape)} holds one scale per gate/up shard; "
                    "interleaving would put rows of both shards under one scale")
        return (f"{name} {tuple(p.shape)} ({kind or 'unknown'} layout) is not stored "
                "one row per output channel")
    return None


def _check_gate_up_layout(experts, intermediate_size: int) -> None:
    why = _gate_up_layout_problem(experts, intermediate_size)
    if why is not None:
        raise NotImplementedError(
            f"MiniMax-M3: the routed experts cannot use "
            f"{experts.quant_method.__class__.__name__}: {why}. vLLM's swigluoai "
            "experts need w13's gate and up rows interleaved, which this model "
            "does row by row on the checkpoint tensors; supported are unquantized "
            "experts, per-channel FP8 checkpoints (compressed-tensors FP8-dynamic, "
            "as MiniMax-M3-FP8-dynamic) and MX checkpoints with one scale row per "
            "weight row (MiniMax-M3-MXFP8 on vLLM's Marlin MXFP8 experts). "
            "Block-quantized FP8 with blocks of several rows is not supported: "
            "serve the BF16, MXFP8 or a per-channel FP8 checkpoint instead."
        )


# vLLM's CPU fused MoE (csrc/cpu/cpu_fused_moe.cpp) runs its grouped GEMM, where the
# CPU build has one (torch.ops._C.prepack_moe_weight: the AVX-512 BF16 build), on
# output tiles of 32 columns (the micro-GEMMs' NSize, VEC and AMX alike) and checks
# that w13's rows (gate + up: 2 x the intermediate size per rank) are a whole number
# of tile pairs. vLLM's Python dispatch (CPUFusedMOE.check_grouped_gemm) only asks for a
# multiple of 32, so a size that is 16 mod 32 passes it and then aborts the process in
# C++. The rule below mirrors both, so such a config is refused before any weight loads.
CPU_MOE_N_TILE = 32


def cpu_moe_tile_problem(intermediate_per_rank: int, hidden_size: int, dtype: torch.dtype,
                         *, grouped_gemm: bool, amx: bool) -> str | None:
    """Why vLLM's CPU grouped-GEMM MoE would abort on these sizes, else None.

    ``grouped_gemm``: the CPU build has the grouped GEMM; ``amx``: the CPU has AMX
    tiles (then the grouped GEMM needs bf16 and inputs in multiples of 32, else vLLM
    falls back to its torch path, which takes any size)."""
    w13_rows = 2 * intermediate_per_rank
    if not grouped_gemm or w13_rows % 32 or hidden_size % 32:
        return None  # vLLM's torch path: any size
    if amx and not (dtype == torch.bfloat16 and intermediate_per_rank % 32 == 0):
        return None  # AMX without its conditions: the torch path
    need = 2 * CPU_MOE_N_TILE
    if w13_rows % need:
        return (f"the MoE intermediate size per rank is {intermediate_per_rank}, so the "
                f"experts' gate/up projection has {w13_rows} rows; vLLM's CPU fused MoE "
                f"({'AMX' if amx else 'AVX-512'} grouped GEMM) tiles it in pairs of "
                f"{CPU_MOE_N_TILE}-row tiles and needs a multiple of {need} rows, i.e. an "
                f"intermediate size per rank that is a multiple of {need // 2}")
    return None


def _cpu_moe_features() -> tuple[bool, bool]:
    """(this CPU build has vLLM's grouped-GEMM MoE, this CPU has AMX tiles): what
    CPUFusedMOE.check_grouped_gemm reads."""
    return hasattr(torch.ops._C, "prepack_moe_weight"), torch.cpu._is_amx_tile_supported()


def _check_cpu_moe_tiles(experts) -> None:
    """Refuse, at construction, the MoE sizes vLLM's CPU fused MoE cannot tile."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    w13 = getattr(experts, "w13_weight", None)
    if w13 is None or w13.dim() != 3:
        return  # quantized layouts: vLLM's CPU build has no fused MoE for them anyway
    grouped_gemm, amx = _cpu_moe_features()
    why = cpu_moe_tile_problem(
        experts.moe_config.intermediate_size_per_partition, w13.shape[2], w13.dtype,
        grouped_gemm=grouped_gemm, amx=amx)
    if why is not None:
        raise ValueError(
            f"MiniMax-M3 on CPU: {why}. Use such an intermediate_size (with tensor "
            f"parallelism, per rank), or run on a GPU.")

def _top_config():
    vc = get_current_vllm_config_or_none()
    return vc.model_config.hf_config if vc is not None else None


def _check_expert_parallel_platform() -> None:
    """vLLM 0.23's CPU MoE (``cpu_fused_moe_torch``) indexes experts by their
    global id and has no expert map, so expert parallelism on CPU dies with an
    IndexError in the first forward; refuse it at model construction."""
    from vllm.platforms import current_platform

    vc = get_current_vllm_config_or_none()
    if (vc is not None and vc.parallel_config.enable_expert_parallel
            and current_platform.is_cpu()):
        raise ValueError(
            "MiniMax-M3: expert parallelism (--enable-expert-parallel) needs a "
            "GPU; vLLM's CPU MoE has no expert map. On CPU use tensor "
            "parallelism alone (drop --enable-expert-parallel)."
        )


def fuse_shared_expert_enabled(config, top_config=None) -> bool:
    """``fuse_shared_expert`` from the text config, else from the top-level
    config (flat ``hf_overrides`` land there), else False."""
    val = getattr(config, "fuse_shared_expert", None)
    if val is None:
        if top_config is None:
            vc = get_current_vllm_config_or_none()
            top_config = vc.model_config.hf_config if vc is not None else None
        val = getattr(top_config, "fuse_shared_expert", None)
    if val is None:
        return False
    if not isinstance(val, bool):
        raise ValueError(
            f"MiniMax-M3: fuse_shared_expert must be true or false, got {val!r}."
        )
    return val


def _check_fused_shared_expert(config, quant_config) -> None:
    why = None
    vc = get_current_vllm_config_or_none()
    if vc is not None and vc.parallel_config.enable_expert_parallel:
        why = "expert parallelism is enabled (the extra expert is not in the expert map)"
    elif quant_config is not None:
        why = (f"quantization {quant_config.get_name()!r} is set (only unquantized "
               "experts are handled)")
    elif config.shared_intermediate_size != config.intermediate_size:
        why = (f"shared_intermediate_size {config.shared_intermediate_size} != "
               f"intermediate_size {config.intermediate_size}")
    if why is not None:
        raise ValueError(
            f"MiniMax-M3: fuse_shared_expert cannot be used: {why}. Drop "
            "fuse_shared_expert from --hf-overrides to use the separate shared expert."
        )


def _local_kv_heads(total_kv: int) -> tuple[int, int]:
    """(first KV/index head, count) held by this TP rank."""
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    if tp <= total_kv:
        n = total_kv // tp
        return rank * n, n
    return rank // (tp // total_kv), 1  # KV heads replicated


class MiniMaxM3Attention(nn.Module):
    def __init__(
        self,
        config,
        layer_idx: int,
        sparse: bool,
        cache_config: CacheConfig | None,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.head_dim = hd = config.head_dim
        total_heads, total_kv = config.num_attention_heads, config.num_key_value_heads
        if total_heads % tp or (tp > total_kv and tp % total_kv) or (
            tp <= total_kv and total_kv % tp
        ):
            raise ValueError(
                f"MiniMax-M3: tensor parallel size {tp} does not fit "
                f"{total_heads} query / {total_kv} KV heads."
            )
        self.num_heads = total_heads // tp
        self.kv_start, self.num_kv_heads = _local_kv_heads(total_kv)
        self.q_size = self.num_heads * hd
        self.kv_size = self.num_kv_heads * hd
        scale = hd**-0.5
        eps = config.rms_norm_eps
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            hd,
            total_heads,
            total_kv,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            total_heads * hd,
            config.hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.q_norm = GemmaRMSNorm(hd, eps=eps)
        self.k_norm = GemmaRMSNorm(hd, eps=eps)
        rope = dict(config.rope_parameters or {})
        rope.setdefault("rope_type", "default")
        self.rotary_dim = int(hd * rope.get("partial_rotary_factor", 1.0))
        max_pos = config.max_position_embeddings
        self.rotary_emb = get_rope(
            hd, max_pos, is_neox_style=True, rope_parameters=rope
        )
        self.sparse = sparse
        if not sparse:
            self.attn = Attention(
                self.num_heads,
                hd,
                scale,
                num_kv_heads=self.num_kv_heads,
                cache_config=cache_config,
                quant_config=quant_config,
                prefix=f"{prefix}.attn",
            )
            return
        self.index_heads = config.index_n_heads
        self.index_dim = idim = config.index_head_dim
        # Small projections: replicated; each rank keeps the index heads of
        # its own KV heads (index head h selects for KV head h).
        self.index_q_proj = ReplicatedLinear(
            config.hidden_size,
            self.index_heads * idim,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.index_q_proj",
        )
        self.index_k_proj = ReplicatedLinear(
            config.hidden_size,
            idim,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.index_k_proj",
        )
        self.index_q_norm = GemmaRMSNorm(idim, eps=eps)
        self.index_k_norm = GemmaRMSNorm(idim, eps=eps)
        idx_rope = {
            "rope_type": "default",
            "rope_theta": rope.get("rope_theta", 10000.0),
            "rope_dim": self.rotary_dim,
        }
        self.index_rotary_emb = get_rope(
            idim, max_pos, is_neox_style=True, rope_parameters=idx_rope
        )
        self.attn = MiniMaxM3SparseAttention(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=hd,
            index_dim=idim,
            scale=scale,
            sparse_block=config.index_block_size,
            topk_blocks=config.index_topk_blocks,
            local_blocks=config.index_local_blocks,
            init_blocks=getattr(config, "index_init_blocks", 0) or 0,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
            kv_scales=kv_scale_mode(config, _top_config()),
            fp8_index_cache=index_cache_dtype(config, _top_config()) == "fp8",
        )

    def _head_norm(self, x: torch.Tensor, norm: nn.Module, dim: int) -> torch.Tensor:
        n = x.shape[0]
        return norm(x.reshape(n, -1, dim)).reshape(n, -1)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self._head_norm(q, self.q_norm, self.head_dim)
        k = self._head_norm(k, self.k_norm, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        if not self.sparse:
            out = self.attn(q, k, v)
        else:
            iq, _ = self.index_q_proj(hidden)
            ik, _ = self.index_k_proj(hidden)
            iq = self._head_norm(iq, self.index_q_norm, self.index_dim)
            ik = self._head_norm(ik, self.index_k_norm, self.index_dim)
            iq, ik = self.index_rotary_emb(positions, iq, ik)
            n = iq.shape[0]
            iq = iq.view(n, self.index_heads, self.index_dim)
            iq = iq[:, self.kv_start : self.kv_start + self.num_kv_heads]
            out = self.attn(q, k, v, iq.contiguous(), ik.contiguous())
        out, _ = self.o_proj(out)
        return out
