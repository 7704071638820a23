# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 in vLLM vs transformers' MiniMax-M3 (the oracle), on CPU.

Tiny random checkpoints are built here with transformers' classes (4 layers:
dense + MSA sparse attention, dense MLP + MoE; sparse block 32, top-2 blocks),
saved in the transformers form and rewritten into the released legacy form.
A 150-token prompt spans 5 blocks, so block selection is active (the test
shows dense attention would give other tokens).

Engines run in subprocesses (one fresh process each, shared per module):
  A  normalized form, fp32, page 16, chunked prefill (max_num_batched_tokens=64)
  B  legacy form, fp32, page 32, no chunking, prefix caching on, two rounds
  C  normalized form, bf16, page 32
  F  as A with the shared expert fused into FusedMoE
     (hf_overrides={"fuse_shared_expert": True})
  plus one fp32 engine per non-released tensor layout (transformers' in-memory
  state_dict; transformers 5.17's save_pretrained names) on the long prompt.
Checkpoints come from whichever transformers is installed (>= 5.17); the
layout tests make every run cover the other versions' on-disk layouts too.
Tolerances: fp32 chosen-token logprobs within 1e-3 of transformers (measured
~1e-5); bf16 teacher-forced logprobs: mean abs error vs the fp32 oracle at
most 1.5x transformers' own bf16 error + 0.02, median abs diff to transformers
bf16 below 0.15.
"""

import json
import os

import pytest
import torch

from minimax_m3_utils import (
    LAYER_TYPES,
    LAYOUTS,
    MLP_TYPES,
    N_LAYERS,
    build_checkpoint,
    hf_greedy,
    hf_state_dict,
    hf_token_logprobs,
    layout_tensors,
    read_checkpoint,
    run_vllm,
    text_config,
    to_legacy,
    write_layout,
)

pytest.importorskip("transformers.models.minimax_m3_vl")

SPARSE_BLOCK = 32
MAX_NEW = 8
PROMPT_LENS = [5, 32, 64, 150]  # < block, at 1 and 2 block boundaries, 5 blocks
# fp32 logprob tolerance. On CPU everything is true fp32 (measured diffs ~1e-5). On a GPU
# the Triton kernels (vLLM's fused MoE and our MSA kernels) run fp32 dots at tf32 precision
# (Triton's default input precision on NVIDIA), which moved logprobs by up to 0.012 on the
# H200 with identical greedy tokens (the GPU suites' parity run).
FP32_TOL = 3e-2 if torch.cuda.is_available() else 1e-3
BF16_REL, BF16_ABS, BF16_MEDIAN = 1.5, 0.02, 0.15


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("m3")
    norm = build_checkpoint(str(d / "normalized"), sparse_block=SPARSE_BLOCK)
    legacy = to_legacy(norm, str(d / "legacy"))
    return {"dir": d, "normalized": norm, "legacy": legacy}


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _hf(path, dtype=torch.float32, **over):
    from transformers.models.minimax_m3_vl import (
        MiniMaxM3SparseForConditionalGeneration,
    )

    return MiniMaxM3SparseForConditionalGeneration.from_pretrained(
        path, dtype=dtype, **over
    ).eval()


@pytest.fixture(scope="module")
def hf_ref(ckpt, prompts):
    m = _hf(ckpt["normalized"])
    return [hf_greedy(m, p, MAX_NEW) for p in prompts]


def _engine(ckpt, name, model, prompts, **kw):
    res = run_vllm(str(ckpt["dir"] / f"run_{name}"), model, prompts, MAX_NEW, **kw)
    assert "error" not in res, res.get("traceback", res)
    return res["rounds"]


ENGINE_A_KW = dict(dtype="float32", block_size=16, max_model_len=256, max_num_seqs=4,
                   max_num_batched_tokens=64, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def engine_a(ckpt, prompts):
    return _engine(ckpt, "a", ckpt["normalized"], prompts, llm_kwargs=ENGINE_A_KW)[0]


# fused shared expert vs. the separate one, same engine settings: equal up to
# float summation order
FUSED_SAME_TOL = 3e-2 if torch.cuda.is_available() else 1e-4


@pytest.fixture(scope="module")
def engine_b(ckpt, prompts):
    kw = dict(dtype="float32", block_size=32, max_model_len=256, max_num_seqs=4,
              max_num_batched_tokens=1024, enable_prefix_caching=True)
    res = run_vllm(str(ckpt["dir"] / "run_b"), ckpt["legacy"], prompts, MAX_NEW,
                   llm_kwargs=kw, rounds=2, mm_probe=True)
    assert "error" not in res, res.get("traceback", res)
    return res


def _check_greedy(outs, hf_ref, lens=PROMPT_LENS):
    assert len(outs) == len(hf_ref)
    for i, (o, (ref_toks, ref_lps)) in enumerate(zip(outs, hf_ref)):
        assert o["tokens"] == ref_toks, f"prompt {i} (len {lens[i]})"
        diff = max(abs(a - b) for a, b in zip(o["logprobs"], ref_lps))
        assert diff < FP32_TOL, f"prompt {i}: logprob diff {diff}"


# --------------------------------------------------------------- end to end


def test_fp32_chunked_prefill_page16_matches_transformers(engine_a, hf_ref):
    _check_greedy(engine_a, hf_ref)


def test_fp32_preemption_and_recompute_match_transformers(ckpt):
    """Four requests whose decodes outgrow a 12-page KV cache: the scheduler preempts one
    and recomputes it later (K/V and index keys alike); every output still equals
    transformers' (80 tokens each: 3 sparse blocks against top-2, selection active)."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 500, (40,), generator=g).tolist() for _ in range(4)]
    kw = dict(ENGINE_A_KW, max_model_len=128, num_gpu_blocks_override=12,
              disable_log_stats=False)
    res = run_vllm(str(ckpt["dir"] / "run_preempt"), ckpt["normalized"], prompts, 40,
                   llm_kwargs=kw, preemption_probe=True)
    assert "error" not in res, res.get("traceback", res)
    assert res["preemptions"] > 0, "the 12-page KV cache should have forced a preemption"
    m = _hf(ckpt["normalized"])
    _check_greedy(res["rounds"][0], [hf_greedy(m, p, 40) for p in prompts], lens=[40] * 4)


def test_fp32_every_layer_sparse_matches_transformers(ckpt, prompts):
    """No dense layer at all (layer 0 sparse too; the bf16 CUDA-graph test on the
    H200 runs this checkpoint so that FlashAttention is out of the picture): the
    engine still equals transformers, chunked prefill with 16-token pages."""
    path = build_checkpoint(str(ckpt["dir"] / "all_sparse"), sparse_block=SPARSE_BLOCK,
                            layer_types=[LAYER_TYPES[-1]] * N_LAYERS)
    assert set(json.load(open(os.path.join(path, "config.json")))["text_config"]
               ["layer_types"]) == {LAYER_TYPES[-1]}
    outs = _engine(ckpt, "all_sparse", path, prompts, llm_kwargs=ENGINE_A_KW)[0]
    m = _hf(path)
    _check_greedy(outs, [hf_greedy(m, p, MAX_NEW) for p in prompts])


def test_fp32_legacy_config_page32_prefix_cache_matches(engine_b, hf_ref):
    first, second = engine_b["rounds"]  # round 2 reuses cached prefix blocks
    _check_greedy(first, hf_ref)
    _check_greedy(second, hf_ref)


def test_fp32_fused_shared_expert_matches(ckpt, prompts, engine_a, hf_ref):
    """Shared expert fused into FusedMoE as expert id num_local_experts
    (option fuse_shared_expert via hf_overrides): same tokens as the default
    engine A and transformers, logprobs equal to A's up to summation order."""
    kw = dict(ENGINE_A_KW, hf_overrides={"fuse_shared_expert": True})
    res = run_vllm(str(ckpt["dir"] / "run_fused"), ckpt["normalized"], prompts,
                   MAX_NEW, llm_kwargs=kw, moe_probe=True)
    assert "error" not in res, res.get("traceback", res)
    # the option took effect: 4 routed + 1 shared expert rows, no separate MLP
    assert res["moe_probe"] == [
        {"fused": True, "shared_mlp": False, "experts": 5}] * MLP_TYPES.count("sparse")
    fused = res["rounds"][0]
    _check_greedy(fused, hf_ref)
    for i, (a, b) in enumerate(zip(engine_a, fused)):
        assert a["tokens"] == b["tokens"], f"prompt {i}"
        diff = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))
        assert diff < FUSED_SAME_TOL, f"prompt {i}: fused vs default {diff}"


