# SPDX-License-Identifier: Apache-2.0
"""The FP8-KV rounding probe (benchmarks/engine_ab/fp8_rounding_probe.py): its rounding
reaches the sparse layers' P.V product only, and leaves transformers as it found it."""

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
pytest.importorskip("transformers.models.minimax_m3_vl")

from benchmarks.engine_ab.fp8_rounding_probe import rounded_probabilities  # noqa: E402
from minimax_m3_utils import hf_token_logprobs  # noqa: E402
from upstream_checkpoint import build_upstream_checkpoint  # noqa: E402

PROMPT = [3 + (7 * i) % 500 for i in range(160)]


def test_rounds_p_in_sparse_layers_only(tmp_path):
    import transformers.models.minimax_m3_vl.modeling_minimax_m3_vl as hf_mod

    hf, _ = build_upstream_checkpoint(str(tmp_path / "ckpt"))
    model = hf_mod.MiniMaxM3SparseForConditionalGeneration.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager").eval()
    plain = hf_mod.eager_attention_forward
    exact = hf_token_logprobs(model, PROMPT)
    calls = []
    setting = {"p": torch.bfloat16}
    with rounded_probabilities(setting):
        wrapped = hf_mod.eager_attention_forward

        def spy(module, *args, **kwargs):
            out, p = wrapped(module, *args, **kwargs)
            calls.append((module.indexer is not None, torch.equal(p, p.to(torch.bfloat16).float())))
            return out, p

        hf_mod.eager_attention_forward = spy
        rounded = hf_token_logprobs(model, PROMPT)
        setting["p"] = None
        unrounded = hf_token_logprobs(model, PROMPT)
        hf_mod.eager_attention_forward = wrapped
    assert hf_mod.eager_attention_forward is plain
    first = calls[:len(calls) // 2]
    assert [s for s, _ in first] == [False, True, True, True]   # dense, then 3 sparse
    assert all(bf16 for sparse, bf16 in first if sparse)        # P rounded there
    assert not any(bf16 for sparse, bf16 in first if not sparse)  # not in the dense layer
    assert unrounded == exact                                    # p=None: transformers' own
    diff = (torch.tensor(rounded) - torch.tensor(exact)).abs()
    assert 0 < diff.mean().item() < 0.1, diff.mean().item()
