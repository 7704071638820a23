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

from collections.abc import Callable
from typing import NamedTuple

import torch

from vllm.logger import init_logger

from . import sparse_ops

logger = init_logger(__name__)


class SparseOps(NamedTuple):
    """The three device ops of a sparse layer (same signatures on every path)."""

    write_cache: Callable  # write_sparse_cache(k, v, idx_k, kv_cache, idx_cache, slots, ks, vs)
    index_block_topk: Callable
    block_sparse_attention: Callable
    triton: bool


def select_sparse_ops(device: torch.device) -> SparseOps:
    """THE dispatch point between the torch reference and the Triton ops.

    On CUDA/ROCm the Triton kernels are used when
    ``vllm.models.minimax_m3.common.triton_ops`` imports; everywhere else
    (CPU) the PyTorch reference in ``sparse_ops`` runs.
    """
    if device.type == "cuda":
        try:
            from vllm.models.minimax_m3.common import triton_ops

            return SparseOps(
                triton_ops.write_sparse_cache,
                triton_ops.index_block_topk,
                triton_ops.block_sparse_attention,
                True,
            )
        except ImportError:
            logger.warning_once(
                "MiniMax-M3: Triton MSA ops unavailable; using the PyTorch "
                "reference sparse attention (slow, not CUDA-graph capturable)."
            )
    return SparseOps(
        sparse_ops.write_sparse_cache,
        sparse_ops.index_block_topk,
        sparse_ops.block_sparse_attention,
        False,
    )


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
