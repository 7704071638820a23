# SPDX-License-Identifier: Apache-2.0
"""Optional FP8 index-key cache of the MiniMax-M3 sparse layers.

``--hf-overrides '{"msa_index_cache_dtype": "fp8"}'`` stores each token's
index key in e4m3 scaled by its amax / 448 (each page holds its keys, then
their float32 scales: Didx + 4 bytes per token) and scores blocks with the
dequantised keys: half the bytes of the index scan, which is most of a
long-context decode step. Engines on CPU
(reference ops) in float32 on a tiny checkpoint, 150-token prompt (5 sparse
blocks of 32, top-2: block selection active), against the same engine with the
model-dtype index cache:
  * every sparse layer's index cache is e4m3 with Didx + 4 bytes per token, one
    scale per written token (read through fp8_index_cache_views, the engine's
    view of the packed pages), each written row's largest value is 448;
  * the effect on the model, measured: teacher-forced prompt logprobs stay
    within 0.2 mean |diff| of the model-dtype index cache (measured 0.096 on
    this random model, whose sharp attention turns every flipped near-tied
    block choice into a visible change; the scalar FP8 *KV* cache gives 0.11
    in test_minimax_m3_fp8_kv.py), greedy tokens printed (equal here); a wrong
    scale gives errors of order 1.
A bad value of the option is refused with a clear error.
"""

import pytest
import torch

from minimax_m3_utils import build_checkpoint, run_vllm

pytest.importorskip("transformers.models.minimax_m3_vl")

PROMPT_LEN = 150
FP8_INDEX = {"msa_index_cache_dtype": "fp8"}
PROBE = '''
def probe(model):
    import torch
    from vllm.models.minimax_m3.common.attention import MiniMaxM3SparseAttention
    from vllm.models.minimax_m3.common.sparse_ops import fp8_index_cache_views
    out = []
    for m in model.modules():
        if isinstance(m, MiniMaxM3SparseAttention):
            c = m.index_cache.kv_cache
            d = m.index_cache.index_dim
            info = {"dtype": str(c.dtype), "row": int(c.shape[-1]), "index_dim": d}
            if c.dtype == torch.float8_e4m3fn:
                keys, s = fp8_index_cache_views(c, d)
                written = (s > 0) & torch.isfinite(s)
                info["rows"] = int(written.sum())
                info["amax"] = sorted({float(a) for a in keys.float().abs().amax(-1)[written]})
            out.append(info)
    return out
'''


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("m3idx") / "ckpt"))


def _run(tmp, ckpt, **llm):
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 500, (PROMPT_LEN,), generator=g).tolist()
    kw = dict(dtype="float32", block_size=16, max_model_len=256, enable_prefix_caching=False,
              **llm)
    return run_vllm(str(tmp), ckpt, [prompt], 6, llm_kwargs=kw, prompt_logprobs=0,
                    probe=PROBE)


def test_fp8_index_cache(ckpt, tmp_path):
    base = _run(tmp_path / "auto", ckpt)
    fp8 = _run(tmp_path / "fp8", ckpt, hf_overrides=FP8_INDEX)
    for name, r in (("auto", base), ("fp8", fp8)):
        assert "error" not in r, (name, r.get("traceback", r))
    assert [i["dtype"] for i in base["probe"]] == ["torch.float32"] * 3
    assert len(fp8["probe"]) == 3
    for layer in fp8["probe"]:
        assert layer["dtype"] == "torch.float8_e4m3fn", layer
        assert layer["row"] == layer["index_dim"] + 4, layer
        assert layer["rows"] == PROMPT_LEN + 5, layer  # every written token, once
        assert layer["amax"] == [448.0], layer
    a = base["rounds"][0][0]["prompt_logprobs"][1:]
    b = fp8["rounds"][0][0]["prompt_logprobs"][1:]
    mean_diff = sum(abs(x - y) for x, y in zip(a, b)) / len(a)
    print(f"fp8 index cache: mean |prompt logprob diff| {mean_diff:.4f}; greedy "
          f"{base['rounds'][0][0]['tokens']} (auto) vs {fp8['rounds'][0][0]['tokens']} (fp8)")
    assert 0 < mean_diff < 0.2, mean_diff


def test_bad_index_cache_dtype_is_refused(ckpt, tmp_path):
    res = _run(tmp_path / "bad", ckpt, hf_overrides={"msa_index_cache_dtype": "int4"})
    assert "msa_index_cache_dtype must be one of" in res.get("error", ""), res
