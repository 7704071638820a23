"""The v0.26.0 flavor's start-up warm-up of vLLM's fused-MoE variants
(vllm/models/minimax_m3/common/moe_warmup.py): which token counts it runs."""

from types import SimpleNamespace

import pytest


def _default_config(m: int, experts: int) -> tuple:
    """vLLM 0.26's default bf16 fused-MoE tile config for m tokens (the buckets)."""
    from vllm.model_executor.layers.fused_moe.fused_moe import get_default_config

    return tuple(sorted(get_default_config(m, experts, 1024, 6144, 4, None).items()))


@pytest.mark.parametrize("budget, largest_graph", [(32768, 64), (8192, 512), (2048, 0)])
def test_counts_reach_every_default_config_in_both_alignments(budget, largest_graph):
    """Every default tile config a batch of (largest_graph, budget] tokens can pick is
    run once with tokens x top-k a multiple of 16 and once not."""
    from vllm.models.minimax_m3.common.moe_warmup import moe_warm_token_counts

    counts = moe_warm_token_counts(budget, largest_graph)
    assert counts == sorted(set(counts))
    assert all(largest_graph < n <= budget for n in counts)
    for experts in (128, 129):   # routed experts, + the fused shared expert
        want = {(_default_config(m, experts), m * 4 % 16 == 0)
                for m in range(largest_graph + 1, budget + 1)}
        got = {(_default_config(m, experts), m * 4 % 16 == 0) for m in counts}
        assert got == want, sorted(want - got)


def test_warmup_runs_dummy_passes_beyond_the_graphs_only_when_graphs_are_on():
    from vllm.config import CUDAGraphMode
    from vllm.models.minimax_m3.common.moe_warmup import moe_warm_token_counts, moe_warmup

    def worker(enforce_eager, mode):
        runs = []
        return runs, SimpleNamespace(
            vllm_config=SimpleNamespace(
                model_config=SimpleNamespace(enforce_eager=enforce_eager),
                compilation_config=SimpleNamespace(cudagraph_mode=mode,
                                                   max_cudagraph_capture_size=64),
                scheduler_config=SimpleNamespace(max_num_batched_tokens=4096)),
            model_runner=SimpleNamespace(
                _dummy_run=lambda num_tokens, **kw: runs.append((num_tokens, kw))))

    runs, w = worker(False, CUDAGraphMode.FULL_AND_PIECEWISE)
    assert moe_warmup(w) == [n for n, _ in runs] == moe_warm_token_counts(4096, 64)
    assert min(n for n, _ in runs) > 64 and max(n for n, _ in runs) == 4096
    assert all(kw == dict(skip_eplb=True, is_profile=True) for _, kw in runs)
    for eager, mode in ((True, CUDAGraphMode.FULL_AND_PIECEWISE), (False, CUDAGraphMode.NONE)):
        runs, w = worker(eager, mode)
        assert moe_warmup(w) == moe_warm_token_counts(4096, 0)
        assert min(n for n, _ in runs) < 64