def test_image_input_is_refused(engine_b):
    """Served language-model-only: an image must fail loudly, not be ignored."""
    assert engine_b["mm_probe"] != "accepted"
    assert "ValueError" in engine_b["mm_probe"], engine_b["mm_probe"]
    assert "text-only model" in engine_b["mm_probe"], engine_b["mm_probe"]


def test_sparse_selection_changes_the_answer(ckpt, prompts, hf_ref):
    """The same weights with dense attention on every layer answer otherwise
    on the long prompt, so the parity tests above can fail."""
    dense = _hf(ckpt["normalized"])
    dense.config.text_config.layer_types = ["full_attention"] * 4
    for layer in dense.model.language_model.layers:
        layer.self_attn.indexer = None
    long_prompt = prompts[-1]
    dense_toks, _ = hf_greedy(dense, long_prompt, MAX_NEW)
    assert dense_toks != hf_ref[-1][0]
    # Short prompts see at most topk blocks: identical to dense there.
    assert hf_greedy(dense, prompts[0], MAX_NEW)[0] == hf_ref[0][0]


def test_bf16_teacher_forced_logprobs(ckpt, prompts, hf_ref):
    """bf16 through vLLM is as close to the fp32 oracle as transformers' own
    bf16 run is (this random model is very bf16-sensitive: transformers bf16
    vs fp32 differs by up to ~5 nats on single tokens, ~0.15 on average)."""
    seqs = [p + toks for p, (toks, _) in zip(prompts, hf_ref)]
    kw = dict(dtype="bfloat16", block_size=32, max_model_len=256, max_num_seqs=4,
              max_num_batched_tokens=1024, enable_prefix_caching=False)
    outs = _engine(ckpt, "c", ckpt["normalized"], seqs, llm_kwargs=kw,
                   prompt_logprobs=0)[0]
    m32 = _hf(ckpt["normalized"])
    m16 = _hf(ckpt["normalized"], dtype=torch.bfloat16)
    got, ref32, ref16 = [], [], []
    for seq, o in zip(seqs, outs):
        got += o["prompt_logprobs"][1:]
        ref32 += hf_token_logprobs(m32, seq)
        ref16 += hf_token_logprobs(m16, seq)
    got, ref32, ref16 = (torch.tensor(x) for x in (got, ref32, ref16))
    vllm_err = (got - ref32).abs().mean().item()
    hf_err = (ref16 - ref32).abs().mean().item()
    assert vllm_err <= BF16_REL * hf_err + BF16_ABS, (vllm_err, hf_err)
    assert (got - ref16).abs().median().item() < BF16_MEDIAN, (got - ref16).abs()


