# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 through the engine at one TP4 rank's attention shapes.

16 query heads on 1 KV head, head_dim 128, sparse block 128, one index head of
128: the shapes at which the H200 runs prefill attention in the sm_90 Gluon
block-major kernel (``sm90_block_major_supported``), which the other engine
tests' tiny configs (head_dim 32) never reach.  One 1100-token prompt is a
single chunk of at least 1024 prefill tokens, so the default layout rule
(``default_prefill_layout``) takes block-major; with top-2 of 9 blocks
selection is active.  Layers, MLPs and vocabulary stay tiny.

* bf16: teacher-forced logprobs as close to transformers' fp32 as
  transformers' own bf16 run is (the criterion of ``test_minimax_m3.py``);
  on sm_90 the engine's process must have compiled the Gluon kernel (it ran).
* fp8 KV cache, scalar and per-token-head scales: teacher-forced logprobs
  against the bf16-cache engine, the per-token-head engine within twice the
  scalar one's mean difference + 0.05 (the criterion of
  ``test_minimax_m3_fp8_kv.py``), and on sm_90 the Gluon kernel compiled for
  both scale modes.

Skipped without CUDA: on the CPU the sparse layers run the PyTorch reference,
which the tiny-config tests already compare with transformers.
``M3_TEST_PRODUCTION_HEADS=1`` runs the bf16 test on the CPU anyway (checks
the test itself).  On the H200: ``ci/gpu_series_tests.sh`` suite
``production_heads``.
"""

import os

import pytest
import torch

from minimax_m3_utils import build_checkpoint, hf_token_logprobs, needs_fp8_kv_engine, run_vllm

pytest.importorskip("transformers.models.minimax_m3_vl")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() or os.environ.get("M3_TEST_PRODUCTION_HEADS") == "1"),
    reason="exercises the GPU kernels at production head shapes (the CPU runs the reference "
           "backend, covered by the tiny-config tests); on the H200: ci/gpu_series_tests.sh "
           "production_heads, or M3_TEST_PRODUCTION_HEADS=1 here")

PROMPT_LEN = 1100
SPARSE_BLOCK = 128
BF16_REL, BF16_ABS, BF16_MEDIAN = 1.5, 0.02, 0.15  # as test_minimax_m3.py
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
# the sm_90 Gluon kernels' compiled variants in the engine's process: the
# block-major attention and the prefill index scoring (0: not imported or never run)
PROBE = '''
def probe(model):
    from vllm.models.minimax_m3.common.triton_ops import indexer, sparse_attn_block_major_sm90 as m

    def compiled(kernel):
        if kernel is None:
            return 0
        return sum(len(cache[0]) for cache in kernel.device_caches.values())

    return {"block_major": compiled(m.sparse_attn_block_major_sm90_kernel),
            "index": compiled(indexer.index_block_max_prefill_sm90_kernel)}
'''


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(
        str(tmp_path_factory.mktemp("m3heads") / "ckpt"), sparse_block=SPARSE_BLOCK, topk=2,
        num_attention_heads=16, num_key_value_heads=1, head_dim=128, rotary_dim=64,
        index_n_heads=1, index_head_dim=128, max_position_embeddings=2048)


@pytest.fixture(scope="module")
def prompt():
    g = torch.Generator().manual_seed(2024)
    return torch.randint(3, 500, (PROMPT_LEN,), generator=g).tolist()


def _run(tmp, ckpt, prompt, **llm):
    # dense layer 0's cache stays bf16, so only the sparse layers' caches differ
    kw = dict(dtype="bfloat16", block_size=64, max_model_len=2048, max_num_seqs=1,
              max_num_batched_tokens=2048, enable_prefix_caching=False,
              kv_cache_dtype_skip_layers=["0"], **llm)
    res = run_vllm(str(tmp), ckpt, [prompt], 1, llm_kwargs=kw, prompt_logprobs=0, probe=PROBE)
    assert "error" not in res, res.get("traceback", res)
    return res


def _logprobs(res) -> torch.Tensor:
    return torch.tensor(res["rounds"][0][0]["prompt_logprobs"][1:])


def test_bf16_block_major_matches_transformers(ckpt, prompt, tmp_path):
    from transformers.models.minimax_m3_vl import MiniMaxM3SparseForConditionalGeneration

    res = _run(tmp_path / "bf16", ckpt, prompt)
    if SM90:
        assert res["probe"]["block_major"] > 0, "the sm_90 block-major kernel did not run"
        assert res["probe"]["index"] > 0, "the sm_90 prefill index kernel did not run"
    got = _logprobs(res)
    ref32, ref16 = (torch.tensor(hf_token_logprobs(
        MiniMaxM3SparseForConditionalGeneration.from_pretrained(ckpt, dtype=dt).eval(), prompt))
        for dt in (torch.float32, torch.bfloat16))
    assert got.shape == ref32.shape == (PROMPT_LEN - 1,)
    vllm_err = (got - ref32).abs().mean().item()
    hf_err = (ref16 - ref32).abs().mean().item()
    assert vllm_err <= BF16_REL * hf_err + BF16_ABS, (vllm_err, hf_err)
    assert (got - ref16).abs().median().item() < BF16_MEDIAN, (got - ref16).abs()


@needs_fp8_kv_engine
def test_fp8_kv_block_major_close_to_bf16_cache(ckpt, prompt, tmp_path):
    runs = {name: _run(tmp_path / name, ckpt, prompt, **llm) for name, llm in (
        ("bf16", {}), ("scalar", dict(kv_cache_dtype="fp8")),
        ("pth", dict(kv_cache_dtype="fp8",
                     hf_overrides={"msa_kv_cache_scales": "per_token_head"})))}
    if SM90:
        for name, res in runs.items():
            assert res["probe"]["block_major"] > 0, f"{name}: sm_90 block-major did not run"
            assert res["probe"]["index"] > 0, f"{name}: the sm_90 prefill index did not run"
    ref = _logprobs(runs["bf16"])
    scalar = (_logprobs(runs["scalar"]) - ref).abs().mean().item()
    pth = (_logprobs(runs["pth"]) - ref).abs().mean().item()
    assert pth != scalar  # the scales are applied
    assert pth < 2 * scalar + 0.05, f"per-token-head {pth:.4f} vs scalar {scalar:.4f}"
