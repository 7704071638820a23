# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile vLLM's slot-mapping kernel at engine start, not in the first request.

``BlockTable.compute_slot_mapping`` launches the Triton ``_compute_slot_mapping_kernel``
once per step and KV-cache group. The dummy passes of start-up (profile run, CUDA-graph
capture, the M3 warm-ups) build their metadata without it, so it compiled inside the
first request on both MSA paths of the H100 serving matrix (2026-12-06). vLLM 0.26
warms it for Qwen models only (``qwen_triton_warmup``).

Here the runner's own call runs on its own buffers (the block tables of every
KV-cache group, ``query_start_loc``, ``positions``), so the compiled variants are the
ones the steps use: same constexprs, same argument alignment. vLLM 0.23.0's kernel
also keys a variant on its token count (1, a multiple of 16, other: vLLM 0.26.0
declares it ``do_not_specialize``), and on the H100 (2026-12-08) a tiny model's
requests compiled the other two; so the call runs at 1, 16 and 2 tokens. No request
exists yet: the batch is one request at positions 0.., which writes those slot
mapping entries from block table row 0 and pads the rest; the first step rewrites all
of it.
"""

import torch

from vllm.platforms import current_platform

# one token count of each of Triton's integer keys: 1, a multiple of 16, other
WARM_TOKEN_COUNTS = (1, 16, 2)


def slot_mapping_warmup(runner) -> bool:
    """Run ``runner.input_batch.block_table.compute_slot_mapping`` on the runner's
    buffers at ``WARM_TOKEN_COUNTS`` tokens; False (nothing run) off CUDA / ROCm or on
    a runner without that call."""
    if not current_platform.is_cuda_alike():  # the CPU runner swaps in a C++ kernel
        return False
    block_table = getattr(getattr(runner, "input_batch", None), "block_table", None)
    query_start_loc = getattr(getattr(runner, "query_start_loc", None), "gpu", None)
    positions = getattr(runner, "positions", None)
    if (query_start_loc is None or positions is None
            or not hasattr(block_table, "compute_slot_mapping")):
        return False
    # one request at positions 0.. (a stale position could index past the block
    # table's row); an empty batch would hand the kernel empty tensors instead
    for tokens in WARM_TOKEN_COUNTS:
        if tokens > positions.shape[0]:
            continue
        query_start_loc[0], query_start_loc[1] = 0, tokens
        positions[:tokens] = torch.arange(tokens, device=positions.device,
                                          dtype=positions.dtype)
        block_table.compute_slot_mapping(1, query_start_loc[:2], positions[:tokens])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return True
