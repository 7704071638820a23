"""The v0.23.0 flavor's start-up warm-up (common/sparse_impl_warmup.py and the
``minimax_m3_warmup`` hook in vLLM's kernel_warmup): the batches it walks, that its
metadata is the builder's, that the walk runs the Impl's own forward without writing
the caches, and, on a GPU, that requests then compile no kernel.

The compile-only mode and the plan helpers it shares with the v0.26.0 flavor are
pinned in test_minimax_m3_compile_warmup.py."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm.models.minimax_m3.common import sparse_impl_warmup as warmup
from vllm.models.minimax_m3.common.backend import (MiniMaxM3SparseImpl,
                                                   MiniMaxM3SparseMetadataBuilder)
from vllm.models.minimax_m3.common.compile_warmup import (MIXED_OFFSETS,
                                                         prefill_token_counts, warm_cases)
from vllm.models.minimax_m3.common.triton_ops.attention import default_prefill_layout
from vllm.v1.attention.backend import CommonAttentionMetadata

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _layout(tokens, ctx):
    return default_prefill_layout(tokens, ctx, 128, 16, True)


def test_compile_plan_covers_decode_prefill_and_mixed_batches():
    plan = warmup.compile_plan(8192, 64, 132096, _layout)
    assert len(plan) == len(set(plan))
    decode = [p for p in plan if p[1] == 0]
    assert sorted(p[0] for p in decode) == list(range(1, 65))  # every decode batch
    assert all(p[2] == 8192 and p[3] == 0 for p in decode)
    prefill = [p for p in plan if p[0] == 0 and p[1]]
    assert {p[1] for p in prefill} >= set(prefill_token_counts(8192))
    assert all(p[1] <= p[2] <= 132096 for p in prefill)
    mixed = [p for p in plan if p[0] and p[1]]
    assert all(p[0] + p[1] <= 8192 for p in mixed)            # one token budget
    # every decode count ahead of a one-token prefill (the decode slice's launches)
    assert {p[0] for p in mixed if p[1:] == (1, 8192, 1)} == set(range(1, 64))
    sized = [p for p in mixed if p[1:] != (1, 8192, 1)]        # the real launches' sizes
    assert {p[0] for p in sized} == set(MIXED_OFFSETS)
    assert {(t, c) for _, t, c, _ in sized} == {
        (t, c) for d, t, c in warm_cases(8192, 64, 132096) if not d and t < 8192}
    assert any(p[3] == 2 for p in prefill)
    short = warmup.compile_plan(8192, 3, 1024, _layout)        # short model length
    assert max(p[1] for p in short) == 1024 and all(p[2] <= 1024 for p in short)
    assert {p[0] for p in short if p[1]} == {0, 1, 2}          # max_num_seqs 3: 1-2 decodes


def _builder_metadata(q_lens, seq_lens, min_tokens):
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=sum(q_lens)),
        compilation_config=SimpleNamespace(max_cudagraph_capture_size=0))
    builder = MiniMaxM3SparseMetadataBuilder(None, [], cfg, torch.device("cpu"))
    builder.dense_prefix_min_tokens = min_tokens
    qsl = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq,
        num_reqs=len(q_lens), num_actual_tokens=sum(q_lens), max_query_len=max(q_lens),
        max_seq_len=max(seq_lens), block_table_tensor=torch.zeros(len(q_lens), 4,
                                                                  dtype=torch.int32),
        slot_mapping=torch.arange(sum(q_lens)), seq_lens_cpu_upper_bound=seq.clone())
    return builder.build(0, cm)


@pytest.mark.parametrize("decode, prefill, context, reqs", [
    (3, 0, 500, 0), (0, 40, 40, 1), (0, 40, 300, 1), (0, 41, 300, 2), (2, 37, 90, 1),
    (16, 40, 64, 2)])
def test_warm_metadata_is_what_the_builder_gives_that_batch(decode, prefill, context, reqs):
    """Token requests and positions, decode split, longest request and dense-prefix
    chunks equal the real builder's for the batch the warm metadata describes."""
    md = warmup.warm_metadata(decode, prefill, context, reqs,
                              torch.zeros(decode + reqs, 4, dtype=torch.int32), 16, "cpu")
    q_lens = [1] * decode
    if reqs:
        share = prefill // reqs
        q_lens += [share] * (reqs - 1) + [prefill - share * (reqs - 1)]
    seq_lens = md.seq_lens.tolist()
    assert seq_lens[-1] == context and md.max_seq_len == context
    ref = _builder_metadata(q_lens, seq_lens, 16)
    assert md.num_actual_tokens == ref.num_actual_tokens == decode + prefill
    assert md.token_req.tolist() == ref.token_req.tolist()
    assert md.token_pos.tolist() == ref.token_pos.tolist()
    assert md.num_decode_tokens == ref.num_decode_tokens == decode
    assert md.max_seq_len == ref.max_seq_len
    assert md.prefill_chunks == ref.prefill_chunks
    assert md.slot_mapping.tolist() == [-1] * md.num_actual_tokens   # writes nothing


