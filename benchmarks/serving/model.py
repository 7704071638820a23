# SPDX-License-Identifier: Apache-2.0
"""The served model: a config-only MiniMax-M3 directory with the released layer shapes
(few layers, ``--load-format dummy``) and a word-level tokenizer whose decode -> encode
round trip is exact."""

import json
import os


SERVED_NAME = "minimax-m3-e2e"


SPECIAL_WORDS = ["<unk>", "<s>", "</s>", "<pad>"]


CHAT_WORDS = ["user", "assistant", "system", ":", "hello", "what", "is", "vllm", "?", "."]


FIRST_PLAIN_ID = len(SPECIAL_WORDS) + len(CHAT_WORDS)


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def text_config(layers: int = 4, smoke: bool = False, max_pos: int = 262144) -> dict:
    """MiniMax-M3 text config in transformers' normalized form.

    GPU: the released layer shapes (hidden 6144, 64 q / 4 KV heads of 128,
    MoE 128 x 3072 top-4 + shared 3072, index 4 x 128, blocks of 128, top-16),
    vocab cut to 32000; the first half of the layers dense attention + dense
    MLP (12288), the rest MSA + MoE.  smoke: tiny shapes for CPU."""
    n_dense = layers // 2
    if smoke:
        shapes = dict(vocab_size=512, hidden_size=64, intermediate_size=32,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      dense_intermediate_size=48, shared_intermediate_size=32,
                      num_local_experts=4, num_experts_per_tok=2, rotary_dim=16,
                      index_n_heads=2, index_head_dim=32, index_block_size=32,
                      index_topk_blocks=2, rope_theta=10000.0)
    else:
        shapes = dict(vocab_size=32000, hidden_size=6144, intermediate_size=3072,
                      num_attention_heads=64, num_key_value_heads=4, head_dim=128,
                      dense_intermediate_size=12288, shared_intermediate_size=3072,
                      num_local_experts=128, num_experts_per_tok=4, rotary_dim=64,
                      index_n_heads=4, index_head_dim=128, index_block_size=128,
                      index_topk_blocks=16, rope_theta=5e6)
    theta = shapes.pop("rope_theta")
    return dict(
        shapes,
        model_type="minimax_m3_vl_text",
        num_hidden_layers=layers,
        layer_types=["full_attention"] * n_dense + ["minimax_m3_sparse"] * (layers - n_dense),
        mlp_layer_types=["dense"] * n_dense + ["sparse"] * (layers - n_dense),
        rope_parameters={"rope_type": "default", "rope_theta": theta,
                         "partial_rotary_factor": 0.5},
        index_local_blocks=1,
        hidden_act="silu",  # what transformers writes; read as swigluoai
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        routed_scaling_factor=2.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=max_pos,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def make_model_dir(path: str, layers: int = 4, smoke: bool = False) -> dict:
    """Write config.json (``minimax_m3_vl`` wrapper around ``text_config``, a
    tiny vision config that --language-model-only never builds) and a matching
    tokenizer into ``path``; returns the text config."""
    os.makedirs(path, exist_ok=True)
    text = text_config(layers, smoke)
    cfg = {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
        "model_type": "minimax_m3_vl",
        "text_config": text,
        "vision_config": {"model_type": "minimax_m3_vl_vision", "hidden_size": 32,
                          "intermediate_size": 32, "num_hidden_layers": 1,
                          "num_attention_heads": 2},
        "projector_hidden_size": 64,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    build_tokenizer(path, text["vocab_size"])
    return text


def build_tokenizer(path: str, vocab_size: int) -> None:
    """Word-level tokenizer with exactly ``vocab_size`` entries: specials, a few
    chat words, then ``t<id>``.  Whitespace-split, so decode -> encode of any
    non-special id list is exact (what `vllm bench serve --dataset-name random`
    needs); a jinja chat template for /v1/chat/completions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIAL_WORDS + CHAT_WORDS
    vocab = {w: i for i, w in enumerate(words)}
    vocab.update({f"t{i}": i for i in range(len(words), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", model_max_length=1 << 22)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)

