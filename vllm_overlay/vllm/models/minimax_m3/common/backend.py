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
from vllm.v1.attention.backends.utils import split_decodes_and_prefills
from vllm.v1.kv_cache_interface import AttentionSpec

from . import dense_prefix, envs, sparse_ops
from .kv_scale import KVScales, KVScaleMode
from .msa_ops import SparseOps, select_sparse_ops, token_request_positions  # noqa: F401

logger = init_logger(__name__)


@dataclass
class MiniMaxM3SparseMetadata:
    num_actual_tokens: int
    block_table: torch.Tensor  # [R, max_pages] int32
    token_req: torch.Tensor  # [T] int32
    token_pos: torch.Tensor  # [T] int32
    seq_lens: torch.Tensor  # [R] int32
    slot_mapping: torch.Tensor  # [T] int64, -1 for padding
    # decode tokens come first (reorder_batch_threshold = 1); only picks the
    # Triton indexer's path, both paths give the same selection
    num_decode_tokens: int = 0
    # longest request of the batch (host int; picks the prefill launch shape)
    max_seq_len: int = 0
    # prefill chunks of at least VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS tokens (host ints;
    # the Impl attends their tokens below its dense limit densely)
    prefill_chunks: tuple[dense_prefix.PrefillChunk, ...] = ()