def test_page_larger_than_sparse_block_is_refused(ckpt, prompts):
    res = run_vllm(
        str(ckpt["dir"] / "run_badpage"),
        ckpt["normalized"],
        prompts[:1],
        1,
        llm_kwargs=dict(dtype="float32", block_size=64, max_model_len=256,
                        max_num_batched_tokens=256),
    )
    assert "error" in res
    assert "must divide the sparse attention block size 32" in res["error"]
    assert "--block-size" in res["error"]


# ------------------------------------------------------ checkpoint layouts


def _normalized(tensors: dict) -> dict:
    from vllm.models.minimax_m3.common.model import (
        MiniMaxM3SparseForCausalLM,
        normalize_checkpoint_weights,
    )

    mapped = MiniMaxM3SparseForCausalLM.hf_to_vllm_mapper.apply(tensors.items())
    out = {}
    for name, w in normalize_checkpoint_weights(mapped, list(MLP_TYPES)):
        if name.startswith(("vision_tower.", "multi_modal_projector.", "patch_merge_mlp.")):
            continue
        assert name not in out, f"{name} produced twice"
        out[name] = w
    return out


def _assert_same_tensors(got: dict, want: dict, what: str):
    assert sorted(got) == sorted(want), (
        what, sorted(set(got) ^ set(want)))
    for k in want:
        assert got[k].shape == want[k].shape and torch.equal(got[k], want[k]), (what, k)


