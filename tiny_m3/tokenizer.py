# SPDX-License-Identifier: Apache-2.0
"""The tiny checkpoints' tokenizer: a small byte-level BPE trained in-process on a
few sentences (no download), with a chat template, saved next to a checkpoint."""

CORPUS = """\
MiniMax-M3 is a mixture of experts language model with sparse attention.
Each sparse layer scores blocks of earlier tokens with a small indexer and
attends only to the best blocks, plus the block that holds the query itself.
vLLM keeps the keys, the values and the index keys in paged caches, schedules
requests in batches, splits long prompts into chunks, and samples tokens.
The quick brown fox jumps over the lazy dog. Hello world, hello vLLM!
user: what is vLLM? assistant: a fast inference and serving engine.
"""

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: pad, bos, eos


def build_tokenizer(path: str, vocab_size: int = 320) -> None:
    """Train the BPE (``vocab_size`` entries, the specials first) and save it with
    ``CHAT_TEMPLATE`` into ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE: it "
                         "needs the 256 byte symbols and the specials; use at least 300")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
