#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`make demo`: generate text with the patched vLLM from an embedded tiny
MiniMax-M3 checkpoint, on CPU, with no network.

The checkpoint is built here: random weights saved with transformers'
MiniMax-M3 classes (dense + MSA sparse attention layers, dense MLP + MoE),
and the small byte-level BPE tokenizer of ``tiny_m3.tokenizer``, trained
in-process. Weights are random, so the generated text is noise; what the
demo shows is the whole path working (config, weight loading, paged KV and
index-key caches, chunked prefill, sparse block selection, sampling,
detokenization) and that vLLM's greedy tokens equal transformers'.
"""

import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tiny_m3.tokenizer import build_tokenizer  # noqa: E402

VOCAB = 320
SPARSE_BLOCK = 16


def build_checkpoint(path: str) -> None:
    import torch
    from transformers.models.minimax_m3_vl import (
        MiniMaxM3SparseForConditionalGeneration,
        MiniMaxM3VLConfig,
    )

    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        dense_intermediate_size=48, shared_intermediate_size=32,
        num_local_experts=4, num_experts_per_tok=2, rotary_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5},
        layer_types=["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
        mlp_layer_types=["dense", "sparse", "sparse"],
        index_n_heads=2, index_head_dim=32, index_block_size=SPARSE_BLOCK,
        index_topk_blocks=2, index_local_blocks=1, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.5,
    )
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2)
    cfg = MiniMaxM3VLConfig(text_config=text, vision_config=vision,
                            projector_hidden_size=64)
    torch.manual_seed(0)
    MiniMaxM3SparseForConditionalGeneration(cfg).save_pretrained(path)
    build_tokenizer(path, VOCAB)


def hf_greedy(path: str, prompt_ids: list[int], n: int) -> list[int]:
    import torch
    from transformers.models.minimax_m3_vl import (
        MiniMaxM3SparseForConditionalGeneration,
    )

    m = MiniMaxM3SparseForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32
    ).eval()
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(m(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def main() -> int:
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory(prefix="m3-demo-") as path:
        build_checkpoint(path)
        llm = LLM(
            model=path,
            dtype="float32",
            block_size=SPARSE_BLOCK,
            max_model_len=256,
            max_num_batched_tokens=64,  # long prompts go through chunked prefill
            enforce_eager=True,
            gpu_memory_utilization=0.3,
            kv_cache_memory_bytes=64 << 20,
        )
        prompts = [
            "Hello world,",
            "MiniMax-M3 is a mixture of experts language model with sparse "
            "attention. Each sparse layer scores blocks of earlier tokens with "
            "a small indexer and attends only to the best blocks, plus",
        ]
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        outs = llm.generate(prompts, params)
        ok = True
        for o in outs:
            n_blocks = -(-len(o.prompt_token_ids) // SPARSE_BLOCK)
            print(f"\nprompt ({len(o.prompt_token_ids)} tokens, {n_blocks} "
                  f"sparse blocks): {o.prompt!r}")
            print(f"generated: {o.outputs[0].text!r}")
            ref = hf_greedy(path, o.prompt_token_ids, len(o.outputs[0].token_ids))
            same = list(o.outputs[0].token_ids) == ref
            ok &= same
            print(f"greedy tokens equal transformers' MiniMax-M3: {same}")
        print("\n(random weights: the text is noise; the path is real)")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