class MiniMaxM3SparseMetadataBuilder(AttentionMetadataBuilder[MiniMaxM3SparseMetadata]):
    """Per-token request index and absolute position, in persistent buffers.

    CUDA graphs: FULL graphs for uniform batches (decode), PIECEWISE (the
    sparse op runs eagerly between graph pieces) for everything else. The
    metadata lives in buffers allocated once here, so a captured graph reads
    each step's values at stable addresses; no kernel launch shape depends on
    their values. ``build`` derives the token layout on the device from
    ``query_start_loc`` and ``seq_lens`` (the CPU offsets only choose the
    indexer's decode path, which does not change results);
    ``build_for_cudagraph_capture`` derives it from the uniform batch shape,
    so it stays valid when another backend's builder rewrote the shared
    offsets during capture (the bug class of vllm#51585). Tokens past the last
    request (padding of a graph batch) get request 0, position 0 and a -1
    slot: they read a valid page, write nothing, and the runner drops them.
    """

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    reorder_batch_threshold: int | None = 1

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        sched = vllm_config.scheduler_config
        capture = vllm_config.compilation_config.max_cudagraph_capture_size or 0
        self.max_tokens = max(sched.max_num_batched_tokens, capture)
        self._arange = torch.arange(self.max_tokens, dtype=torch.int32, device=device)
        self._token_req = torch.zeros(self.max_tokens, dtype=torch.int32, device=device)
        self._token_pos = torch.zeros(self.max_tokens, dtype=torch.int32, device=device)
        self.dense_prefix_min_tokens = envs.VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS
        if envs.VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE and device.type == "cuda":
            # the fused kernels' arrival counters must exist before graph capture
            try:
                from vllm.models.minimax_m3.common.triton_ops import arrival_counters
            except ImportError:  # no Triton: the reference ops need none
                pass
            else:
                arrival_counters(device, "index_select", self.max_tokens)
                arrival_counters(device, "attention_merge",
                                 self.max_tokens * kv_cache_spec.num_kv_heads)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> MiniMaxM3SparseMetadata:
        cm = common_attn_metadata
        T, R = self._check_size(cm)
        token_req, token_pos = token_request_positions(
            cm.query_start_loc[: R + 1], cm.seq_lens[:R], self._arange[:T]
        )
        _, _, num_decode_tokens, _ = split_decodes_and_prefills(cm, decode_threshold=1)
        md = self._metadata(cm, token_req, token_pos, num_decode_tokens, int(cm.max_seq_len))
        seq_lens = cm.seq_lens_cpu_upper_bound  # exact for prefill rows
        md.prefill_chunks = dense_prefix.long_prefill_chunks(
            cm.query_start_loc_cpu[: R + 1], None if seq_lens is None else seq_lens[:R],
            self.dense_prefix_min_tokens)
        return md

    def build_for_cudagraph_capture(
        self, common_attn_metadata: CommonAttentionMetadata
    ) -> MiniMaxM3SparseMetadata:
        """Capture builds only uniform batches (R requests x q tokens), so the
        token layout follows from the shape alone. It does not read the query
        offsets, which a builder that ran before this one may have zeroed for
        its own capture (both copies, in v0.23.0's ROCm builder)."""
        cm = common_attn_metadata
        T, R = self._check_size(cm)
        q = cm.max_query_len
        if q < 1 or R * q != T:
            raise RuntimeError(
                "MiniMax-M3 sparse attention: CUDA-graph capture expects a "
                f"uniform batch, got {T} tokens for {R} requests with "
                f"max_query_len {q}; capture only uniform decode batches "
                '(e.g. --compilation-config \'{"cudagraph_mode": '
                '"FULL_AND_PIECEWISE"}\') or run with --enforce-eager.'
            )
        tokens = self._arange[:T]
        req = (tokens // q).long()
        pos = cm.seq_lens[:R].to(torch.int32)[req] - q + tokens % q
        token_req, token_pos = req.to(torch.int32), pos.clamp(min=0).to(torch.int32)
        # max_seq_len 0: a captured graph keeps one token per program (the
        # context length of later replays is unknown here)
        return self._metadata(cm, token_req, token_pos, T if q == 1 else 0, 0)

    def _check_size(self, cm: CommonAttentionMetadata) -> tuple[int, int]:
        if cm.num_actual_tokens > self.max_tokens:
            raise ValueError(
                f"MiniMax-M3 sparse attention: a batch of {cm.num_actual_tokens} "
                f"tokens exceeds the {self.max_tokens} this backend was sized "
                "for (max_num_batched_tokens)."
            )
        return cm.num_actual_tokens, cm.num_reqs

    def _metadata(self, cm, token_req, token_pos, num_decode_tokens, max_seq_len):
        T, R = cm.num_actual_tokens, cm.num_reqs
        self._token_req[:T].copy_(token_req)
        self._token_pos[:T].copy_(token_pos)
        return MiniMaxM3SparseMetadata(
            num_actual_tokens=T,
            block_table=cm.block_table_tensor[:R],
            token_req=self._token_req[:T],
            token_pos=self._token_pos[:T],
            seq_lens=cm.seq_lens[:R],
            slot_mapping=cm.slot_mapping[:T],
            num_decode_tokens=num_decode_tokens,
            max_seq_len=max_seq_len,
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
        # what runs: the MSA ops of ``select_sparse_ops`` (Triton kernels on
        # CUDA/ROCm, the PyTorch reference on CPU)
        return "MINIMAX_M3_MSA"

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
        return "MINIMAX_M3_MSA_INDEXER"

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
        kv_scales: KVScaleMode = KVScaleMode.SCALAR,
    ) -> None:
        self.fp8 = kv_cache_dtype in ("fp8", "fp8_e4m3")
        # kv_scales: the model's FP8 scheme; the layer's own mode is NONE off FP8
        self.kv_scale_mode = KVScaleMode(kv_scales).for_layer(self.fp8)
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.sparse_block = sparse_block
        self.topk_blocks = topk_blocks
        self.local_blocks = local_blocks
        self.init_blocks = init_blocks
        # the knobs (common/envs.py), read once per layer
        self.fold_scalar_scales = envs.VLLM_MINIMAX_M3_FOLD_KV_SCALE
        self.one_launch = envs.VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE
        self.score_attend = envs.VLLM_MINIMAX_M3_SCORE_ATTEND_DECODE and not self.one_launch
        self.prefill_token_tile = envs.VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE
        self.prefill_block_major = envs.VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR
        self.dense_prefix_min_tokens = envs.VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS
        self._ops: SparseOps | None = None

    def forward(  # type: ignore[override]
        self,
        layer,
        q: torch.Tensor,  # [N, Hq, D]
        k: torch.Tensor,  # [N, Hkv, D]
        v: torch.Tensor,  # [N, Hkv, D]
        idx_q: torch.Tensor,  # [N, Hkv, Didx]
        idx_k: torch.Tensor,  # [N, Didx]
        kv_cache: torch.Tensor,  # [P, 2, page, Hkv, D]
        idx_cache: torch.Tensor,  # [P, page, Didx] (fp8: Didx + 4, keys then scales per page)
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
        ops = self._ops
        scales = KVScales()
        if self.kv_scale_mode is KVScaleMode.PER_TOKEN_HEAD:
            # each fp8 row [head_size] is followed by its float32 scale (the
            # row padding, attention.KV_SCALE_PAD); the cache holds x / scale
            D = self.head_size
            scales = KVScales(KVScaleMode.PER_TOKEN_HEAD, per_token_head=kv_cache[
                ..., D : D + 4].view(torch.float32).squeeze(-1))
            kv_cache = kv_cache[..., :D]
        elif self.kv_scale_mode is KVScaleMode.SCALAR:  # the cache holds x / scale in e4m3
            scales = KVScales(KVScaleMode.SCALAR, k=layer._k_scale, v=layer._v_scale)
        mode, k_scale, v_scale, kv_scales = scales.args()
        idx_scales = None
        if idx_cache.dtype in sparse_ops.FP8_DTYPES:
            # fp8 index keys: each page holds its keys, then their float32 scales
            idx_cache, idx_scales = sparse_ops.fp8_index_cache_views(
                idx_cache, idx_k.shape[-1])
        ops.write_cache(
            k[:T], v[:T], idx_k[:T], kv_cache, idx_cache, md.slot_mapping,
            k_scale, v_scale, kv_scales, idx_scales=idx_scales,
        )
        if ops.triton and self._takes_score_attend(md, page_size, q.device):
            from vllm.models.minimax_m3.common.triton_ops import score_attend_decode

            output[:T] = score_attend_decode(
                idx_q[:T], idx_cache, q[:T], kv_cache, md.block_table, md.token_req,
                md.token_pos, self.sparse_block, self.topk_blocks, self.local_blocks,
                self.init_blocks, self.scale, mode, k_scale, v_scale, kv_scales,
                idx_k_scales=idx_scales, fold_scalar_scales=self.fold_scalar_scales)
            return output
        spans = ()
        if md.prefill_chunks and self.dense_prefix_min_tokens:
            spans = dense_prefix.dense_spans(md.prefill_chunks,
                                             self.topk_blocks * self.sparse_block,
                                             self.dense_prefix_min_tokens)
        scales = scales.args()
        if not spans:
            self._sparse(ops, md, 0, (), q, idx_q, idx_cache, idx_scales, kv_cache, scales,
                         out=output[:T])
            return output
        dense_prefix.attend_with_dense_prefix(
            dense_prefix.SIDE_STREAM, output, T, md.num_decode_tokens, spans,
            lambda: dense_prefix.dense_prefix_attention(
                q, kv_cache, md.block_table, spans, self.scale, *scales),
            lambda first, cleared, out: self._sparse(
                ops, md, first, cleared, q, idx_q, idx_cache, idx_scales, kv_cache, scales,
                out=out),
        )
        return output

    def _sparse(self, ops: SparseOps, md: MiniMaxM3SparseMetadata, first: int,
                cleared: tuple, q, idx_q, idx_cache, idx_scales, kv_cache,
                scales: tuple, out: torch.Tensor) -> None:
        """Index + top-k, then block-sparse attention, of the batch's tokens
        ``first ..`` into ``out``; the ``cleared`` spans' tokens get no
        selected block (they are attended densely; their rows of ``out`` are
        garbage)."""
        T = md.num_actual_tokens
        mode, k_scale, v_scale, kv_scales = scales
        token_req, token_pos = md.token_req[first:], md.token_pos[first:]
        topk = ops.index_block_topk(
            idx_q[first:T],
            idx_cache,
            md.block_table,
            token_req,
            token_pos,
            self.sparse_block,
            self.topk_blocks,
            self.local_blocks,
            self.init_blocks,
            idx_k_scales=idx_scales,
            **({"num_decode_tokens": md.num_decode_tokens,
                "fused_select": self.one_launch} if ops.triton else {}),
        )
        for span in cleared:
            topk[span.token_start - first : span.token_start - first + span.num_tokens] = -1
        if not ops.triton:  # the reference ops return a new tensor
            out.copy_(ops.block_sparse_attention(
                q[first:T], kv_cache, md.block_table, token_req, token_pos, topk,
                self.sparse_block, self.scale, mode, k_scale, v_scale, kv_scales))
            return
        ops.block_sparse_attention(
            q[first:T],
            kv_cache,
            md.block_table,
            token_req,
            token_pos,
            topk,
            self.sparse_block,
            self.scale,
            mode,
            k_scale,
            v_scale,
            kv_scales,
            fold_scalar_scales=self.fold_scalar_scales,
            fused_merge=self.one_launch,
            **self._prefill_layout(md, mode != 0, T - first - md.num_decode_tokens),
            tile_start=md.num_decode_tokens,
            out=out,
        )

    def _takes_score_attend(self, md: MiniMaxM3SparseMetadata, page_size: int,
                            device: torch.device) -> bool:
        """A decode-only batch that ``score_attend_fits`` (static sizes: a
        captured graph keeps its path)."""
        from vllm.models.minimax_m3.common.triton_ops import score_attend_fits
        from vllm.models.minimax_m3.common.triton_ops._utils import num_sms

        T = md.num_actual_tokens
        max_blocks = -(-md.block_table.shape[1] * page_size // self.sparse_block)
        return (self.score_attend and md.num_decode_tokens >= T
                and score_attend_fits(T, self.num_kv_heads, max_blocks, num_sms(device)))

    def _prefill_layout(self, md: MiniMaxM3SparseMetadata, kv_fp8: bool,
                        num_prefill: int | None = None) -> dict:
        """The Triton attention's layout for the batch's prefill tokens
        (``token_tile`` / ``block_major`` keyword arguments; decode-only
        batches: one token per program).  An environment setting wins:
        block-major first, then the token tile; unset, the measured rule."""
        from vllm.models.minimax_m3.common.triton_ops import (default_prefill_layout,
                                                              default_prefill_token_tile)
        if num_prefill is None:  # every prefill token of the batch
            num_prefill = md.num_actual_tokens - md.num_decode_tokens
        if num_prefill <= 0:
            return dict(token_tile=0, block_major=0)
        if self.prefill_block_major:
            return dict(token_tile=0, block_major=self.prefill_block_major)
        if self.prefill_token_tile is not None:
            return dict(token_tile=self.prefill_token_tile, block_major=0)
        if self.prefill_block_major == 0:  # block-major turned off: token tiles by rule
            return dict(token_tile=default_prefill_token_tile(
                md.max_seq_len, self.sparse_block, self.topk_blocks, kv_fp8), block_major=0)
        return default_prefill_layout(num_prefill, md.max_seq_len, self.sparse_block, self.topk_blocks,
                                      kv_fp8)
