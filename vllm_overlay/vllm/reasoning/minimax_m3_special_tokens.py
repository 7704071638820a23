# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Special-token lookup shared by the MiniMax-M3 reasoning and tool parsers.

Both parsers work on detokenized text, so any of their markup that the
tokenizer declares special would be stripped when a request keeps vLLM's
default ``skip_special_tokens=True``; each parser asks this module whether
its markup is special and, if so, switches that off for the request.
"""

import contextlib
from collections.abc import Iterable
from typing import Any


def special_token_strings(tokenizer: Any) -> set[str]:
    """The text of every special token of ``tokenizer`` (empty for None).

    Reads ``all_special_tokens`` and the added tokens flagged ``special``;
    tokenizers that lack either (or raise while building them) contribute
    what they have.
    """
    special: set[str] = set()
    if tokenizer is None:
        return special
    with contextlib.suppress(Exception):  # tokenizer quirks
        special.update(getattr(tokenizer, "all_special_tokens", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        for added in decoder.values():
            if getattr(added, "special", False):
                special.add(str(getattr(added, "content", added)))
    special.discard("")
    return special


def any_special(tokenizer: Any, pieces: Iterable[str]) -> bool:
    """Whether a special token of ``tokenizer`` overlaps any of ``pieces``
    (the token is, contains or is contained in a piece), i.e. whether
    skipping special tokens could cut that markup out of the text."""
    special = special_token_strings(tokenizer)
    pieces = [p for p in pieces if p]
    return any(p in s or s in p for s in special for p in pieces)
