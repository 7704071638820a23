"""The v0.26.0 flavor's warm-up of the series' MSA kernels (common/series_msa_warmup.py):
which launches it compiles at engine start, and the compile-only mode it runs them in.
The warm-up itself needs a GPU (its effect is measured by the serving matrix's JIT
monitor, docs/gpu-validation.md); what decides its coverage is pinned here on CPU."""

import pytest
import torch

from vllm.models.minimax_m3.common import series_msa_warmup as warmup
from vllm.models.minimax_m3.common.triton_ops.attention import (BLOCK_MAJOR_MIN_TOKENS,
                                                                default_prefill_layout)


def _triton_int_class(n: int) -> str:
    """How Triton keys an integer argument: 1, a multiple of 16, or other."""
    return "one" if n == 1 else "d16" if n % 16 == 0 else "other"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize("chunk", [8192, 2048, 1000, 20])
def test_prefill_token_counts_stand_for_every_part_size(chunk):
    """Every prefill part of 1..chunk tokens has a listed size with the same Triton
    key class and the same count of 16- and 128-row query tiles (the dispatchers'
    thresholds), so compiling the listed sizes compiles what any part launches."""
    counts = warmup.prefill_token_counts(chunk)
    assert counts == sorted(set(counts)) and counts[0] == 1 and counts[-1] == chunk
    assert len(counts) < chunk // 5 + 40           # far fewer than every size
    index = {(_triton_int_class(c), _cdiv(c, 16), _cdiv(c, 128)) for c in counts}
    missing = [t for t in range(1, chunk + 1)
               if (_triton_int_class(t), _cdiv(t, 16), _cdiv(t, 128)) not in index]
    assert not missing, f"part sizes no listed size stands for: {missing[:10]}"


@pytest.mark.parametrize("kv_fp8", [False, True])
@pytest.mark.parametrize("tokens", [1, 100, 1023, 1024, 8192])
def test_layout_contexts_reach_every_prefill_layout(tokens, kv_fp8):
    """Against every context from the part's size to 132096 tokens: the warm-up's
    contexts give each prefill attention layout the dispatcher can pick, once."""
    max_len = 132096

    def layout(t, ctx):
        return default_prefill_layout(t, ctx, 128, 16, kv_fp8)

    ctxs = warmup.layout_contexts(tokens, max_len, layout)
    key = lambda ctx: tuple(sorted(layout(tokens, ctx).items()))  # noqa: E731
    every = {key(c) for c in range(tokens, max_len + 1)}
    assert {key(c) for c in ctxs} == every and len(ctxs) == len(every)
    assert all(tokens <= c <= max_len for c in ctxs)
    if tokens < BLOCK_MAJOR_MIN_TOKENS:      # token tiles up to 8k, one token past it
        assert len(ctxs) == 2


def test_compile_plan_covers_decode_prefill_and_mixed_parts():
    layout = lambda t, ctx: default_prefill_layout(t, ctx, 128, 16, True)  # noqa: E731
    plan = warmup.compile_plan(8192, 64, 132096, layout)
    assert len(plan) == len(set(plan))
    decode = [p for p in plan if p[0]]
    assert sorted(p[1] for p in decode) == list(range(1, 65))  # every batch size
    assert all(p[3] == p[1] and p[5] for p in decode)           # a request per token
    prefill = [p for p in plan if not p[0]]
    indexed = {p[1] for p in prefill if p[5]}
    assert indexed >= set(warmup.prefill_token_counts(8192))
    assert all(p[1] <= p[2] <= 132096 for p in prefill)
    assert {p[4] for p in prefill} == {0, *warmup.MIXED_OFFSETS}     # mixed-batch slices
    assert any(p[3] == 2 for p in prefill)
    assert all(p[1] + p[4] <= 8192 + 64 for p in plan)          # inside the warm buffers
    # a short model length: nothing longer than it, the chunk capped by it
    short = warmup.compile_plan(8192, 3, 1024, layout)
    assert max(p[1] for p in short if not p[0]) == 1024
    assert all(p[2] <= 1024 for p in short)


