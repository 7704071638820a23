# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the series' MSA kernels at engine start, not at a first request.

The series' Triton kernels specialise on the launch (prefill layout by chunk size
and context, decode splits by batch size, the sm_90 prefill index where it fits;
Triton also keys each compiled variant on which integer arguments are 1 or a
multiple of 16), and upstream's MiniMax-M3 runs its sparse layers outside CUDA
graphs, so every new variant would otherwise compile inside a request (4-7 s at a
first 8k prefill on the H200). This runs the same two launches the forward pass
runs (``series_msa.select_blocks`` and ``series_msa.attend``) on the layer's own
caches, for the batch shapes the engine can schedule: prefill parts of 1 to
``max_num_batched_tokens`` tokens (both sides of every layout threshold, token
counts that are and are not multiples of 16) at a fresh and at the longest
context, and decode batches of powers of two up to ``max_num_seqs``.

The block table has the engine's width, ``cdiv(max_model_len, block_size)``
columns (vLLM's per-request block table; its width sets the kernels' static
context bound and is one of their integer arguments): a narrower table compiled
other variants, and the H100 serving matrix of 2026-12-05 logged six of the
series' kernels compiling inside the first requests. The caches are only read.
"""

import torch

from vllm.logger import init_logger

from .series_msa import (MiniMaxM3SparseSeriesImpl, _ops, attend, select_blocks,
                         series_kv_view)

logger = init_logger(__name__)


# prefill part sizes the warm-up launches, capped by the token budget: 1 token,
# under and over a multiple of 16 below BLOCK_MAJOR_MIN_TOKENS (token tiles), then
# block-major sizes; the full chunk and the chunk less a few decode tokens are added.
WARM_PREFILL_TOKENS = (1, 17, 256, 1000, 1024, 1031, 4096, 8192)


def warm_cases(max_num_batched_tokens: int, max_num_seqs: int,
               max_model_len: int) -> list[tuple[bool, int, int]]:
    """(decode?, tokens, context) of the launches to compile, without repeats."""
    chunk = min(max_num_batched_tokens, max_model_len)
    sizes = [t for t in WARM_PREFILL_TOKENS if t < chunk] + [max(chunk - 7, 1), chunk]
    cases = [(False, tokens, context) for tokens in sizes for context in (tokens, max_model_len)]
    decode_ctx = min(max_model_len, 8192)
    batch = 1
    while batch < max_num_seqs:
        cases.append((True, batch, decode_ctx))
        batch *= 2
    cases.append((True, max_num_seqs, decode_ctx))
    return list(dict.fromkeys(c for c in cases if c[1] >= 1 and c[2] >= c[1]))


def warm_block_table(reqs: int, max_model_len: int, block_size: int, pages: int,
                     device) -> torch.Tensor:
    """[reqs, cdiv(max_model_len, block_size)] int32 page ids, the engine's width."""
    width = -(-max_model_len // block_size)
    return (torch.arange(reqs * width, device=device, dtype=torch.int32)
            % pages).view(reqs, width)


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
        block_table = warm_block_table(reqs, max_model_len, block, pages, dev)
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
