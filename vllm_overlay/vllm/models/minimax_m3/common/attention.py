# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV-cache layers of a MiniMax-M3 sparse (MSA) attention layer.

``MiniMaxM3IndexKCache`` holds the index keys in vLLM's paged KV cache as a
layer of its own (spec + backend, same block table as K/V), like
``DeepseekV32IndexerCache``. ``MiniMaxM3SparseAttention`` owns the K/V pages
and runs the backend Impl inside one opaque custom op.
"""

import torch
from torch import nn

from vllm.config import CacheConfig, VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec, MLAAttentionSpec

from .backend import MiniMaxM3IndexerBackend, MiniMaxM3SparseBackend
from .kv_scale import CONFIG_NAMES as KV_SCALE_CONFIG_NAMES
from .kv_scale import KVScaleMode
from .sparse_ops import FP8_DTYPES, INDEX_SCALE_BYTES


def _skips_kv_quant(cache_config: CacheConfig | None, prefix: str) -> bool:
    """``--kv-cache-dtype-skip-layers``: this layer's index is listed (as for
    vLLM's Attention; "sliding_window" never names an MSA layer)."""
    from vllm.model_executor.models.utils import extract_layer_index

    skip = cache_config.kv_cache_dtype_skip_layers if cache_config else None
    return bool(skip) and str(extract_layer_index(prefix)) in skip


def _layer_kv_cache_dtype(cache_config: CacheConfig | None, prefix: str) -> str:
    """The KV cache dtype of the sparse layer ``prefix``: the engine's, or
    "auto" (model dtype) when the layer is in the skip list."""
    if cache_config is None or _skips_kv_quant(cache_config, prefix):
        return "auto"
    return cache_config.cache_dtype


def fp8_cache_dtype() -> torch.dtype:
    """The FP8 e4m3 dtype of the sparse layers' caches: the platform's
    (``float8_e4m3fnuz`` on MI300X / MI325X, gfx942; OCP ``float8_e4m3fn``
    on NVIDIA and MI355X, gfx950)."""
    from vllm.platforms import current_platform

    return current_platform.fp8_dtype()


