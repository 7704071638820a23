"""The v0.26.0 flavor's warm-up of the series' MSA kernels (common/series_msa_warmup.py):
which launches it compiles at engine start. The warm-up itself needs a GPU (its effect
is measured by the serving matrix's JIT monitor, docs/gpu-validation.md); what decides
its coverage is pinned here on CPU, the plan helpers and compile-only mode it shares
with the v0.23.0 flavor in tests/models/test_minimax_m3_compile_warmup.py."""

from vllm.models.minimax_m3.common import series_msa_warmup as warmup
from vllm.models.minimax_m3.common.compile_warmup import prefill_token_counts
from vllm.models.minimax_m3.common.triton_ops.attention import default_prefill_layout


def test_compile_plan_covers_decode_prefill_and_mixed_parts():
    layout = lambda t, ctx: default_prefill_layout(t, ctx, 128, 16, True)  # noqa: E731
    plan = warmup.compile_plan(8192, 64, 132096, layout)
    assert len(plan) == len(set(plan))
    decode = [p for p in plan if p[0]]
    assert sorted(p[1] for p in decode) == list(range(1, 65))  # every batch size
    assert all(p[3] == p[1] and p[5] for p in decode)           # a request per token
    prefill = [p for p in plan if not p[0]]
    indexed = {p[1] for p in prefill if p[5]}
    assert indexed >= set(prefill_token_counts(8192))
    assert all(p[1] <= p[2] <= 132096 for p in prefill)
    assert {p[4] for p in prefill} == {0, *warmup.MIXED_OFFSETS}     # mixed-batch slices
    assert any(p[3] == 2 for p in prefill)
    assert all(p[1] + p[4] <= 8192 + 64 for p in plan)          # inside the warm buffers
    # a short model length: nothing longer than it, the chunk capped by it
    short = warmup.compile_plan(8192, 3, 1024, layout)
    assert max(p[1] for p in short if not p[0]) == 1024
    assert all(p[2] <= 1024 for p in short)
