# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile a layer's Triton launch variants at engine start: the plan and the driver.

The series' MSA kernels specialise on the launch: the dispatchers pick
compile-time switches from the batch (decode splits and blocks per program by
batch size, the sm_90 prefill index's context splits by query tiles, the
prefill attention layout by chunk and context), and Triton keys each compiled
variant on which integer arguments are 1 or a multiple of 16 and which
pointers are 16-byte aligned. A variant that start-up missed compiles inside
the first request that needs it (seconds on the H100/H200).

So a warm-up does not guess shapes: it runs the forward pass's own launches
with Triton in compile-only mode (``compile_without_launching``: each launch
binds its arguments and compiles its variant, nothing runs; compiles go to a
thread pool) over every shape the scheduler can hand the layer (a plan built
from ``prefill_token_counts``, ``layout_contexts`` and the decode batch sizes),
then a few real launches (``warm_cases``) load the modules and prove the
launches work (``warm_up_launches``). Each flavor walks its own forward pass:
``series_msa_warmup`` (upstream's layers on v0.26.0) and ``sparse_impl_warmup``
(the series' backend on v0.23.0).
"""

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

# prefill part sizes of the real launches, capped by the token budget: 1 token,
# under and over a multiple of 16 below BLOCK_MAJOR_MIN_TOKENS (token tiles), then
# block-major sizes; the full chunk and the chunk less a few decode tokens are added.
WARM_PREFILL_TOKENS = (1, 17, 256, 1000, 1024, 1031, 4096, 8192)
# a mixed batch's prefill part starts after its decode tokens: the compile pass
# also takes parts that start this many rows into the batch (pointer alignment)
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


class GrowingBlockTable:
    """Block tables of ``reqs`` rows as the first rows of one table grown on demand:
    a row slice keeps the data pointer and strides, so Triton picks the variant a
    table of exactly ``reqs`` rows gets (one allocation, not one per batch size)."""

    def __init__(self, max_model_len: int, block_size: int, pages: int, device) -> None:
        self.max_model_len, self.block_size = max_model_len, block_size
        self.pages, self.device = pages, device
        self._table: torch.Tensor | None = None

    def rows(self, reqs: int) -> torch.Tensor:
        if self._table is None or self._table.shape[0] < reqs:
            grown = max(reqs, 2 * self._table.shape[0] if self._table is not None else 1)
            self._table = warm_block_table(grown, self.max_model_len, self.block_size,
                                           self.pages, self.device)
        return self._table[:reqs]


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


def warm_up_launches(label: str, plan: list[tuple], run_plan: Callable[..., None],
                     cases: Iterable[tuple], run_case: Callable[..., None],
                     device: torch.device) -> None:
    """``run_plan(*p)`` for every ``p`` of ``plan`` in compile-only mode, then
    ``run_case(*c)`` for every case as real launches. A plan the launchers refuse
    is named in one warning (its variants compile on first use) and the walk goes
    on; a variant the real launches compile is one the plan missed (a warning)."""
    threads = min(8, os.cpu_count() or 1)
    start = time.perf_counter()
    dispatch_s = 0.0
    cases = list(cases)
    with count_compiles() as compiled:
        failed: list[str] = []
        try:
            with compile_without_launching(threads):
                for p in plan:
                    try:
                        run_plan(*p)
                    except Exception as e:  # a plan the launchers refuse: say so, go on
                        failed.append(f"{p}: {e}")
                dispatch_s = time.perf_counter() - start
        except Exception as e:  # a variant that does not compile fails its request too
            failed.append(f"compiling: {type(e).__name__}: {e}")
        if failed:
            logger.warning("%s warm-up: %d of %d launch plans failed in the compile pass "
                           "(their variants compile on first use); first: %s",
                           label, len(failed), len(plan), failed[0][:500])
        compiled_s, variants = time.perf_counter() - start, compiled[0]
        for c in cases:
            run_case(*c)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    log = logger.warning if compiled[0] > variants else logger.info
    log("%s warm-up: %d launch plans compiled %d kernel variants in %.1f s (%.1f s of it "
        "walking the plans, %d compile threads); %d real launches compiled %d more in "
        "%.1f s.", label, len(plan), variants, compiled_s, dispatch_s, threads, len(cases),
        compiled[0] - variants, time.perf_counter() - start - compiled_s)
