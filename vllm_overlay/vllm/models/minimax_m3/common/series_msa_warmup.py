# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the series' MSA kernels at engine start, not at a first request.

The series' Triton kernels specialise on the launch (prefill layout by chunk size
and context, decode splits by batch size, the sm_90 prefill index where it fits),
and upstream's MiniMax-M3 runs its sparse layers outside CUDA graphs, so every new
variant would otherwise compile inside a request (4-7 s at a first 8k prefill on
the H200). This runs the same two launches the forward pass runs
(``series_msa.select_blocks`` and ``series_msa.attend``) on the layer's own caches,
for the batch shapes the engine can schedule: prefill chunks of the full token
budget at a fresh and at a long context, a short prefill, and decode batches of
powers of two up to ``max_num_seqs``. The caches are only read.
"""

import torch

from vllm.logger import init_logger

from .series_msa import (MiniMaxM3SparseSeriesImpl, _ops, attend, select_blocks,
                         series_kv_view)

logger = init_logger(__name__)


def warm_cases(max_num_batched_tokens: int, max_num_seqs: int,
               max_model_len: int) -> list[tuple[bool, int, int]]:
    """(decode?, tokens, context) of the launches to compile."""
    chunk = min(max_num_batched_tokens, max_model_len)
    cases = [(False, chunk, chunk), (False, min(256, chunk), min(256, chunk))]
    long_ctx = min(max_model_len, 4 * chunk)
    if long_ctx > chunk:
        cases.append((False, chunk, long_ctx))
    decode_ctx = min(max_model_len, 8192)
    batch = 1
    while batch < max_num_seqs:
        cases.append((True, batch, decode_ctx))
        batch *= 2
    cases.append((True, max_num_seqs, decode_ctx))
    return [c for c in cases if c[1] >= 1 and c[2] >= c[1]]


def series_msa_warmup(model: torch.nn.Module, vllm_config) -> bool:
    """Run the warm launches when the model's sparse layers take the series' ops
    on a GPU; False when there is nothing to warm (upstream's ops, or CPU)."""
    sched, model_config = vllm_config.scheduler_config, vllm_config.model_config
    max_num_batched_tokens, max_num_seqs = sched.max_num_batched_tokens, sched.max_num_seqs
    max_model_len, dtype = model_config.max_model_len, model_config.dtype
    layer = next((m for m in model.modules()
                  if isinstance(getattr(m, "impl", None), MiniMaxM3SparseSeriesImpl)), None)
    if layer is None or layer.kv_cache.numel() == 0 or not layer.kv_cache.is_cuda:
        return False
    impl, index = layer.impl, layer.indexer.impl
    cache = layer.kv_cache.view(impl.kv_cache_fp8_dtype) if impl.use_fp8_kv else layer.kv_cache
    kv, index_cache = series_kv_view(cache), index.index_cache.kv_cache
    ops = _ops(cache, impl)
    if not ops.triton:
        return False
    scales = ((1, layer._k_scale, layer._v_scale) if impl.use_fp8_kv else (0, None, None))
    dev, pages, block = cache.device, cache.shape[0], impl.block_size
    cases = warm_cases(max_num_batched_tokens, max_num_seqs, max_model_len)
    logger.info("Warming up the series' MiniMax-M3 MSA kernels (%d launch shapes).",
                len(cases))
    for decode, tokens, context in cases:
        reqs = tokens if decode else 1
        blocks = -(-context // block)
        block_table = (torch.arange(reqs * blocks, device=dev, dtype=torch.int32)
                       % pages).view(reqs, blocks)
        if decode:
            req = torch.arange(tokens, device=dev, dtype=torch.int32)
            pos = torch.full((tokens,), context - 1, device=dev, dtype=torch.int32)
        else:
            req = torch.zeros(tokens, device=dev, dtype=torch.int32)
            pos = torch.arange(context - tokens, context, device=dev, dtype=torch.int32)
        iq = torch.zeros(tokens, index.num_index_heads, index.index_head_dim,
                         dtype=index_cache.dtype, device=dev)
        q = torch.zeros(tokens, impl.num_heads, impl.head_size, dtype=dtype, device=dev)
        topk = select_blocks(ops, index, iq, index_cache, block_table, req, pos, decode)
        attend(ops, impl, q, kv, block_table, req, pos, topk, scales, decode, context,
               torch.empty_like(q))
    torch.cuda.synchronize(dev)
    return True