def test_checkpoint_layouts_normalize_identically(ckpt):
    """Every tensor layout transformers (>= 5.17) writes or holds maps onto
    the released names, bit-identically, before vLLM's parameters see it."""
    sd = hf_state_dict(_hf(ckpt["normalized"]))
    want = {k[len("language_model."):]: v
            for k, v in layout_tensors(sd, "released").items()}
    assert any(".block_sparse_moe.experts.0.w3.weight" in k for k in want)
    assert any(".mlp.gate_proj.weight" in k for k in want)
    for layout in LAYOUTS:
        _assert_same_tensors(_normalized(layout_tensors(sd, layout)), want, layout)
    # what the installed transformers' save_pretrained actually wrote
    _assert_same_tensors(_normalized(read_checkpoint(ckpt["normalized"])), want,
                         "save_pretrained")


@pytest.mark.parametrize("layout", ["state_dict", "transformers_5_17"])
def test_checkpoint_layout_end_to_end(ckpt, prompts, hf_ref, layout):
    """The non-released layouts load in vLLM and give transformers' answer."""
    sd = hf_state_dict(_hf(ckpt["normalized"]))
    path = write_layout(ckpt["normalized"], str(ckpt["dir"] / f"layout_{layout}"),
                        sd, layout)
    kw = dict(dtype="float32", block_size=32, max_model_len=256, max_num_seqs=4,
              max_num_batched_tokens=1024, enable_prefix_caching=False)
    outs = _engine(ckpt, f"layout_{layout}", path, prompts[-1:], llm_kwargs=kw)[0]
    _check_greedy(outs, hf_ref[-1:], PROMPT_LENS[-1:])


# ------------------------------------------------------------------- config


def _load_cfg(path):
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3VLConfig

    return MiniMaxM3VLConfig.from_pretrained(path).text_config


def test_config_forms_agree(ckpt):
    a, b = _load_cfg(ckpt["normalized"]), _load_cfg(ckpt["legacy"])
    for key in ("index_n_heads", "index_head_dim", "index_block_size",
                "index_topk_blocks", "index_local_blocks", "layer_types",
                "mlp_layer_types", "index_init_blocks", "mlp_activation"):
        assert getattr(a, key) == getattr(b, key), key
    assert a.rope_parameters["rope_theta"] == b.rope_parameters["rope_theta"]
    assert (a.rope_parameters["partial_rotary_factor"]
            == b.rope_parameters["partial_rotary_factor"])


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(index_n_heads=1), "must equal num_key_value_heads"),
        (dict(index_topk_blocks=0), "index_topk_blocks must be >= 1"),
        (dict(index_block_size=24), "multiple of 16"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                               "partial_rotary_factor": 1.5}), "rotary channels"),
        (dict(rotary_dim=8), "rotary_dim 8 disagrees"),
        (dict(layer_types=["full_attention"] * 3), "entries but num_hidden_layers"),
        (dict(mlp_layer_types=["dense", "moe", "dense", "dense"]), "unknown mlp_layer_types"),
        (dict(index_local_blocks=2, index_topk_blocks=1), "raise topk"),
    ],
)
def test_config_validation_errors(over, match):
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3VLConfig

    with pytest.raises(ValueError, match=match):
        MiniMaxM3VLConfig(text_config=text_config(**over))


def test_legacy_unsupported_keys_error(ckpt, tmp_path):
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3VLConfig

    cfg = json.load(open(os.path.join(ckpt["legacy"], "config.json")))
    t = cfg["text_config"]
    t["sparse_attention_config"]["sparse_score_type"] = "mean"
    with pytest.raises(ValueError, match="sparse_score_type 'mean'"):
        MiniMaxM3VLConfig(text_config=t)
    t["sparse_attention_config"]["sparse_score_type"] = "max"
    t["scoring_func"] = "softmax"
    with pytest.raises(ValueError, match="scoring_func 'softmax'"):
        MiniMaxM3VLConfig(text_config=t)
