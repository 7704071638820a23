# SPDX-License-Identifier: Apache-2.0
"""Triton kernels for MiniMax-M3 sparse attention (MSA), NVIDIA and ROCm.

Public API (same semantics as the PyTorch reference in ``../sparse_ops.py``):
  index_block_topk        index scoring + block top-k   (indexer.py)
  block_sparse_attention  block-sparse GQA attention    (attention.py)
  write_sparse_cache      K/V (+fp8 quant) and index-key cache writes (cache_write.py)
  score_attend_decode     the whole decode step in two launches for batch 1-2 over
                          short block tables (short_decode.py; score_attend_fits)
  launch_overrides        benchmarks only: a block in which an op launches with
                          overridden launch shapes (_utils.py)
Kernels, one concern per module:
  index_score_decode   decode stage 1: per-block max scores, split over context
  index_topk_select    stage 2: top-k over a row of candidate scores
  index_topk_prefill   prefill: tiled scoring fused with a streaming top-k
  sparse_attn_fwd      block-sparse attention, optional split over blocks
  sparse_attn_tiled    block-sparse attention, a tile of consecutive tokens per program
  block_major_group    prefill: a counting sort of the (token, slot) pairs by block
  sparse_attn_block_major  prefill: one program per selected block and up to 64
                       of the (token, slot) pairs that chose it, merged per token
  sparse_attn_merge    log-sum-exp merge of split partials
  score_attend_decode  decode: every visible block scored and attended, then the
                       top-k partials merged
The modules import the real ``triton`` package (not vLLM's placeholder) so the
kernels also run on CPU under ``TRITON_INTERPRET=1``.
"""

from ._triton import HAS_TRITON
from ._utils import arrival_counters, launch_overrides
from .attention import (block_sparse_attention, default_prefill_layout,
                        default_prefill_token_tile)
from .cache_write import write_sparse_cache
from .indexer import index_block_topk
from .short_decode import score_attend_decode, score_attend_fits

__all__ = ["HAS_TRITON", "arrival_counters", "block_sparse_attention",
           "default_prefill_layout", "default_prefill_token_tile", "index_block_topk",
           "launch_overrides", "score_attend_decode", "score_attend_fits", "write_sparse_cache"]
