"""A tiny MiniMax-M3 checkpoint in the released form that upstream's model reads.

Upstream's MiniMax-M3 (vLLM >= 0.24) takes the released config (legacy
``sparse_attention_config`` keys) and needs head_dim 128 and 128-token sparse
blocks (its backends support nothing else); its VL wrapper also reads vision
fields that transformers' tiny config lacks even with ``language_model_only``.
"""

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
