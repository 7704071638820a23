"""A tiny MiniMax-M3 checkpoint in the released form that upstream's model reads.

Upstream's MiniMax-M3 (vLLM >= 0.24) takes the released config (legacy
``sparse_attention_config`` keys) and needs head_dim 128 and 128-token sparse
blocks (its backends support nothing else); its VL wrapper also reads vision
fields that transformers' tiny config lacks even with ``language_model_only``.
"""

import contextlib
import json
import os

import torch
from minimax_m3_utils import build_checkpoint, to_legacy

# the released vision config carries these; upstream reads them at construction
VISION_FIELDS = dict(img_token_compression_config={"spatial_merge_size": 2}, patch_size=14,
                     num_channels=3, layer_norm_eps=1e-5)


def build_upstream_checkpoint(root: str, dtype=torch.float32, topk: int = 2) -> tuple[str, str]:
    """(transformers checkpoint, released-form copy) under ``root``: 4 layers
    (dense, 3 sparse), head_dim 128, sparse block 128, top-``topk`` blocks."""
    hf, released = os.path.join(root, "hf"), os.path.join(root, "released")
    if not os.path.exists(os.path.join(released, "config.json")):
        build_checkpoint(hf, dtype=dtype, sparse_block=128, topk=topk, head_dim=128,
                         index_head_dim=128, rotary_dim=64, hidden_size=256, num_attention_heads=4,
                         num_key_value_heads=2)
        to_legacy(hf, released)
        p = os.path.join(released, "config.json")
        cfg = json.load(open(p))
        cfg["vision_config"].update(VISION_FIELDS)
        json.dump(cfg, open(p, "w"), indent=2)
    return hf, released


@contextlib.contextmanager
def bf16_index_keys():
    """transformers' MiniMax-M3 with its index queries and keys rounded to bf16
    after RoPE, as upstream's model stores them (its index-key cache and the
    index queries scored against it are bf16 whatever the model dtype). Without
    this an fp32 oracle scores blocks in fp32, and a near-tie between two
    blocks' scores (common with random weights) selects another block than the
    engine: on this checkpoint 30 of 300 positions moved by up to 0.86."""
    import transformers.models.minimax_m3_vl.modeling_minimax_m3_vl as hf_mod

    rope, index_forward = hf_mod.apply_rotary_pos_emb, hf_mod.MiniMaxM3VLIndexer.forward
    inside = []

    def rounded_rope(q, k, *args, **kwargs):
        q, k = rope(q, k, *args, **kwargs)
        if inside:
            q, k = q.to(torch.bfloat16).to(q.dtype), k.to(torch.bfloat16).to(k.dtype)
        return q, k

    def marked_forward(self, *args, **kwargs):
        inside.append(True)
        try:
            return index_forward(self, *args, **kwargs)
        finally:
            inside.pop()

    hf_mod.apply_rotary_pos_emb, hf_mod.MiniMaxM3VLIndexer.forward = rounded_rope, marked_forward
    try:
        yield hf_mod.MiniMaxM3SparseForConditionalGeneration
    finally:
        hf_mod.apply_rotary_pos_emb, hf_mod.MiniMaxM3VLIndexer.forward = rope, index_forward


@contextlib.contextmanager
def fp8_kv_cache():
    """transformers' MiniMax-M3 attention reading its keys and values rounded to FP8
    e4m3 (scale 1.0, after RoPE), as an engine with ``kv_cache_dtype="fp8"`` and no
    checkpoint scales stores them; the arithmetic stays in the model's dtype. Load the
    model with ``attn_implementation="eager"``: only the eager attention is wrapped."""
    import transformers.models.minimax_m3_vl.modeling_minimax_m3_vl as hf_mod

    eager = hf_mod.eager_attention_forward
    e4m3 = torch.float8_e4m3fn
    big = torch.finfo(e4m3).max

    def rounded(module, query, key, value, *args, **kwargs):
        if key.abs().max() > big or value.abs().max() > big:
            raise ValueError(f"fp8_kv_cache: a key or value exceeds e4m3's {big}; a scale-1.0 "
                             "FP8 cache cannot hold it (use a checkpoint with smaller values)")
        key, value = key.to(e4m3).to(key.dtype), value.to(e4m3).to(value.dtype)
        return eager(module, query, key, value, *args, **kwargs)

    hf_mod.eager_attention_forward = rounded
    try:
        yield
    finally:
        hf_mod.eager_attention_forward = eager
