# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the series' MSA kernels at engine start, not at a first request (v0.26.0).

Upstream's MiniMax-M3 runs its sparse layers outside CUDA graphs, so every
launch variant the warm-up missed compiled inside a request: 4-7 s at a first
8k prefill on the H200, and on the H100 serving matrix of 2026-12-05 the first
mixed decode + prefill batches still compiled four of the series' kernels
after a warm-up of 26 launch shapes.

So the warm-up walks the forward pass's own two launches
(``series_msa.select_blocks`` and ``series_msa.attend``) over the plan of
``compile_plan``, in compile-only mode, then runs a few real launches
(``compile_warmup``, which says why those shapes): every decode batch size up
to ``max_num_seqs``, every prefill part size that can change a switch or a
Triton key, one context per prefill layout, and parts that start after decode
tokens (a mixed batch's prefill slices).

The block table has the engine's width, ``cdiv(max_model_len, block_size)``
columns (vLLM's per-request table; its width is the kernels' static context
bound). The caches are only read.
"""

import torch

from .compile_warmup import (MIXED_OFFSETS, GrowingBlockTable, layout_contexts,
                             prefill_token_counts, warm_cases, warm_up_launches)
from .series_msa import (MiniMaxM3SparseSeriesImpl, _ops, attend, select_blocks,
                         series_kv_cache, series_kv_view, token_major_topk)


class _Launches:
    """The forward pass's two launches of one batch part, on the layer's caches."""

    def __init__(self, layer, ops, dtype, rows: int, max_model_len: int):
        impl, index = layer.impl, layer.indexer.impl
        cache = series_kv_cache(impl, layer.kv_cache)
        self.impl, self.index, self.ops, self.max_model_len = impl, index, ops, max_model_len
        self.kv, self.index_cache = series_kv_view(cache), index.index_cache.kv_cache
        self.scales = ((1, layer._k_scale, layer._v_scale) if impl.use_fp8_kv
                       else (0, None, None))
        self.dev, self.pages = cache.device, cache.shape[0]
        # batch-wide buffers the parts slice, as the forward pass slices its own
        self.iq = torch.zeros(rows, index.num_index_heads, index.index_head_dim,
                              dtype=self.index_cache.dtype, device=self.dev)
        self.q = torch.zeros(rows, impl.num_heads, impl.head_size, dtype=dtype, device=self.dev)
        self.out = torch.empty_like(self.q)
        self.tables = GrowingBlockTable(max_model_len, impl.block_size, self.pages, self.dev)
        self.topk_buffer = token_major_topk(getattr(index, "topk_indices_buffer", None))

    def layout(self, tokens: int, context: int) -> dict:
        from .triton_ops import default_prefill_layout

        return default_prefill_layout(tokens, context, self.impl.block_size,
                                      self.impl.topk_blocks, self.scales[0] != 0)

    def run(self, decode: bool, tokens: int, context: int, reqs: int = 1, offset: int = 0,
            index: bool = True) -> None:
        dev = self.dev
        if decode:
            reqs = tokens
            req = torch.arange(tokens, device=dev, dtype=torch.int32)
            pos = torch.full((tokens,), context - 1, device=dev, dtype=torch.int32)
        else:
            req = torch.arange(tokens, device=dev, dtype=torch.int32) * reqs // tokens
            pos = torch.arange(context - tokens, context, device=dev, dtype=torch.int32)
        rows = slice(offset, offset + tokens)
        table = self.tables.rows(reqs)
        # the forward pass's top-k rows: the layer's shared buffer where it has them
        buf = self.topk_buffer
        out = buf[rows] if buf is not None and offset + tokens <= buf.shape[0] else None
        if index:
            topk = select_blocks(self.ops, self.index, self.iq[rows], self.index_cache, table,
                                 req, pos, decode, out=out)
        else:
            topk = out if out is not None else self._topk(tokens)
        attend(self.ops, self.impl, self.q[rows], self.kv, table, req, pos, topk, self.scales,
               decode, 0 if decode else context, self.out[rows])

    def _topk(self, tokens: int) -> torch.Tensor:
        return torch.zeros(tokens, self.index.num_index_heads, self.impl.topk_blocks,
                           dtype=torch.int32, device=self.dev)


def compile_plan(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                 layout) -> list[tuple[bool, int, int, int, int, bool]]:
    """(decode?, tokens, context, requests, row offset, with the index launch?) of
    the compile-only pass: every decode batch up to ``max_num_seqs``; every
    ``prefill_token_counts`` part with its index launch once and its attention
    once per layout context; the real launches' prefill sizes again as two
    requests and after ``MIXED_OFFSETS`` decode rows."""
    chunk = min(max_num_batched_tokens, max_model_len)
    plan = [(True, b, min(max_model_len, 8192), b, 0, True) for b in range(1, max_num_seqs + 1)]
    for tokens in prefill_token_counts(chunk):
        for i, ctx in enumerate(layout_contexts(tokens, max_model_len, layout)):
            plan.append((False, tokens, ctx, 1, 0, i == 0))
    for decode, tokens, ctx in warm_cases(max_num_batched_tokens, max_num_seqs, max_model_len):
        if not decode and tokens >= 2:
            plan.append((False, tokens, ctx, 2, 0, True))
            plan += [(False, tokens, ctx, 1, off, True) for off in MIXED_OFFSETS
                     if tokens + off <= max_num_batched_tokens + max_num_seqs]
    return list(dict.fromkeys(plan))


def series_msa_warmup(model: torch.nn.Module, vllm_config) -> bool:
    """Compile every launch variant and run the real warm launches when the
    model's sparse layers take the series' ops on a GPU; False when there is
    nothing to warm (upstream's ops, or CPU)."""
    sched, model_config = vllm_config.scheduler_config, vllm_config.model_config
    max_num_batched_tokens, max_num_seqs = sched.max_num_batched_tokens, sched.max_num_seqs
    max_model_len = model_config.max_model_len
    layer = next((m for m in model.modules()
                  if isinstance(getattr(m, "impl", None), MiniMaxM3SparseSeriesImpl)), None)
    if layer is None or layer.kv_cache.numel() == 0 or not layer.kv_cache.is_cuda:
        return False
    impl = layer.impl
    cache = series_kv_cache(impl, layer.kv_cache)
    ops = _ops(cache, impl)
    if not ops.triton:
        return False
    rows = min(max_num_batched_tokens, max_model_len) + max_num_seqs
    launches = _Launches(layer, ops, model_config.dtype, rows, max_model_len)
    plan = compile_plan(max_num_batched_tokens, max_num_seqs, max_model_len, launches.layout)
    warm_up_launches("Series MiniMax-M3 MSA", plan, launches.run,
                     warm_cases(max_num_batched_tokens, max_num_seqs, max_model_len),
                     launches.run, cache.device)
    return True
