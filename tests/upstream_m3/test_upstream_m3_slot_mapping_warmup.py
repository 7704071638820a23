"""The v0.26.0 flavor's start-up warm-up of vLLM's slot-mapping kernel
(vllm/models/minimax_m3/common/slot_mapping_warmup.py): it runs the runner's own
``compute_slot_mapping`` at 1, 16 and 2 tokens (one variant of each of Triton's integer
keys, for vLLM 0.23.0's kernel), on the runner's buffers, on CUDA / ROCm only."""

from types import SimpleNamespace

import pytest
import torch

MAX_TOKENS = 64


def _runner(block_table):
    qsl = torch.full((MAX_TOKENS + 1,), 7, dtype=torch.int32)
    return SimpleNamespace(input_batch=SimpleNamespace(block_table=block_table),
                           query_start_loc=SimpleNamespace(gpu=qsl),
                           positions=torch.arange(MAX_TOKENS, dtype=torch.int64))


@pytest.fixture
def cuda_alike(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cuda_alike", lambda self: True)


def test_runs_vllms_own_call_on_a_real_block_table(cuda_alike, monkeypatch):
    """Through vLLM 0.26's MultiGroupBlockTable (two KV-cache groups, as M3 has: the
    indexer keys and the attention KV), with the CPU build's C++ stand-in for the Triton
    kernel: every group's slot mapping gets the one token's slot, from the runner's buffers."""
    import vllm.v1.worker.block_table as bt_mod
    from vllm.utils.cpu_triton_utils import compute_slot_mapping_kernel
    from vllm.models.minimax_m3.common.slot_mapping_warmup import slot_mapping_warmup

    if not hasattr(torch.ops._C, "compute_slot_mapping_kernel_impl"):
        # found on the H100 (2026-12-07): a CUDA build has no CPU stand-in
        pytest.skip("the CPU build's stand-in kernel is not in this (GPU) build; "
                    "test_the_first_step_finds_the_kernel_compiled runs the real one")

    monkeypatch.setattr(bt_mod, "_compute_slot_mapping_kernel", compute_slot_mapping_kernel)
    table = bt_mod.MultiGroupBlockTable(
        max_num_reqs=4, max_num_batched_tokens=MAX_TOKENS,
        pin_memory=False, device=torch.device("cpu"), block_sizes=[64, 64],
        kernel_block_sizes=[64, 64], max_num_blocks=[16, 16])
    for group in table.block_tables:
        group.slot_mapping.gpu.fill_(123)
        group.block_table.gpu[0, 0] = 5           # request row 0's first block
    runner = _runner(table)
    runner.positions.fill_(999)                   # stale: would index past the row
    assert slot_mapping_warmup(runner)
    for group in table.block_tables:
        # positions 0..15 of block 5 (64 slots a block); the Triton kernel also pads the
        # rest, the CPU stand-in writes the batch's tokens only
        assert group.slot_mapping.gpu[:16].tolist() == [5 * 64 + i for i in range(16)]
        assert (group.slot_mapping.gpu[16:] == 123).all()
    assert runner.query_start_loc.gpu[:2].tolist() == [0, 2]   # the last call: 2 tokens
    assert (runner.query_start_loc.gpu[2:] == 7).all()
    assert runner.positions[:16].tolist() == list(range(16))
    assert (runner.positions[16:] == 999).all()


def test_uses_the_runners_buffers(cuda_alike):
    """The launches take views of the runner's own query_start_loc and positions (the
    compiled variant keys on their alignment): one request at positions 0.., of 1, 16
    and 2 tokens."""
    from vllm.models.minimax_m3.common.slot_mapping_warmup import slot_mapping_warmup

    calls = []

    def call(num_reqs, qsl, pos):
        calls.append((num_reqs, qsl.tolist(), pos.tolist(), qsl.data_ptr(), pos.data_ptr()))

    runner = _runner(SimpleNamespace(compute_slot_mapping=call))
    assert slot_mapping_warmup(runner)
    assert [c[:3] for c in calls] == [(1, [0, n], list(range(n))) for n in (1, 16, 2)]
    assert {c[3] for c in calls} == {runner.query_start_loc.gpu.data_ptr()}
    assert {c[4] for c in calls} == {runner.positions.data_ptr()}


def test_nothing_runs_on_the_cpu_platform_or_another_runner(cuda_alike, monkeypatch):
    from vllm.platforms import current_platform
    from vllm.models.minimax_m3.common.slot_mapping_warmup import slot_mapping_warmup

    calls = []
    runner = _runner(SimpleNamespace(compute_slot_mapping=lambda *a: calls.append(a)))
    assert not slot_mapping_warmup(SimpleNamespace(input_batch=None))
    monkeypatch.setattr(type(current_platform), "is_cuda_alike", lambda self: False)
    assert not slot_mapping_warmup(runner)
    assert calls == []


def test_the_m3_warmup_calls_it_after_the_moe_warmup(monkeypatch):
    import vllm.model_executor.warmup.minimax_m3_msa_warmup as warm
    import vllm.models.minimax_m3.common.moe_warmup as moe
    import vllm.models.minimax_m3.common.series_msa_warmup as series
    import vllm.models.minimax_m3.common.slot_mapping_warmup as slots

    order = []
    sparse = warm.MiniMaxM3SparseAttention.__new__(warm.MiniMaxM3SparseAttention)
    worker = SimpleNamespace(get_model=lambda: SimpleNamespace(modules=lambda: [sparse]),
                             model_runner="runner", vllm_config=None)
    monkeypatch.setattr(moe, "moe_warmup", lambda w: order.append("moe"))
    monkeypatch.setattr(slots, "slot_mapping_warmup", lambda r: order.append(("slots", r)))
    monkeypatch.setattr(series, "series_msa_warmup", lambda m, c: order.append("series") or True)
    warm.minimax_m3_msa_warmup(worker)
    assert order == ["moe", ("slots", "runner"), "series"]


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="compiles vLLM's Triton slot-mapping kernel: needs a GPU")
def test_the_first_step_finds_the_kernel_compiled():
    """On the GPU: after the warm-up, a step-shaped call (several requests, views of the
    runner's buffers) compiles no further variant of _compute_slot_mapping_kernel."""
    import vllm.v1.worker.block_table as bt_mod
    from vllm.models.minimax_m3.common.slot_mapping_warmup import slot_mapping_warmup

    dev = torch.device("cuda")
    table = bt_mod.MultiGroupBlockTable(
        max_num_reqs=8, max_num_batched_tokens=MAX_TOKENS, pin_memory=False, device=dev,
        block_sizes=[128, 128], kernel_block_sizes=[128, 128], max_num_blocks=[16, 16])
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(block_table=table),
        query_start_loc=SimpleNamespace(gpu=torch.zeros(9, dtype=torch.int32, device=dev)),
        positions=torch.zeros(MAX_TOKENS, dtype=torch.int64, device=dev))
    kernel = bt_mod._compute_slot_mapping_kernel

    def compiled() -> int:
        return sum(len(c[0]) for c in kernel.device_caches.values())

    before = compiled()
    assert slot_mapping_warmup(runner)
    warmed = compiled()
    assert warmed >= before
    runner.query_start_loc.gpu[:4] = torch.tensor([0, 5, 9, 17], device=dev)
    runner.positions[:17] = torch.arange(17, device=dev)
    table.compute_slot_mapping(3, runner.query_start_loc.gpu[:4], runner.positions[:17])
    torch.cuda.synchronize()
    assert compiled() == warmed and warmed > 0
