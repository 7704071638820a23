"""The oracles the v0.26.0 flavor's GPU A/B tests compare against (upstream_checkpoint.py),
checked on CPU: transformers' MiniMax-M3 with an FP8 KV cache emulated (``fp8_kv_cache``)."""

import pytest
import torch
from minimax_m3_utils import hf_token_logprobs
from upstream_checkpoint import bf16_index_keys, build_upstream_checkpoint, fp8_kv_cache

pytest.importorskip("transformers.models.minimax_m3_vl")

PROMPT = [3 + (7 * i) % 500 for i in range(200)]


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    return build_upstream_checkpoint(str(tmp_path_factory.mktemp("oracle")))[0]


def test_fp8_kv_oracle_attends_fp8_representable_keys_and_values(hf_checkpoint, monkeypatch):
    import transformers.models.minimax_m3_vl.modeling_minimax_m3_vl as hf_mod

    seen = []
    plain = hf_mod.eager_attention_forward

    def spy(module, query, key, value, *args, **kwargs):
        seen.append((key, value))
        return plain(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(hf_mod, "eager_attention_forward", spy)   # under the oracle's wrapper
    with bf16_index_keys() as hf_cls:
        model = hf_cls.from_pretrained(hf_checkpoint, dtype=torch.float32,
                                       attn_implementation="eager").eval()
        exact = hf_token_logprobs(model, PROMPT)
        n_layers = len(seen)
        with fp8_kv_cache():
            rounded = hf_token_logprobs(model, PROMPT)
    assert n_layers == 4 and len(seen) == 2 * n_layers   # every layer, dense and sparse
    for key, value in seen[n_layers:]:
        for t in (key, value):
            assert torch.equal(t, t.to(torch.float8_e4m3fn).to(t.dtype))
    assert not torch.equal(seen[0][0], seen[n_layers][0])  # the plain run was not rounded
    diff = (torch.tensor(exact) - torch.tensor(rounded)).abs()
    assert 0 < diff.mean().item() < 5, diff.mean().item()
    assert hf_mod.eager_attention_forward is spy          # restored on exit


def test_fp8_kv_oracle_refuses_values_beyond_e4m3(hf_checkpoint):
    import transformers.models.minimax_m3_vl.modeling_minimax_m3_vl as hf_mod

    with fp8_kv_cache():
        q = torch.zeros(1, 1, 2, 128)
        k = torch.full((1, 1, 2, 128), 1000.0)
        with pytest.raises(ValueError, match="exceeds e4m3"):
            hf_mod.eager_attention_forward(None, q, k, k, None, 1.0)