def _cpu_layer(kv_fp8: bool):
    """A sparse layer's parts on CPU: 4 query heads over 2 KV heads, 32-token sparse
    blocks of two 16-token pages, top-4 blocks, 8 KV pages per request."""
    impl = MiniMaxM3SparseImpl(4, 16, 0.25, 2, kv_cache_dtype="fp8" if kv_fp8 else "auto",
                               sparse_block=32, topk_blocks=4)
    impl.dense_prefix_min_tokens = 24
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(40, 2, 16, 2, 16, generator=g)
    kv = kv.to(torch.float8_e4m3fn) if kv_fp8 else kv.to(torch.bfloat16)
    index_cache = SimpleNamespace(kv_cache=torch.randn(40, 16, 8, generator=g).bfloat16(),
                                  index_dim=8)
    return SimpleNamespace(impl=impl, kv_cache=kv, index_cache=index_cache,
                           _k_scale=torch.ones(()), _v_scale=torch.ones(()))


@pytest.mark.parametrize("kv_fp8", [False, True])
def test_the_walk_runs_the_impls_forward_and_leaves_the_caches_alone(kv_fp8):
    """Every plan entry of a small engine (64-token budget, 4 sequences, 256-token
    model length) through the Impl's forward with the PyTorch reference ops (CPU):
    decode, prefill with and without a dense prefix, mixed and two-request batches
    run, write their output rows, and leave the K/V and index caches as they were."""
    layer = _cpu_layer(kv_fp8)
    kv, index = layer.kv_cache.clone(), layer.index_cache.kv_cache.clone()
    forward = warmup._Forward(layer, torch.bfloat16, 64 + 4, 256)
    plan = warmup.compile_plan(64, 4, 256, forward.layout)
    assert any(p[1] >= 24 and p[2] == p[1] for p in plan)      # a dense-prefix batch
    for p in plan:
        forward.out.fill_(float("nan"))
        forward.q.normal_()
        forward.run(*p)
        t = p[0] + p[1]
        assert torch.isfinite(forward.out[:t].float()).all(), p
    for case in warmup.warm_cases(64, 4, 256):
        forward.run_case(*case)
    assert torch.equal(layer.kv_cache.view(torch.uint8), kv.view(torch.uint8))
    assert torch.equal(layer.index_cache.kv_cache, index)


def test_nothing_to_warm_off_the_gpu_or_for_another_model():
    layer = _cpu_layer(False)
    model = torch.nn.Module()
    assert warmup.msa_layer(model) is None
    assert not warmup.sparse_impl_warmup(model, None)
    fake = warmup.MiniMaxM3SparseAttention.__new__(warmup.MiniMaxM3SparseAttention)
    torch.nn.Module.__init__(fake)
    fake.kv_cache = layer.kv_cache                              # a CPU cache
    model.add_module("attn", fake)
    assert warmup.msa_layer(model) is fake
    assert not warmup.sparse_impl_warmup(model, None)


