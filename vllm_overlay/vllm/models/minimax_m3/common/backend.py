# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Attention backends for MiniMax-M3 sparse (MSA) layers.

* ``MiniMaxM3SparseBackend``: K/V pages of a sparse layer; its Impl writes
  K/V and index keys into the paged caches, selects blocks and runs the
  block-sparse attention.
* ``MiniMaxM3IndexerBackend``: the index-key pages of a sparse layer (a layer
  of its own in vLLM's KV cache, same block table as K/V).

Both use the same metadata: per query token its request and absolute
position, which is all the ops in ``sparse_ops`` need next to the block table.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec

from . import sparse_ops

logger = init_logger(__name__)


def select_sparse_ops(device: torch.device):
    """THE dispatch point between the torch reference and the Triton ops.

    On CUDA/ROCm the Triton kernels are used when
    ``vllm.models.minimax_m3.common.triton_ops`` imports; everywhere else
    (CPU) the PyTorch reference in ``sparse_ops`` runs.
    Returns ``(index_block_topk, block_sparse_attention)``.
    """
    if device.type == "cuda":
        try:
            from vllm.models.minimax_m3.common import triton_ops  # noqa: F401

            return triton_ops.index_block_topk, triton_ops.block_sparse_attention
        except ImportError:
            logger.warning_once(
                "MiniMax-M3: Triton MSA ops unavailable; using the PyTorch "
                "reference sparse attention (slow)."
            )
    return sparse_ops.index_block_topk, sparse_ops.block_sparse_attention


@dataclass
class MiniMaxM3SparseMetadata:
    num_actual_tokens: int
    block_table: torch.Tensor  # [R, max_pages] int32
    token_req: torch.Tensor  # [T] int32
    token_pos: torch.Tensor  # [T] int32
    seq_lens: torch.Tensor  # [R] int32
    slot_mapping: torch.Tensor  # [T] int64, -1 for padding


class MiniMaxM3SparseMetadataBuilder(AttentionMetadataBuilder[MiniMaxM3SparseMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> MiniMaxM3SparseMetadata:
        cm = common_attn_metadata
        T = cm.num_actual_tokens
        R = cm.num_reqs
        qsl = cm.query_start_loc[: R + 1]
        q_lens = qsl[1:] - qsl[:-1]
        seq_lens = cm.seq_lens[:R]
        reqs = torch.arange(R, device=qsl.device, dtype=torch.int32)
        token_req = torch.repeat_interleave(reqs, q_lens, output_size=T)
        offs = torch.arange(T, device=qsl.device, dtype=torch.int32)
        offs = offs - qsl[:-1][token_req.long()]
        start = (seq_lens - q_lens)[token_req.long()]
        return MiniMaxM3SparseMetadata(
            num_actual_tokens=T,
            block_table=cm.block_table_tensor[:R],
            token_req=token_req.to(torch.int32),
            token_pos=(start + offs).to(torch.int32),
            seq_lens=seq_lens.to(torch.int32),
            slot_mapping=cm.slot_mapping[:T],
        )


class _MiniMaxM3BackendBase(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ]

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @staticmethod
    def get_builder_cls() -> type[MiniMaxM3SparseMetadataBuilder]:
        return MiniMaxM3SparseMetadataBuilder

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size > 0

    @staticmethod
    def use_cascade_attention(*args, **kwargs) -> bool:
        return False


class MiniMaxM3SparseBackend(_MiniMaxM3BackendBase):
    supported_kv_cache_dtypes: ClassVar[list] = [
        "auto",
        "bfloat16",
        "float16",
        "fp8",
        "fp8_e4m3",
    ]

    @staticmethod
    def get_name() -> str:
        return "MINIMAX_M3_SPARSE_REF"

    @staticmethod
    def get_impl_cls() -> type["MiniMaxM3SparseImpl"]:
        return MiniMaxM3SparseImpl

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        return (num_blocks, 2, block_size, num_kv_heads, head_size)


class MiniMaxM3IndexerBackend(_MiniMaxM3BackendBase):
    @staticmethod
    def get_name() -> str:
        return "MINIMAX_M3_INDEXER_REF"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("The index-K cache has no attention impl.")

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        assert num_kv_heads == 1
        return (num_blocks, block_size, head_size)


def _write_pages(cache_tok: torch.Tensor, x: torch.Tensor, slots: torch.Tensor):
    """cache_tok: [num_pages, page_size, ...]; write x[i] at slots[i] (>= 0)."""
    valid = slots >= 0
    if not bool(valid.all()):
        x, slots = x[valid], slots[valid]
    page_size = cache_tok.shape[1]
    slots = slots.long()
    cache_tok[slots // page_size, slots % page_size] = x.to(cache_tok.dtype)


class MiniMaxM3SparseImpl(AttentionImpl[MiniMaxM3SparseMetadata]):
    """Block-sparse GQA attention with a lightning-indexer block selection."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap=None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name=None,
        *,
        sparse_block: int,
        topk_blocks: int,
        local_blocks: int = 1,
        init_blocks: int = 0,
    ) -> None:
        self.fp8 = kv_cache_dtype in ("fp8", "fp8_e4m3")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.sparse_block = sparse_block
        self.topk_blocks = topk_blocks
        self.local_blocks = local_blocks
        self.init_blocks = init_blocks
        self._ops = None

    def forward(  # type: ignore[override]
        self,
        layer,
        q: torch.Tensor,  # [N, Hq, D]
        k: torch.Tensor,  # [N, Hkv, D]
        v: torch.Tensor,  # [N, Hkv, D]
        idx_q: torch.Tensor,  # [N, Hkv, Didx]
        idx_k: torch.Tensor,  # [N, Didx]
        kv_cache: torch.Tensor,  # [P, 2, page, Hkv, D]
        idx_cache: torch.Tensor,  # [P, page, Didx]
        md: MiniMaxM3SparseMetadata,
        output: torch.Tensor,  # [N, Hq, D]
    ) -> torch.Tensor:
        T = md.num_actual_tokens
        page_size = kv_cache.shape[2]
        if self.sparse_block % page_size:
            raise ValueError(
                f"MiniMax-M3: KV cache page size {page_size} must divide the "
                f"sparse block size {self.sparse_block}; pass --block-size "
                f"{min(self.sparse_block, 128)} (or another divisor)."
            )
        if self._ops is None:
            self._ops = select_sparse_ops(q.device)
        index_block_topk, block_sparse_attention = self._ops
        slots = md.slot_mapping
        mode, k_scale, v_scale = 0, None, None
        if self.fp8:  # scalar scales: cache holds x / scale in e4m3
            mode, k_scale, v_scale = 1, layer._k_scale, layer._v_scale
            fmax = torch.finfo(torch.float8_e4m3fn).max
            k = (k.float() / k_scale).clamp(-fmax, fmax)
            v = (v.float() / v_scale).clamp(-fmax, fmax)
        _write_pages(kv_cache[:, 0], k[:T], slots)
        _write_pages(kv_cache[:, 1], v[:T], slots)
        _write_pages(idx_cache, idx_k[:T], slots)
        topk = index_block_topk(
            idx_q[:T],
            idx_cache,
            md.block_table,
            md.token_req,
            md.token_pos,
            self.sparse_block,
            self.topk_blocks,
            self.local_blocks,
            self.init_blocks,
        )
        out = block_sparse_attention(
            q[:T],
            kv_cache,
            md.block_table,
            md.token_req,
            md.token_pos,
            topk,
            self.sparse_block,
            self.scale,
            mode,
            k_scale,
            v_scale,
            None,
        )
        output[:T] = out
        return output
