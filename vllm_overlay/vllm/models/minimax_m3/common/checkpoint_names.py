# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Checkpoint tensor names MiniMax-M3 checkpoints are written with, mapped onto the
released ones that the model's ``load_weights`` expects."""

import re

# transformers 5.17's save_pretrained writes a dense layer's MLP (gate_proj, up_proj,
# down_proj) under ``block_sparse_moe.``; the released checkpoints and later transformers
# write it under ``mlp.``. No MoE layer has a tensor by these names (its router is
# ``block_sparse_moe.gate``, its shared expert ``block_sparse_moe.shared_experts.*``).
_DENSE_MLP_AS_MOE = re.compile(r"\.block_sparse_moe\.(gate_proj|up_proj|down_proj)\.")


def released_weight_name(name: str) -> str:
    """``name`` as the released checkpoints spell it."""
    return _DENSE_MLP_AS_MOE.sub(r".mlp.\1.", name)
