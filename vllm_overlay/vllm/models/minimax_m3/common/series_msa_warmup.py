# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the series' MSA kernels at engine start, not at a first request.

The series' Triton kernels specialise on the launch: the dispatchers pick
compile-time switches from the batch (decode splits and blocks per program by
batch size, the sm_90 prefill index's context splits by query tiles, the
prefill attention layout by chunk and context), and Triton keys each compiled
variant on which integer arguments are 1 or a multiple of 16 and which
pointers are 16-byte aligned. Upstream's MiniMax-M3 runs its sparse layers
outside CUDA graphs, so every variant the warm-up missed compiled inside a
request: 4-7 s at a first 8k prefill on the H200, and on the H100 serving
matrix of 2026-12-05 the first mixed decode + prefill batches still compiled
four of the series' kernels after a warm-up of 26 launch shapes.

So the warm-up does not guess shapes. It runs the forward pass's own two
launches (``series_msa.select_blocks`` and ``series_msa.attend``) with Triton
in compile-only mode (``compile_without_launching``: each launch binds its
arguments and compiles its variant, nothing runs; compiles go to a thread
pool) over every decode batch size up to ``max_num_seqs``, every prefill part
size that can change a switch or a Triton key (``prefill_token_counts``), one
context per prefill layout (``layout_contexts``), and parts that start after
decode tokens (a mixed batch's prefill slices). Then a few real launches
(``warm_cases``) load the modules and prove the launches work.

The block table has the engine's width, ``cdiv(max_model_len, block_size)``
columns (vLLM's per-request table; its width is the kernels' static context
bound). The caches are only read.
"""

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from vllm.logger import init_logger

from .series_msa import (MiniMaxM3SparseSeriesImpl, _ops, attend, select_blocks,
                         series_kv_cache, series_kv_view, token_major_topk)

logger = init_logger(__name__)


# prefill part sizes of the real launches, capped by the token budget: 1 token,
# under and over a multiple of 16 below BLOCK_MAJOR_MIN_TOKENS (token tiles), then
# block-major sizes; the full chunk and the chunk less a few decode tokens are added.
WARM_PREFILL_TOKENS = (1, 17, 256, 1000, 1024, 1031, 4096, 8192)
# a mixed batch's prefill part starts after its decode tokens: the compile pass
# also takes slices that start this many rows into the batch (pointer alignment)
MIXED_OFFSETS = (1, 3)


def warm_cases(max_num_batched_tokens: int, max_num_seqs: int,
               max_model_len: int) -> list[tuple[bool, int, int]]:
    """(decode?, tokens, context) of the real launches, without repeats."""
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


def prefill_token_counts(chunk: int) -> list[int]:
    """Prefill part sizes whose launches can differ: 1 to 33 tokens, then every
    multiple of 16 and its two neighbours, and the chunk. Triton keys an
    integer argument on 1 / multiple of 16 / other, and the dispatchers'
    thresholds (query tiles of 16-128 rows, the block-major layout at 1024
    tokens, context splits by tile count) fall on multiples of 16, so a part
    between two listed sizes takes the launches of one of them."""
    counts = set(range(1, min(chunk, 33) + 1))
    for m in range(16, chunk + 2, 16):
        counts.update((m - 1, m, m + 1))
    counts.add(chunk)
    return sorted(c for c in counts if 1 <= c <= chunk)


def layout_contexts(tokens: int, max_model_len: int, layout) -> list[int]:
    """One context (the batch's longest request, ``tokens`` to ``max_model_len``)
    for each distinct prefill layout ``layout(tokens, context)`` gives; the
    candidates sit on and just past every power-of-two count of 16-token steps,
    where the layout's context thresholds are."""
    cands = {tokens, max_model_len}
    step = 16
    while step <= max_model_len:
        cands.update((step, step + 1))
        step *= 2
    seen: dict[tuple, int] = {}
    for ctx in sorted(c for c in cands if tokens <= c <= max_model_len):
        seen.setdefault(tuple(sorted(layout(tokens, ctx).items())), ctx)
    return sorted(seen.values())


def warm_block_table(reqs: int, max_model_len: int, block_size: int, pages: int,
                     device) -> torch.Tensor:
    """[reqs, cdiv(max_model_len, block_size)] int32 page ids, the engine's width."""
    width = -(-max_model_len // block_size)
    return (torch.arange(reqs * width, device=device, dtype=torch.int32)
            % pages).view(reqs, width)


@contextlib.contextmanager
def compile_without_launching(threads: int):
    """Inside: every Triton launch binds its arguments and compiles its variant
    (``JITFunction.run(..., warmup=True)``; Gluon kernels too) and launches
    nothing; compiles run on ``threads`` threads (Triton's ``AsyncCompileMode``)
    and are all finished on exit. Kernel outputs stay unwritten, so the code
    inside must not read them on the host (the series' launchers do not)."""
    from triton.runtime._async_compile import AsyncCompileMode
    from triton.runtime.jit import JITFunction

    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = compile_only
    try:
        with ThreadPoolExecutor(max(1, threads)) as pool, AsyncCompileMode(pool):
            yield
    finally:
        JITFunction.run = run


@contextlib.contextmanager
def count_compiles():
    """A one-item list holding how many Triton variants compiled inside
    (``knobs.runtime.jit_post_compile_hook``, chained to any hook set before)."""
    from triton import knobs

    count, previous = [0], knobs.runtime.jit_post_compile_hook

    def hook(**kwargs):
        count[0] += 1
        return previous(**kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield count
    finally:
        knobs.runtime.jit_post_compile_hook = previous


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
        self._table: torch.Tensor | None = None
        self.topk_buffer = token_major_topk(getattr(index, "topk_indices_buffer", None))

    def table(self, reqs: int) -> torch.Tensor:
        """The first ``reqs`` rows of one table grown on demand: a row slice keeps
        the data pointer and strides, so Triton picks the variant a table of
        exactly ``reqs`` rows gets (one allocation, not one per batch size)."""
        if self._table is None or self._table.shape[0] < reqs:
            grown = max(reqs, 2 * self._table.shape[0] if self._table is not None else 1)
            self._table = warm_block_table(grown, self.max_model_len, self.impl.block_size,
                                           self.pages, self.dev)
        return self._table[:reqs]

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
        table = self.table(reqs)
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
    threads = min(8, os.cpu_count() or 1)
    start = time.perf_counter()
    dispatch_s = 0.0
    with count_compiles() as compiled:
        failed: list[str] = []
        try:
            with compile_without_launching(threads):
                for decode, tokens, ctx, reqs, offset, index in plan:
                    try:
                        launches.run(decode, tokens, ctx, reqs, offset, index)
                    except Exception as e:  # a plan the launchers refuse: say so, go on
                        failed.append(f"{(decode, tokens, ctx, reqs, offset)}: {e}")
                dispatch_s = time.perf_counter() - start
        except Exception as e:  # a variant that does not compile fails its request too
            failed.append(f"compiling: {type(e).__name__}: {e}")
        if failed:
            logger.warning("Series MiniMax-M3 MSA warm-up: %d of %d launch plans failed in the "
                           "compile pass (their variants compile on first use); first: %s",
                           len(failed), len(plan), failed[0][:500])
        compiled_s, variants = time.perf_counter() - start, compiled[0]
        cases = warm_cases(max_num_batched_tokens, max_num_seqs, max_model_len)
        for decode, tokens, ctx in cases:
            launches.run(decode, tokens, ctx)
        torch.cuda.synchronize(cache.device)
    # a variant the real launches compiled is one the compile pass missed
    log = logger.warning if compiled[0] > variants else logger.info
    log("Series MiniMax-M3 MSA warm-up: %d launch plans compiled %d kernel variants in "
        "%.1f s (%.1f s of it walking the plans, %d compile threads); %d real launches "
        "compiled %d more in %.1f s.", len(plan), variants, compiled_s, dispatch_s, threads,
        len(cases), compiled[0] - variants, time.perf_counter() - start - compiled_s)
    return True
