"""The MiniMax-M3 sparse metadata builder: token layout, graph padding, and
CUDA-graph capture after another builder rewrote the shared batch metadata.

The capture test reproduces the bug class of vllm-project/vllm#51585: during
full-graph capture v0.23.0's ROCm attention builder zeroes the query offsets
(device and CPU copies) and sets the shared ``seq_lens`` to 1, and builders of
the model's other layers then run on that metadata. Runs on CPU: the builder
only does tensor arithmetic.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm.models.minimax_m3.common.backend import MiniMaxM3SparseMetadataBuilder
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixes"))
from test_51585_rocm_capture_offsets import _builder_class  # noqa: E402

PAGES = 8


def _builder(max_tokens: int = 64) -> MiniMaxM3SparseMetadataBuilder:
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
        compilation_config=SimpleNamespace(max_cudagraph_capture_size=16),
    )
    return MiniMaxM3SparseMetadataBuilder(None, [], cfg, torch.device("cpu"))


def _metadata(q_lens, seq_lens, num_tokens=None) -> CommonAttentionMetadata:
    """A batch as the GPU runner lays it out; ``num_tokens`` > sum(q_lens) adds
    graph padding (padded requests have q_len 0 and seq_len 0)."""
    qsl = torch.tensor([0] + list(q_lens), dtype=torch.int32).cumsum(0).to(torch.int32)
    T = num_tokens or int(qsl[-1])
    slots = torch.full((T,), -1, dtype=torch.int64)
    slots[: int(qsl[-1])] = torch.arange(int(qsl[-1]))
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=len(q_lens),
        num_actual_tokens=T,
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=torch.zeros((len(q_lens), PAGES), dtype=torch.int32),
        slot_mapping=slots,
    )


def _expected(q_lens, seq_lens):
    req, pos = [], []
    for r, (q, s) in enumerate(zip(q_lens, seq_lens)):
        req += [r] * q
        pos += list(range(s - q, s))
    return req, pos


def test_declares_uniform_batch_graphs():
    assert MiniMaxM3SparseMetadataBuilder._cudagraph_support == AttentionCGSupport.UNIFORM_BATCH


def test_mixed_batch_layout_and_decode_split():
    # decodes first (reorder_batch_threshold = 1), then a chunk and a prefill
    q_lens, seq_lens = [1, 1, 5, 3], [9, 40, 12, 3]
    md = _builder().build(0, _metadata(q_lens, seq_lens))
    req, pos = _expected(q_lens, seq_lens)
    assert md.token_req.tolist() == req
    assert md.token_pos.tolist() == pos
    assert md.num_decode_tokens == 2


def test_graph_padding_tokens_are_inert():
    q_lens, seq_lens = [1, 1, 1, 0, 0], [5, 17, 2, 0, 0]
    md = _builder().build(0, _metadata(q_lens, seq_lens, num_tokens=5))
    assert md.token_req.tolist() == [0, 1, 2, 0, 0]
    assert md.token_pos.tolist() == [4, 16, 1, 0, 0]
    assert md.slot_mapping.tolist()[3:] == [-1, -1]


def test_buffers_are_persistent_across_steps():
    b = _builder()
    first = b.build(0, _metadata([1, 1], [3, 4]))
    ptr = (first.token_req.data_ptr(), first.token_pos.data_ptr())
    second = b.build(0, _metadata([1, 1], [7, 9]))
    assert (second.token_req.data_ptr(), second.token_pos.data_ptr()) == ptr
    assert first.token_pos.tolist() == [6, 8]  # same storage, this step's values


def test_capture_after_rocm_builder_zeroed_the_offsets():
    q_lens, seq_lens = [1, 1, 1, 1], [7, 130, 1, 64]
    cm = _metadata(q_lens, seq_lens)
    rocm = _builder_class("base")  # v0.23.0's ROCm builder: zeroes both offset copies
    rocm.build_for_cudagraph_capture(
        SimpleNamespace(build=lambda _, c: SimpleNamespace(seq_lens=c.seq_lens)), cm)
    assert not cm.query_start_loc.any() and not cm.query_start_loc_cpu.any()
    assert cm.seq_lens.tolist() == [1, 1, 1, 1]  # shared tensor, rewritten too

    builder = _builder()
    md = builder.build_for_cudagraph_capture(cm)
    assert md.token_req.tolist() == [0, 1, 2, 3]
    assert md.token_pos.tolist() == [0, 0, 0, 0]  # seq_len - 1 of what it now reads
    assert md.num_decode_tokens == 4
    # what reading the offsets would have given: every token on request 0
    assert builder.build(0, cm).token_req.tolist() == [0, 0, 0, 0]


def test_capture_spec_decode_shape():
    md = _builder().build_for_cudagraph_capture(_metadata([2, 2, 2], [5, 9, 1]))
    assert md.token_req.tolist() == [0, 0, 1, 1, 2, 2]
    assert md.token_pos.tolist() == [3, 4, 7, 8, 0, 0]  # a 1-token seq clamps at 0
    assert md.num_decode_tokens == 0


def test_capture_refuses_non_uniform_batch():
    cm = _metadata([1, 3], [4, 9])
    with pytest.raises(RuntimeError, match="uniform batch"):
        _builder().build_for_cudagraph_capture(cm)


def test_oversized_batch_is_refused():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        _builder(max_tokens=16).build(0, _metadata([20], [20]))
