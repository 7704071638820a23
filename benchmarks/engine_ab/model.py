# SPDX-License-Identifier: Apache-2.0
"""A config-only MiniMax-M3 directory in the released config form (what upstream's
model reads): ``text_config`` with the legacy ``sparse_attention_config`` keys, and
the vision fields upstream reads even with ``--language-model-only``."""

import json
import os


def text_config(layers: int, smoke: bool) -> dict:
    """The released text backbone's shapes (vocab cut to 32000), layer 0 dense,
    the rest MSA + MoE; ``smoke``: tiny shapes (head_dim and blocks stay 128,
    the only sizes upstream's backends take)."""
    if smoke:
        shapes = dict(vocab_size=512, hidden_size=256, intermediate_size=32,
                      dense_intermediate_size=64, shared_intermediate_size=32,
                      num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                      num_experts_per_tok=2, index_heads=2, topk=2)
    else:
        shapes = dict(vocab_size=32000, hidden_size=6144, intermediate_size=3072,
                      dense_intermediate_size=12288, shared_intermediate_size=3072,
                      num_attention_heads=64, num_key_value_heads=4, num_local_experts=128,
                      num_experts_per_tok=4, index_heads=4, topk=16)
    index_heads, topk = shapes.pop("index_heads"), shapes.pop("topk")
    sparse = [0] + [1] * (layers - 1)
    return dict(
        shapes, model_type="minimax_m3_text", num_hidden_layers=layers, head_dim=128,
        max_position_embeddings=262144, rms_norm_eps=1e-6, use_gemma_norm=True,
        rope_theta=5e6, rotary_dim=64, partial_rotary_factor=0.5, hidden_act="swigluoai",
        swiglu_alpha=1.702, swiglu_limit=7.0, qk_norm_type="per_head", scoring_func="sigmoid",
        use_routing_bias=True, routed_scaling_factor=2.0, n_shared_experts=1,
        moe_layer_freq=list(sparse), tie_word_embeddings=False, bos_token_id=1,
        eos_token_id=2,
        sparse_attention_config={
            "use_sparse_attention": True, "sparse_index_dim": 128,
            "sparse_num_index_heads": index_heads, "sparse_topk_blocks": topk,
            "sparse_block_size": 128, "sparse_local_block": 1, "sparse_init_block": 0,
            "sparse_score_type": "max", "sparse_disable_index_value": True,
            "sparse_attention_freq": list(sparse)},
    )


def write_model_dir(path: str, layers: int, smoke: bool) -> str:
    os.makedirs(path, exist_ok=True)
    cfg = {
        "model_type": "minimax_m3_vl",
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
        "text_config": text_config(layers, smoke),
        "vision_config": {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "patch_size": 14, "num_channels": 3,
                          "layer_norm_eps": 1e-5, "image_size": 224,
                          "img_token_compression_config": {"spatial_merge_size": 2}},
        "projector_hidden_size": 64,
        "torch_dtype": "float32" if smoke else "bfloat16",
    }
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"), indent=1)
    return path
