"""The v0.26.0 flavor on a GPU: upstream's MSA kernels (A) against the series' (B) on
one install, same checkpoint, same prompts (skips without a GPU; run on the H200 by
ci/gpu_engine_ab.sh with RUN_TESTS=1)."""

import os

import pytest
import torch
from minimax_m3_utils import run_vllm
from upstream_checkpoint import build_upstream_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="upstream's MSA kernels (side A) need a GPU")


def _engine(tmp_path, released, side, prompts, monkeypatch, **kw):
    monkeypatch.setenv("VLLM_MINIMAX_M3_MSA", side)
    res = run_vllm(str(tmp_path / side), released, prompts, max_tokens=8, prompt_logprobs=0,
                   llm_kwargs=dict(dtype="bfloat16", block_size=128, max_model_len=1024,
                                   language_model_only=True, enable_prefix_caching=False,
                                   max_num_batched_tokens=256, enable_chunked_prefill=True,
                                   **kw))
    assert "error" not in res, res.get("traceback", "") + res.get("log", "")[-4000:]
    return res["rounds"][0]


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_series_msa_matches_upstreams_kernels(tmp_path, monkeypatch, kv):
    """bf16 engines, prompts of 3-7 sparse blocks with top-2 selected, chunked prefill:
    the two kernel sets read the same caches and bf16 index keys, so their prompt
    logprobs agree to bf16 accumulation-order noise and the greedy tokens match."""
    _, released = build_upstream_checkpoint(str(tmp_path / "ckpt"), dtype=torch.bfloat16)
    prompts = [[3 + (7 * i) % 500 for i in range(300)], [5 + (11 * i) % 490 for i in range(850)]]
    a = _engine(tmp_path, released, "upstream", prompts, monkeypatch, kv_cache_dtype=kv)
    b = _engine(tmp_path, released, "series", prompts, monkeypatch, kv_cache_dtype=kv)
    for ra, rb in zip(a, b):
        la = torch.tensor(ra["prompt_logprobs"][1:])
        lb = torch.tensor(rb["prompt_logprobs"][1:])
        diff = (la - lb).abs()
        print(f"kv={kv} len={len(la) + 1} mean|d|={diff.mean():.5f} max|d|={diff.max():.4f} "
              f"tokens A={ra['tokens']} B={rb['tokens']}")
        assert diff.mean().item() < float(os.environ.get("AB_MEAN_TOL", "0.02"))
        assert ra["tokens"] == rb["tokens"]
