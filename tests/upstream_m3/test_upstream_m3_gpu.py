"""The v0.26.0 flavor on a GPU: upstream's MSA kernels (A) against the series' (B) on
one install, same checkpoint, same prompts (skips without a GPU; run on the H200 by
ci/gpu_engine_ab.sh with RUN_TESTS=1).

Three questions, one test each, so that a difference between A and B can be placed:
  * with every block selected (top-k above the prompt's block count) the selection
    cannot differ: A and B must agree to bf16 accumulation noise;
  * with top-2 selection, is each side as close to transformers (fp32, bf16 index keys)
    as transformers' own bf16 forward is? A side that selects other blocks than the
    oracle on near-ties lands further away;
  * A against B directly with top-2, bf16 and FP8 KV (the strict comparison).
Each prints its numbers (``-s``), recorded in benchmarks/results/engine_ab/."""

import os

import pytest
import torch
from minimax_m3_utils import hf_token_logprobs, run_vllm
from upstream_checkpoint import bf16_index_keys, build_upstream_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="upstream's MSA kernels (side A) need a GPU")

# 300 and 850 tokens: 3 and 7 blocks of 128
PROMPTS = [[3 + (7 * i) % 500 for i in range(300)], [5 + (11 * i) % 490 for i in range(850)]]
AB_MEAN_TOL = float(os.environ.get("AB_MEAN_TOL", "0.02"))


def _engine(workdir, released, side, **kw):
    env = {"VLLM_MINIMAX_M3_MSA": side}
    res = run_vllm(workdir, released, PROMPTS, max_tokens=8, prompt_logprobs=0, env=env,
                   llm_kwargs=dict(dtype="bfloat16", block_size=128, max_model_len=1024,
                                   language_model_only=True, enable_prefix_caching=False,
                                   max_num_batched_tokens=256, enable_chunked_prefill=True,
                                   **kw))
    assert "error" not in res, res.get("traceback", "") + res.get("log", "")[-4000:]
    return res["rounds"][0]


_RUNS: dict = {}


def _sides(tmp_path_factory, topk: int, kv: str):
    """(hf checkpoint, A's rounds, B's rounds) for one checkpoint and KV dtype, once."""
    key = (topk, kv)
    if key not in _RUNS:
        root = tmp_path_factory.mktemp(f"top{topk}-{kv}")
        hf, released = build_upstream_checkpoint(str(root / "ckpt"), dtype=torch.bfloat16,
                                                 topk=topk)
        _RUNS[key] = (hf, _engine(str(root / "a"), released, "upstream", kv_cache_dtype=kv),
                      _engine(str(root / "b"), released, "series", kv_cache_dtype=kv))
    return _RUNS[key]


def _diff(x, y) -> torch.Tensor:
    return (torch.tensor(x, dtype=torch.float64) - torch.tensor(y, dtype=torch.float64)).abs()


def _describe(diff: torch.Tensor) -> str:
    """mean / max, and the first prompt position (1-based target index) that differs by
    more than 0.05, with its 128-token block."""
    big = (diff > 0.05).nonzero()
    first = int(big[0]) + 1 if len(big) else None
    where = f"first > 0.05 at position {first} (block {first // 128})" if first else "none > 0.05"
    return f"mean {diff.mean():.5f} max {diff.max():.4f}, {where}"


def test_without_selection_the_two_kernel_sets_agree(tmp_path_factory):
    """top-16 over prompts of at most 7 blocks: both sides attend every block, so only
    the kernels' arithmetic differs."""
    _, a, b = _sides(tmp_path_factory, 16, "auto")
    for ra, rb in zip(a, b):
        diff = _diff(ra["prompt_logprobs"][1:], rb["prompt_logprobs"][1:])
        print(f"top-16 kv=auto len={len(diff) + 1}: A vs B {_describe(diff)}; "
              f"tokens A={ra['tokens']} B={rb['tokens']}")
        assert diff.mean().item() < AB_MEAN_TOL
        assert ra["tokens"] == rb["tokens"]


def test_each_side_is_as_close_to_transformers_as_its_bf16_forward(tmp_path_factory):
    """top-2, bf16 KV: each side's prompt logprobs against transformers in fp32 (index
    keys rounded to bf16 as upstream stores them), within 1.5 x transformers' own bf16
    error + 0.02 (the bound of the quantized-checkpoint tests)."""
    hf, a, b = _sides(tmp_path_factory, 2, "auto")
    with bf16_index_keys() as hf_cls:
        ref32 = hf_cls.from_pretrained(hf, dtype=torch.float32).eval()
        ref16 = hf_cls.from_pretrained(hf, dtype=torch.bfloat16).eval()
        for i, prompt in enumerate(PROMPTS):
            want = hf_token_logprobs(ref32, prompt)
            own = _diff(hf_token_logprobs(ref16, prompt), want)
            bound = 1.5 * own.mean().item() + 0.02
            errs = {}
            for side, rounds in (("A", a), ("B", b)):
                errs[side] = _diff(rounds[i]["prompt_logprobs"][1:], want)
                print(f"top-2 len={len(prompt)}: {side} vs fp32 oracle {_describe(errs[side])}")
            print(f"top-2 len={len(prompt)}: transformers bf16 vs fp32 {_describe(own)}; "
                  f"bound {bound:.5f}")
            for side, err in errs.items():
                assert err.mean().item() <= bound, (side, err.mean().item(), bound)


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_series_msa_matches_upstreams_kernels(tmp_path_factory, kv):
    """bf16 engines, prompts of 3-7 sparse blocks with top-2 selected, chunked prefill:
    the two kernel sets read the same caches and bf16 index keys, so their prompt
    logprobs agree to bf16 accumulation-order noise and the greedy tokens match."""
    _, a, b = _sides(tmp_path_factory, 2, kv)
    for ra, rb in zip(a, b):
        diff = _diff(ra["prompt_logprobs"][1:], rb["prompt_logprobs"][1:])
        print(f"top-2 kv={kv} len={len(diff) + 1}: A vs B {_describe(diff)}; "
              f"tokens A={ra['tokens']} B={rb['tokens']}")
        assert diff.mean().item() < AB_MEAN_TOL
        assert ra["tokens"] == rb["tokens"]
