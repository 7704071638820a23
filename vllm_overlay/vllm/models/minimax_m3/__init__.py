# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""MiniMax-M3 (text backbone with MiniMax Sparse Attention).

Layout mirrors ``vllm/models/deepseek_v4``: shared code in ``common/``. The
sparse attention backend has one dispatch point between the PyTorch reference
ops (``common/sparse_ops.py``, used on CPU) and the Triton kernels
(``common/triton_ops``, used on CUDA/ROCm when present):
``common.msa_ops.select_sparse_ops``.
"""

from .common.model import (
    MiniMaxM3SparseForCausalLM,
    MiniMaxM3SparseForConditionalGeneration,
)

__all__ = [
    "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration",
]
