"""The start-up warm-up's plan helpers and compile-only driver
(common/compile_warmup.py), shared by both flavors' warm-ups: which part sizes and
contexts stand for every launch, and that the compile pass launches nothing. Run by
both flavors' suites."""

import pytest
import torch

from vllm.models.minimax_m3.common import compile_warmup as warmup
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
    tables = warmup.GrowingBlockTable(132096, 128, 50, "cpu")
    for reqs in (1, 2, 3, 5, 8, 7, 17):
        table = tables.rows(reqs)
        own = warmup.warm_block_table(reqs, 132096, 128, 50, "cpu")
        assert table.shape == own.shape and table.stride() == own.stride()
        assert torch.equal(table, own)
        assert table.data_ptr() == tables._table.data_ptr()
    assert tables._table.shape[0] == 17  # grown 1, 2, 4, 8, 17 rows


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



def test_warm_up_launches_names_refused_plans_and_runs_the_real_cases(monkeypatch, caplog):
    """Every plan runs inside the compile-only mode, a plan that raises is named in
    one warning and the walk goes on, then every real case runs outside it."""
    from triton.runtime import _async_compile

    ran = []

    def run_plan(n):
        ran.append(("plan", n, _async_compile.active_mode.get() is not None))
        if n == 2:
            raise ValueError("refused")

    def run_case(n):
        ran.append(("case", n, _async_compile.active_mode.get() is not None))

    warnings = []
    monkeypatch.setattr(warmup.logger, "warning", lambda *a: warnings.append(a[0] % a[1:]))
    warmup.warm_up_launches("Test", [(1,), (2,), (3,)], run_plan, [(7,)], run_case, "cpu")
    assert ran == [("plan", 1, True), ("plan", 2, True), ("plan", 3, True),
                   ("case", 7, False)]
    assert len(warnings) == 1 and "1 of 3 launch plans failed" in warnings[0]
    assert "(2,): refused" in warnings[0]