def test_kernel_warmup_runs_the_m3_warmups_for_m3_only(monkeypatch):
    """vLLM's kernel_warmup ends with minimax_m3_warmup: for a model with MSA layers
    the fused-MoE passes, the slot-mapping kernel, then the MSA kernels; nothing
    for another model or with VLLM_MINIMAX_M3_COMPILE_WARMUP=0."""
    import vllm.model_executor.warmup.kernel_warmup as kw
    import vllm.models.minimax_m3.common.moe_warmup as moe
    import vllm.models.minimax_m3.common.slot_mapping_warmup as slots

    order = []
    monkeypatch.setattr(moe, "moe_warmup", lambda w: order.append("moe"))
    monkeypatch.setattr(slots, "slot_mapping_warmup", lambda r: order.append(("slots", r)))
    monkeypatch.setattr(warmup, "sparse_impl_warmup",
                        lambda m, c: order.append(("msa", c)) or True)
    sparse = warmup.MiniMaxM3SparseAttention.__new__(warmup.MiniMaxM3SparseAttention)
    model = SimpleNamespace(modules=lambda: [sparse])
    worker = SimpleNamespace(get_model=lambda: model, model_runner="runner",
                             vllm_config="config")
    kw.minimax_m3_warmup(worker)
    assert order == ["moe", ("slots", "runner"), ("msa", "config")]
    order.clear()
    kw.minimax_m3_warmup(SimpleNamespace(get_model=lambda: torch.nn.Linear(1, 1)))
    assert order == []
    monkeypatch.setenv("VLLM_MINIMAX_M3_COMPILE_WARMUP", "0")   # the knob turns it off
    kw.minimax_m3_warmup(worker)
    assert order == []
    monkeypatch.setenv("VLLM_MINIMAX_M3_COMPILE_WARMUP", "yes")
    with pytest.raises(ValueError, match="VLLM_MINIMAX_M3_COMPILE_WARMUP must be 0 or 1"):
        kw.minimax_m3_warmup(worker)


def test_a_failing_warmup_is_named_and_does_not_stop_the_engine(monkeypatch):
    """An error inside the warm-ups (a launcher bug, an out-of-memory) becomes one
    warning naming it and the knob; the engine starts and compiles on first use."""
    import vllm.model_executor.warmup.kernel_warmup as kw
    import vllm.models.minimax_m3.common.moe_warmup as moe
    import vllm.models.minimax_m3.common.slot_mapping_warmup as slots

    def fail(model, config):
        raise torch.OutOfMemoryError("CUDA out of memory")

    warnings = []
    monkeypatch.setattr(moe, "moe_warmup", lambda w: None)
    monkeypatch.setattr(slots, "slot_mapping_warmup", lambda r: None)
    monkeypatch.setattr(warmup, "sparse_impl_warmup", fail)
    monkeypatch.setattr(kw.logger, "warning", lambda msg, *a: warnings.append(msg % a))
    sparse = warmup.MiniMaxM3SparseAttention.__new__(warmup.MiniMaxM3SparseAttention)
    kw.minimax_m3_warmup(SimpleNamespace(get_model=lambda: SimpleNamespace(
        modules=lambda: [sparse]), model_runner=None, vllm_config=None))
    assert len(warnings) == 1
    assert "OutOfMemoryError: CUDA out of memory" in warnings[0]
    assert "VLLM_MINIMAX_M3_COMPILE_WARMUP=0" in warnings[0]


def test_moe_warmup_runs_v023s_dummy_pass_signature():
    """The MoE warm-up passes num_tokens, skip_eplb and is_profile to the runner's
    _dummy_run: v0.23.0's runner takes them."""
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    params = inspect.signature(GPUModelRunner._dummy_run).parameters
    assert {"num_tokens", "skip_eplb", "is_profile"} <= set(params)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="counts Triton compiles of a served tiny model: needs a GPU")
def test_requests_compile_no_kernel_after_start(tmp_path):
    """A tiny M3 with graphs: after engine start, prompts of new lengths (token tiles,
    block-major, dense prefix, chunked into mixed batches) compile no Triton kernel."""
    from minimax_m3_utils import build_checkpoint, run_vllm

    model = build_checkpoint(str(tmp_path / "ckpt"), max_position_embeddings=4096)
    g = torch.Generator().manual_seed(1)
    lens = [5, 77, 1000, 1031, 2500, 3000]
    prompts = [torch.randint(10, 200, (n,), generator=g).tolist() for n in lens]
    # dense prefixes from 48-token chunks (the tiny model attends 64 tokens densely)
    res = run_vllm(str(tmp_path / "run"), model, prompts, 24, graphs=True, count_compiles=True,
                   env={"VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS": "48"},
                   llm_kwargs=dict(max_model_len=4096, max_num_batched_tokens=2048,
                                   max_num_seqs=8, block_size=16,
                                   kv_cache_memory_bytes=256 << 20))
    assert "error" not in res, res.get("log", res)[-4000:]
    assert res["compiles_at_start"] > 0                       # the hook saw start-up
    assert res["compiles_in_requests"] == [], res["compiles_in_requests"]