def _sparse_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype):
    """K/V cache dtype of a sparse layer: the model dtype or FP8 e4m3
    (``fp8_cache_dtype``)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in ("bfloat16", "float16", "float32"):
        return getattr(torch, kv_cache_dtype)
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return fp8_cache_dtype()
    raise NotImplementedError(
        f"MiniMax-M3 sparse layers do not support kv_cache_dtype="
        f"{kv_cache_dtype!r}; use auto, fp8 or fp8_e4m3."
    )


# Per (token, KV head) FP8 scales live in each K/V row's padding: an fp8 row
# of head_size values is followed by this many bytes, the first 4 of which hold
# the row's float32 dequantisation scale (16 keeps rows 16-byte aligned).
KV_SCALE_PAD = 16


def _model_option(config, top_config, name: str, choices: tuple, default: str) -> str:
    """Option ``name`` of the text config, else of the top-level config (flat
    ``--hf-overrides`` land there), else ``default``; one of ``choices``."""
    val = getattr(config, name, None)
    if val is None and top_config is not None:
        val = getattr(top_config, name, None)
    val = default if val is None else val
    if val not in choices:
        raise ValueError(f"MiniMax-M3: {name} must be one of {choices}, got {val!r}.")
    return val


def kv_scale_mode(config, top_config=None) -> KVScaleMode:
    """``msa_kv_cache_scales``: how an FP8 KV cache of the sparse layers is
    scaled -- ``scalar`` (default; one k/v scale per layer, from the
    checkpoint or 1.0) or ``per_token_head`` (computed when K/V are written)."""
    return KVScaleMode.from_config(_model_option(
        config, top_config, "msa_kv_cache_scales", tuple(KV_SCALE_CONFIG_NAMES), "scalar"))


INDEX_CACHE_DTYPES = ("auto", "fp8")


def index_cache_dtype(config, top_config=None) -> str:
    """``msa_index_cache_dtype``: ``auto`` (default; index keys in the model
    dtype) or ``fp8`` (e4m3 with one float32 scale per token, computed when
    the key is written: index_dim + 4 bytes per token, about half the bytes of
    the index scan at long context)."""
    return _model_option(config, top_config, "msa_index_cache_dtype", INDEX_CACHE_DTYPES, "auto")


def _register_layer(prefix: str, layer: nn.Module) -> None:
    ctx = get_current_vllm_config().compilation_config.static_forward_context
    if prefix in ctx:
        raise ValueError(f"Duplicate layer name: {prefix}")
    ctx[prefix] = layer


class MiniMaxM3IndexKCache(nn.Module, AttentionLayerBase):
    """Paged index-key cache: [num_pages, page_size, index_dim] in the model
    dtype, or with ``fp8``: [num_pages, page_size, index_dim + 4] e4m3, each
    page its keys then their float32 scales
    (``sparse_ops.fp8_index_cache_views``)."""

    def __init__(
        self, index_dim: int, dtype: torch.dtype, prefix: str, cache_config: CacheConfig,
        fp8: bool = False,
    ):
        super().__init__()
        self.kv_cache = torch.tensor([])
        self.index_dim = index_dim
        self.head_dim = index_dim + (INDEX_SCALE_BYTES if fp8 else 0)
        self.dtype = fp8_cache_dtype() if fp8 else dtype
        self.prefix = prefix
        self.cache_config = cache_config
        _register_layer(prefix, self)

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        # One vector per token (no separate V), like the DeepSeek indexer.
        return MLAAttentionSpec(
            block_size=self.cache_config.block_size,
            num_kv_heads=1,
            head_size=self.head_dim,
            dtype=self.dtype,
        )

    def get_attn_backend(self):
        return MiniMaxM3IndexerBackend

    def forward(self): ...


class MiniMaxM3SparseAttention(nn.Module, AttentionLayerBase):
    """K/V pages + indexer-selected block-sparse attention of one layer."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        index_dim: int,
        scale: float,
        sparse_block: int,
        topk_blocks: int,
        local_blocks: int,
        init_blocks: int,
        cache_config: CacheConfig,
        prefix: str,
        kv_scales: KVScaleMode = KVScaleMode.SCALAR,
        fp8_index_cache: bool = False,
    ):
        super().__init__()
        self.layer_name = prefix
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.cache_config = cache_config
        self.kv_cache_dtype = _layer_kv_cache_dtype(cache_config, prefix)
        self.dtype = torch.get_default_dtype()
        self.cache_torch_dtype = _sparse_cache_dtype(self.kv_cache_dtype, self.dtype)
        per_token_head = kv_scales is KVScaleMode.PER_TOKEN_HEAD
        if per_token_head and _skips_kv_quant(cache_config, prefix):
            per_token_head = False  # this layer keeps a model-dtype cache
        if per_token_head and self.cache_torch_dtype not in FP8_DTYPES:
            raise ValueError(
                "MiniMax-M3: msa_kv_cache_scales='per_token_head' scales an FP8 "
                f"KV cache; pass --kv-cache-dtype fp8 (got {self.kv_cache_dtype!r})."
            )
        # K/V rows in the cache: head_size values, plus the scale padding
        self.cache_head_size = head_size + (KV_SCALE_PAD if per_token_head else 0)
        # Scalar FP8 KV scales: 1.0 unless the checkpoint has k/v scales, which
        # load_weights copies in place (keep them registered float32 scalars:
        # the kernels and captured CUDA graphs read them by address).
        self.register_buffer("_k_scale", torch.ones((), dtype=torch.float32))
        self.register_buffer("_v_scale", torch.ones((), dtype=torch.float32))
        block_size = cache_config.block_size if cache_config else None
        if block_size is not None and sparse_block % block_size:
            raise ValueError(
                f"MiniMax-M3: KV cache block size {block_size} must divide the "
                f"sparse attention block size {sparse_block} (index_block_size); "
                f"pass --block-size {min(sparse_block, 128)} or another divisor "
                "of it."
            )
        self.impl = MiniMaxM3SparseBackend.get_impl_cls()(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            kv_cache_dtype=self.kv_cache_dtype,
            sparse_block=sparse_block,
            topk_blocks=topk_blocks,
            local_blocks=local_blocks,
            init_blocks=init_blocks,
            kv_scales=KVScaleMode.PER_TOKEN_HEAD if per_token_head else KVScaleMode.SCALAR,
        )
        self.kv_cache = torch.tensor([])
        _register_layer(prefix, self)
        if fp8_index_cache and index_dim % INDEX_SCALE_BYTES:
            raise ValueError(
                f"MiniMax-M3: an fp8 index-key cache needs index_head_dim divisible "
                f"by {INDEX_SCALE_BYTES} (a page holds its keys, then their float32 "
                f"scales), got {index_dim}."
            )
        self.index_cache = MiniMaxM3IndexKCache(
            index_dim, self.dtype, f"{prefix}.index_k_cache", cache_config, fp8_index_cache
        )

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        return FullAttentionSpec(
            block_size=self.cache_config.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.cache_head_size,
            dtype=self.cache_torch_dtype,
        )

    def get_attn_backend(self):
        return MiniMaxM3SparseBackend

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        idx_q: torch.Tensor,
        idx_k: torch.Tensor,
    ) -> torch.Tensor:
        n = q.shape[0]
        output = torch.zeros(
            n, self.num_heads * self.head_size, dtype=q.dtype, device=q.device
        )
        torch.ops.vllm.minimax_m3_sparse_attention(
            q.view(n, self.num_heads, self.head_size),
            k.view(n, self.num_kv_heads, self.head_size),
            v.view(n, self.num_kv_heads, self.head_size),
            idx_q.view(n, self.num_kv_heads, -1),
            idx_k.view(n, -1),
            output.view(n, self.num_heads, self.head_size),
            self.layer_name,
        )
        return output


def _sparse_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx_q: torch.Tensor,
    idx_k: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    ctx = get_forward_context()
    md = ctx.attn_metadata
    if isinstance(md, list):
        md = md[0]
    if isinstance(md, dict):
        md = md.get(layer_name)
    if md is None:  # profiling / dummy run without metadata
        return
    layer: MiniMaxM3SparseAttention = ctx.no_compile_layers[layer_name]
    layer.impl.forward(
        layer,
        q,
        k,
        v,
        idx_q,
        idx_k,
        layer.kv_cache,
        layer.index_cache.kv_cache,
        md,
        output,
    )


def _sparse_attention_fake(q, k, v, idx_q, idx_k, output, layer_name) -> None:
    return None


direct_register_custom_op(
    op_name="minimax_m3_sparse_attention",
    op_func=_sparse_attention_op,
    mutates_args=["output"],
    fake_impl=_sparse_attention_fake,
)
