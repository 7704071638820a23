# SPDX-License-Identifier: Apache-2.0
"""Helpers for the MiniMax-M3 tests: tiny random checkpoints built with
transformers' MiniMax-M3 classes (the oracle), a legacy-config rewrite, and a
subprocess runner for vLLM engines (each engine in a fresh process)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

N_LAYERS = 4
LAYER_TYPES = ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse", "minimax_m3_sparse"]
MLP_TYPES = ["dense", "sparse", "dense", "sparse"]


def text_config(sparse_block: int = 32, topk: int = 2, **over) -> dict:
    cfg = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # smallest head size vLLM's CPU attention supports
        dense_intermediate_size=48,
        shared_intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        rotary_dim=16,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
        layer_types=list(LAYER_TYPES),
        mlp_layer_types=list(MLP_TYPES),
        index_n_heads=2,
        index_head_dim=32,
        index_block_size=sparse_block,
        index_topk_blocks=topk,
        index_local_blocks=1,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.5,
    )
    cfg.update(over)
    return cfg


def build_checkpoint(path: str, seed: int = 0, dtype=torch.float32, **text_over) -> str:
    """Random tiny MiniMax-M3 (VL wrapper, tiny vision tower) saved by HF."""
    from transformers.models.minimax_m3_vl import (
        MiniMaxM3SparseForConditionalGeneration,
        MiniMaxM3VLConfig,
    )

    vc = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    cfg = MiniMaxM3VLConfig(
        text_config=text_config(**text_over), vision_config=vc, projector_hidden_size=64
    )
    torch.manual_seed(seed)
    model = MiniMaxM3SparseForConditionalGeneration(cfg)
    with torch.no_grad():  # non-trivial norms and routing bias
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.normal_(0.0, 0.1)
    model.to(dtype).save_pretrained(path)
    return path


def to_legacy(src: str, dst: str) -> str:
    """Copy a checkpoint, rewriting text_config into the released legacy keys."""
    shutil.copytree(src, dst)
    p = os.path.join(dst, "config.json")
    cfg = json.load(open(p))
    t = cfg["text_config"]
    rope = t.pop("rope_parameters")
    t["rope_theta"] = rope["rope_theta"]
    t["partial_rotary_factor"] = rope["partial_rotary_factor"]
    t["hidden_act"] = "swigluoai"
    t["sparse_attention_config"] = {
        "use_sparse_attention": True,
        "sparse_index_dim": t.pop("index_head_dim"),
        "sparse_num_index_heads": t.pop("index_n_heads"),
        "sparse_topk_blocks": t.pop("index_topk_blocks"),
        "sparse_block_size": t.pop("index_block_size"),
        "sparse_local_block": t.pop("index_local_blocks"),
        "sparse_init_block": 0,
        "sparse_score_type": "max",
        "sparse_disable_index_value": True,
        "sparse_attention_freq": [int(x == "minimax_m3_sparse") for x in t.pop("layer_types")],
    }
    t["moe_layer_freq"] = [int(x == "sparse") for x in t.pop("mlp_layer_types")]
    t.update(
        use_gemma_norm=True,
        qk_norm_type="per_head",
        scoring_func="sigmoid",
        use_routing_bias=True,
        n_shared_experts=1,
    )
    json.dump(cfg, open(p, "w"), indent=2)
    return dst


_RUNNER = textwrap.dedent(
    """
    import json, sys
    spec = json.load(open(sys.argv[1]))
    out = {}
    try:
        from vllm import LLM, SamplingParams
        kw = dict(gpu_memory_utilization=0.3, kv_cache_memory_bytes=64 << 20)
        kw.update(spec["llm_kwargs"])
        if spec.get("setup"):  # source run in the engine's process before it starts
            exec(spec["setup"], {})
        if spec.get("graphs"):  # torch.compile + FULL_AND_PIECEWISE CUDA graphs
            kw.setdefault("compilation_config", {"cudagraph_mode": "FULL_AND_PIECEWISE"})
        compiled = []
        if spec.get("count_compiles"):  # Triton kernels compiled, by name, in order
            from triton import knobs
            previous = knobs.runtime.jit_post_compile_hook
            def _compiled(**hook_kw):
                compiled.append(getattr(hook_kw.get("fn"), "name", str(hook_kw.get("fn"))))
                return previous(**hook_kw) if previous is not None else None
            knobs.runtime.jit_post_compile_hook = _compiled
        llm = LLM(model=spec["model"], skip_tokenizer_init=True,
                  enforce_eager=not spec.get("graphs"), **kw)
        at_start = len(compiled)
        res = []
        for rnd in range(spec.get("rounds", 1)):
            sp = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0,
                                logprobs=spec.get("top_logprobs", 0),
                                prompt_logprobs=spec.get("prompt_logprobs"),
                                detokenize=False)
            outs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], sp)
            r = []
            for o in outs:
                c = o.outputs[0]
                item = {"tokens": list(c.token_ids),
                        "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]}
                if spec.get("top_logprobs"):
                    item["top"] = [{str(k): v.logprob for k, v in lp.items()} for lp in c.logprobs]
                if o.prompt_logprobs is not None:
                    item["prompt_logprobs"] = [
                        None if lp is None else lp[t].logprob
                        for lp, t in zip(o.prompt_logprobs, o.prompt_token_ids)]
                r.append(item)
            res.append(r)
        out["rounds"] = res
        if spec.get("count_compiles"):
            out["compiles_at_start"] = at_start
            out["compiles_in_requests"] = compiled[at_start:]
        if spec.get("preemption_probe"):
            out["preemptions"] = sum(
                getattr(m, "value", 0) for m in llm.get_metrics()
                if m.name == "vllm:num_preemptions")
        if spec.get("moe_probe"):
            def _probe(model):
                from vllm.models.minimax_m3.common.layers import MiniMaxM3MoE
                return [
                    {"fused": bool(m.fuse_shared_expert),
                     "shared_mlp": m.shared_experts is not None,
                     "experts": int(m.experts.w13_weight.shape[0])}
                    for m in model.modules() if isinstance(m, MiniMaxM3MoE)]
            out["moe_probe"] = llm.apply_model(_probe)[0]
        if spec.get("probe"):  # source defining probe(model) -> JSON-able value
            ns = {}
            exec(spec["probe"], ns)
            out["probe"] = llm.apply_model(ns["probe"])[0]
        if spec.get("mm_probe"):
            from PIL import Image
            try:
                llm.generate({"prompt_token_ids": spec["prompts"][0],
                              "multi_modal_data": {"image": Image.new("RGB", (28, 28))}},
                             SamplingParams(max_tokens=1))
                out["mm_probe"] = "accepted"
            except Exception as e:
                out["mm_probe"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # reported to the test
        import traceback
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
    json.dump(out, open(sys.argv[2], "w"))
    """
)


def fp8_kv_engines_run_here() -> bool:
    """Whether a vLLM engine here takes an FP8 KV cache: on the GPU always; on
    the CPU its attention backend needs x86 with AVX-512 or AMX (it raises
    NotImplementedError otherwise, ``cpu_attn._get_attn_isa``)."""
    return (torch.cuda.is_available() or torch.cpu._is_avx512_supported()
            or torch.cpu._is_amx_tile_supported())


# for tests that run engines with an FP8 KV cache
needs_fp8_kv_engine = pytest.mark.skipif(
    not fp8_kv_engines_run_here(),
    reason="vLLM's CPU attention needs AVX-512 or AMX for an FP8 KV cache; this CPU has "
           "neither (the GPU suites run these tests)")


def graphs_requested() -> bool:
    """``M3_TEST_GRAPHS=1``: engines compile the model and use vLLM's default
    CUDA-graph mode (FULL_AND_PIECEWISE) instead of running eagerly."""
    return os.environ.get("M3_TEST_GRAPHS", "0") == "1"


def run_vllm(workdir: str, model: str, prompts, max_tokens: int, timeout=600,
             env: dict | None = None, **kw):
    """Run one vLLM engine in a fresh process; returns the runner's JSON.
    ``graphs=True`` (default: ``M3_TEST_GRAPHS``) compiles and captures graphs;
    ``env`` adds environment variables for that process."""
    os.makedirs(workdir, exist_ok=True)
    kw.setdefault("graphs", graphs_requested())
    spec = dict(
        model=model,
        prompts=prompts,
        max_tokens=max_tokens,
        llm_kwargs=kw.pop("llm_kwargs"),
        **kw,
    )
    spec_p, out_p, run_p = (os.path.join(workdir, n) for n in ("spec.json", "out.json", "run.py"))
    json.dump(spec, open(spec_p, "w"))
    open(run_p, "w").write(_RUNNER)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", **(env or {}))
    proc = subprocess.run(
        [sys.executable, run_p, spec_p, out_p],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if not os.path.exists(out_p):
        raise RuntimeError(f"vLLM runner died (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.load(open(out_p))
    if "error" in res:  # worker processes report their errors only in the log
        res["log"] = proc.stdout[-20000:] + proc.stderr[-20000:]
    return res


def hf_greedy(model, prompt, n_new: int):
    """Greedy decoding by full forward passes; returns (tokens, logprobs)."""
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            lp = logits.float().log_softmax(-1)
            t = int(lp.argmax())
            ids.append(t)
            lps.append(float(lp[t]))
    return ids[len(prompt):], lps


def hf_token_logprobs(model, seq):
    """Teacher-forced logprob of seq[i] given seq[:i], for i >= 1."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0].float()
    lp = logits.log_softmax(-1)
    return [float(lp[i - 1, seq[i]]) for i in range(1, len(seq))]


# The tiny checkpoints' tokenizer: one builder, shared with the demo (tiny_m3/, at the
# repository root).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tiny_m3.tokenizer import CHAT_TEMPLATE, build_tokenizer  # noqa: E402,F401


# ------------------------------------------------------ checkpoint layouts
# The tensor layouts a MiniMax-M3 checkpoint can come in, all built here from
# transformers' in-memory model (independently of the installed transformers'
# save_pretrained): "state_dict" (transformers' module names: fused gate/up,
# stacked experts), "released" (the released checkpoint names, also what
# transformers 5.24 writes) and "transformers_5_17" (what 5.17 writes: the
# released names, but a dense layer's MLP under block_sparse_moe.).
LAYOUTS = ("state_dict", "released", "transformers_5_17")


def hf_state_dict(model) -> dict:
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def released_from_state_dict(sd: dict) -> dict:
    """transformers' in-memory names -> released checkpoint names (text only)."""
    out = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            out["language_model.lm_head.weight"] = v
            continue
        if not k.startswith("model.language_model."):
            continue  # vision tower / projector
        k = "language_model.model." + k[len("model.language_model."):]
        k = k.replace(".self_attn.indexer.", ".self_attn.index_")
        if ".mlp.experts.gate_up_proj" in k:
            base = k.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.")
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.w1.weight"] = v[e, :inter].contiguous()
                out[f"{base}{e}.w3.weight"] = v[e, inter:].contiguous()
        elif ".mlp.experts.down_proj" in k:
            base = k.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.")
            for e in range(v.shape[0]):
                out[f"{base}{e}.w2.weight"] = v[e].contiguous()
        elif k.endswith(".mlp.gate.e_score_correction_bias"):
            out[k.replace(".mlp.gate.", ".block_sparse_moe.")] = v
        elif ".mlp.gate." in k or ".mlp.shared_experts." in k:
            k = k.replace(".mlp.", ".block_sparse_moe.")
            if k.endswith(".gate_up_proj.weight"):
                inter = v.shape[0] // 2
                out[k.replace("gate_up_proj", "gate_proj")] = v[:inter].contiguous()
                out[k.replace("gate_up_proj", "up_proj")] = v[inter:].contiguous()
            else:
                out[k] = v
        elif k.endswith(".mlp.gate_up_proj.weight"):  # dense MLP
            inter = v.shape[0] // 2
            out[k.replace("gate_up_proj", "gate_proj")] = v[:inter].contiguous()
            out[k.replace("gate_up_proj", "up_proj")] = v[inter:].contiguous()
        else:
            out[k] = v
    return out


def layout_tensors(sd: dict, layout: str) -> dict:
    if layout == "state_dict":
        return dict(sd)
    rel = released_from_state_dict(sd)
    if layout == "released":
        return rel
    if layout == "transformers_5_17":
        return {k.replace(".mlp.", ".block_sparse_moe."): v for k, v in rel.items()}
    raise ValueError(layout)


def write_layout(src: str, dst: str, sd: dict, layout: str) -> str:
    """Checkpoint dir ``dst`` = config of ``src`` + ``sd`` in ``layout``."""
    from safetensors.torch import save_file

    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    save_file(layout_tensors(sd, layout), os.path.join(dst, "model.safetensors"))
    return dst


def load_weights_copy_rest(src: str, dst: str) -> dict:
    """The tensors of checkpoint ``src``; every other file but config.json (and the
    safetensors index, and folders) is copied to ``dst`` (created). What a
    checkpoint converter starts from: it then writes its own weights and config."""
    from safetensors.torch import load_file

    os.makedirs(dst, exist_ok=True)
    tensors: dict = {}
    for f in sorted(os.listdir(src)):
        p = os.path.join(src, f)
        if f.endswith(".safetensors"):
            tensors.update(load_file(p))
        elif f != "config.json" and not os.path.isdir(p) and not f.endswith(".index.json"):
            shutil.copy(p, dst)
    return tensors


def read_checkpoint(path: str) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out
