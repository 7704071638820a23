# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile vLLM's fused-MoE kernel variants at engine start, not in a request.

vLLM's Triton ``fused_moe_kernel`` is compiled per tile config, and the config
depends on the batch's token count: the default configs change tile sizes at 32,
64, 96, 128 and 512 tokens and group M-blocks once an expert sees more than 128
tokens; a tuned config file maps a count to its nearest key. Triton also keys
each variant on which integer arguments are multiples of 16, here the routed
token count (tokens x top-k). Start-up compiles only the counts it runs: the
profile run (the token budget) and the CUDA-graph sizes. On the H100 serving
matrix of 2026-12-06 both MSA paths then compiled fused-MoE variants inside
requests, about 1.3 s each time, and at 1k x 32 requests that was a 4.5x
median time to first token.

So the warm-up runs the model's dummy forward pass (no attention metadata: the
MoE, dense and projection layers run on ``tokens`` rows) at one token count in
each of those buckets beyond the largest CUDA graph, each as a multiple of 16
and as an odd count.
"""

import time

import torch

from vllm.config import CUDAGraphMode
from vllm.logger import init_logger

logger = init_logger(__name__)

# token counts inside every bucket of the default configs and near every key of the
# tuned config files up to 4096; powers of two beyond, and the token budget.
BUCKET_TOKENS = (16, 36, 68, 100, 132, 256, 516, 1024, 1536, 2048, 3072, 4096)


def moe_warm_token_counts(max_num_batched_tokens: int, largest_graph: int) -> list[int]:
    """The dummy-pass token counts: for every bucket point above ``largest_graph``
    (counts up to it are padded to a captured graph) and within the token budget,
    the point rounded down to a multiple of 16 and the odd count below that."""
    points = list(BUCKET_TOKENS)
    p = 8192
    while p < max_num_batched_tokens:
        points.append(p)
        p *= 2
    points.append(max_num_batched_tokens)
    counts: set[int] = set()
    for point in points:
        aligned = point - point % 16
        for n in (aligned, aligned - 1):
            if largest_graph < n <= max_num_batched_tokens:
                counts.add(n)
    return sorted(counts)


def moe_warmup(worker) -> list[int]:
    """Dummy forward passes at ``moe_warm_token_counts``; returns the counts run."""
    config = worker.vllm_config
    compilation = config.compilation_config
    graphs = (not config.model_config.enforce_eager
              and compilation.cudagraph_mode != CUDAGraphMode.NONE)
    largest_graph = (compilation.max_cudagraph_capture_size or 0) if graphs else 0
    counts = moe_warm_token_counts(config.scheduler_config.max_num_batched_tokens,
                                   largest_graph)
    start = time.perf_counter()
    for tokens in counts:
        worker.model_runner._dummy_run(num_tokens=tokens, skip_eplb=True, is_profile=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    logger.info("MiniMax-M3 MoE warm-up: %d dummy forward passes (%d-%d tokens) in %.1f s",
                len(counts), counts[0] if counts else 0, counts[-1] if counts else 0,
                time.perf_counter() - start)
    return counts