def test_warm_cases_cover_the_schedulable_shapes():
    """The real launches after the compile pass: both sides of the token-tile /
    block-major threshold, token counts on and off a multiple of 16, fresh and
    longest context, and power-of-two decode batches up to max_num_seqs."""
    cases = warmup.warm_cases(32768, 32, 132096)
    prefill = [(t, c) for d, t, c in cases if not d]
    assert (32768, 32768) in prefill and (32768, 132096) in prefill
    assert (32761, 132096) in prefill            # a chunk shared with 7 decode tokens
    sizes = {t for t, _ in prefill}
    assert {t for t in sizes if t < BLOCK_MAJOR_MIN_TOKENS} >= {1, 17, 256}
    assert all((t, 132096) in prefill and (t, t) in prefill for t in sizes)
    assert [c[1] for c in cases if c[0]] == [1, 2, 4, 8, 16, 32]
    assert len(cases) == len(set(cases))
    short = warmup.warm_cases(8192, 3, 1024)
    assert all(c[2] <= 1024 and c[1] <= c[2] for c in short)
    assert [c[1] for c in short if c[0]] == [1, 2, 3]


def test_warm_block_table_has_the_engines_width():
    """As wide as vLLM's per-request table (cdiv(max_model_len, block_size)): the
    kernels take its width as their static context bound, and a narrower one
    compiled other variants (H100, 2026-12-05)."""
    table = warmup.warm_block_table(3, 132096, 128, 50, "cpu")
    assert table.shape == (3, 1032) and table.dtype == torch.int32
    assert int(table.max()) < 50 and table.is_contiguous()
    assert warmup.warm_block_table(1, 1000, 128, 9, "cpu").shape == (1, 8)


def test_block_tables_are_row_slices_of_one_table():
    """Every batch size reads the first rows of one table (grown by doubling), with
    the pointer, strides and values a table of its own would have, so Triton keys
    it alike: a table per decode batch size was ~136 MB at 256 sequences x 128k."""
    launches = object.__new__(warmup._Launches)
    launches.impl = type("Impl", (), {"block_size": 128})()
    launches.max_model_len, launches.pages, launches.dev = 132096, 50, "cpu"
    launches._table = None
    for reqs in (1, 2, 3, 5, 8, 7, 17):
        table = launches.table(reqs)
        own = warmup.warm_block_table(reqs, 132096, 128, 50, "cpu")
        assert table.shape == own.shape and table.stride() == own.stride()
        assert torch.equal(table, own)
        assert table.data_ptr() == launches._table.data_ptr()
    assert launches._table.shape[0] == 17  # grown 1, 2, 4, 8, 17 rows


def test_compile_without_launching_turns_launches_into_compiles(monkeypatch):
    """Inside, a launch reaches Triton's run with warmup=True (bind + compile, no
    launch) while an async-compile mode is active; on exit, error or not, run is
    Triton's own again and no async mode is left behind."""
    from triton.runtime import _async_compile
    from triton.runtime.jit import JITFunction

    seen = []

    def recorder(self, *args, grid, warmup, **kwargs):
        seen.append((args, grid, warmup, kwargs, _async_compile.active_mode.get()))
        return "kernel"

    monkeypatch.setattr(JITFunction, "run", recorder)
    with warmup.compile_without_launching(threads=2):
        assert JITFunction.run(object(), 1, 2, grid=(3,), warmup=False, num_warps=4) == "kernel"
    args, grid, was_warmup, kwargs, mode = seen[0]
    assert args == (1, 2) and grid == (3,) and was_warmup is True
    assert kwargs == {"num_warps": 4} and mode is not None
    assert JITFunction.run is recorder and _async_compile.active_mode.get() is None
    with pytest.raises(RuntimeError, match="inside"):
        with warmup.compile_without_launching(threads=1):
            raise RuntimeError("inside")
    assert JITFunction.run is recorder and _async_compile.active_mode.get() is None


def test_count_compiles_chains_the_hook_before_it():
    """vLLM's JIT monitor sets Triton's post-compile hook: the warm-up's counter
    passes every event on to it and puts it back after."""
    from triton import knobs

    passed = []
    before = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: passed.append(kw["key"])
    try:
        monitor = knobs.runtime.jit_post_compile_hook
        with warmup.count_compiles() as count:
            knobs.runtime.jit_post_compile_hook(key="a")
            knobs.runtime.jit_post_compile_hook(key="b")
        assert count == [2] and passed == ["a", "b"]
        assert knobs.runtime.jit_post_compile_hook is monitor
    finally:
        knobs.runtime.jit_post_compile_hook = before
