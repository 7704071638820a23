# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The MSA ops of a sparse layer, and the token layout they take.

``select_sparse_ops`` is the one dispatch point between the Triton kernels
(``triton_ops``, CUDA/ROCm) and the PyTorch reference (``sparse_ops``, CPU);
both take every query token's request index and absolute position
(``token_request_positions``) next to the block table. Shared by the
series' own MiniMax-M3 backend and by the series' MSA path inside upstream's
MiniMax-M3 (``series_msa``).
"""

from typing import Any, ClassVar, Protocol

import torch

from vllm.logger import init_logger

from . import sparse_ops
from .kv_scale import KVScaleMode

logger = init_logger(__name__)


class SparseOps(Protocol):
    """The three device ops of a sparse layer: the interface both paths
    implement (``TritonSparseOps``, ``ReferenceSparseOps``). Tensor layouts:
    docs/design/kernels.md, "Layouts and units"."""

    # True: the Triton kernels, which write into ``out=`` and take the launch
    # options (``num_decode_tokens``, ``fused_select``, ``fold_scalar_scales``,
    # ``fused_merge``, ``token_tile``, ``block_major``, ``tile_start``); False: the
    # PyTorch reference, which returns new tensors and takes none of them
    triton: ClassVar[bool]

    def write_cache(self, k: torch.Tensor, v: torch.Tensor, idx_k: torch.Tensor,
                    kv_cache: torch.Tensor, idx_k_cache: torch.Tensor, slots: torch.Tensor,
                    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                    kv_scales: torch.Tensor | None = None, *,
                    idx_scales: torch.Tensor | None = None) -> None:
        """K/V (quantised for an fp8 cache) and index keys into the paged caches
        at ``slots`` (negative: skipped)."""
        ...

    def index_block_topk(self, idx_q: torch.Tensor, idx_k_cache: torch.Tensor,
                         block_table: torch.Tensor, token_req: torch.Tensor,
                         token_pos: torch.Tensor, sparse_block: int, topk: int,
                         local_blocks: int = 1, init_blocks: int = 0, *,
                         idx_k_scales: torch.Tensor | None = None,
                         **launch: Any) -> torch.Tensor:
        """[T, index heads, topk] int32 selected sparse block ids (-1: empty)."""
        ...

    def block_sparse_attention(self, q: torch.Tensor, kv_cache: torch.Tensor,
                               block_table: torch.Tensor, token_req: torch.Tensor,
                               token_pos: torch.Tensor, topk_blocks: torch.Tensor,
                               sparse_block: int, scale: float,
                               kv_scale_mode: KVScaleMode = KVScaleMode.NONE,
                               k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None,
                               kv_scales: torch.Tensor | None = None,
                               **launch: Any) -> torch.Tensor:
        """[T, Hq, D] attention of each token over its selected blocks."""
        ...


class ReferenceSparseOps:
    """``SparseOps`` by the PyTorch reference (``sparse_ops``; CPU)."""

    triton: ClassVar[bool] = False
    write_cache = staticmethod(sparse_ops.write_sparse_cache)
    index_block_topk = staticmethod(sparse_ops.index_block_topk)
    block_sparse_attention = staticmethod(sparse_ops.block_sparse_attention)


class TritonSparseOps:
    """``SparseOps`` by the Triton kernels (``triton_ops``; CUDA/ROCm, or CPU
    under ``TRITON_INTERPRET=1``). Raises ImportError where they do not import."""

    triton: ClassVar[bool] = True

    def __init__(self) -> None:
        from vllm.models.minimax_m3.common import triton_ops

        self.write_cache = triton_ops.write_sparse_cache
        self.index_block_topk = triton_ops.index_block_topk
        self.block_sparse_attention = triton_ops.block_sparse_attention


def select_sparse_ops(device: torch.device) -> SparseOps:
    """THE dispatch point between the torch reference and the Triton ops.

    On CUDA/ROCm the Triton kernels are used when
    ``vllm.models.minimax_m3.common.triton_ops`` imports; everywhere else
    (CPU) the PyTorch reference in ``sparse_ops`` runs.
    """
    if device.type == "cuda":
        try:
            return TritonSparseOps()
        except ImportError:
            logger.warning_once(
                "MiniMax-M3: Triton MSA ops unavailable; using the PyTorch "
                "reference sparse attention (slow, not CUDA-graph capturable)."
            )
    return ReferenceSparseOps()


def token_request_positions(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Request index and absolute position of each token (int32, device ops
    only). Tokens at or past ``query_start_loc[-1]`` (graph padding) get
    request 0 and position 0."""
    ends = query_start_loc[1:].to(torch.int32)
    req = torch.searchsorted(ends, tokens, right=True, out_int32=True)
    valid = req < ends.shape[0]
    req = req.clamp(max=max(ends.shape[0] - 1, 0)).long()
    starts = query_start_loc[:-1].to(torch.int32)
    q_lens = ends - starts
    pos = (seq_lens.to(torch.int32) - q_lens)[req] + (tokens - starts[req])
    zero = torch.zeros_like(tokens)
    return (
        torch.where(valid, req.to(torch.int32), zero),
        torch.where(valid, pos.to(torch.int32), zero),
    )
