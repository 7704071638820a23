# SPDX-License-Identifier: Apache-2.0
"""Shared helpers for the MiniMax-M3 parser tests.

No network: the tokenizers are built here with the ``tokenizers`` library (a
character-level vocabulary plus added tokens), since no MiniMax-M3 tokenizer
is available offline.
"""

from __future__ import annotations

import json

import pytest

MARK = "]<]minimax[>["


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end test that starts `vllm serve` on CPU (select with -m e2e, "
        "skip with -m 'not e2e')",
    )


def build_char_tokenizer(
    added: list[str] | tuple[str, ...] = ("<mm:think>", "</mm:think>"),
    special: list[str] | tuple[str, ...] = (),
):
    """A tiny fast tokenizer: one token per ASCII character, ``added`` as
    single (non-special) tokens, ``special`` as special tokens."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
    for c in [chr(i) for i in range(32, 127)] + ["\n", "\t"]:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    if added:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in added])
    tok.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t in ("<s>", "</s>", *special)
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="[UNK]"
    )


@pytest.fixture(scope="session")
def tok():
    """Think tags are single tokens (as in MiniMax-M3)."""
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tok_plain():
    """Think tags are split into character tokens."""
    return build_char_tokenizer(added=())


@pytest.fixture(scope="session")
def char_tokenizer_factory():
    return build_char_tokenizer


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "threshold": {"type": "number"},
                    "alerts": {"type": "boolean"},
                    "note": {"type": ["string", "null"]},
                    "units": {"type": "array", "items": {"type": "string"}},
                    "options": {
                        "type": "object",
                        "properties": {
                            "detail": {"type": "string", "enum": ["low", "high"]},
                            "hours": {"type": "array", "items": {"type": "integer"}},
                        },
                    },
                    "stops": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "minutes": {"type": "integer"},
                            },
                        },
                    },
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string"}},
            },
        },
    },
]


@pytest.fixture
def make_request():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    def _make(tools=WEATHER_TOOLS, **kw):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        if tools is not None:
            body["tools"] = tools
            body.setdefault("tool_choice", "auto")
        body.update(kw)
        return ChatCompletionRequest(**body)

    return _make


def get_parser_cls(reasoning: bool = True, tools: bool = True):
    from vllm.parser import ParserManager

    return ParserManager.get_parser(
        tool_parser_name="minimax_m3" if tools else None,
        reasoning_parser_name="minimax_m3" if reasoning else None,
        enable_auto_tools=tools,
    )


def run_stream(parser, tokenizer, chunks, request, prompt_ids=()):
    """Feed ``chunks`` through vLLM's own ``Parser.parse_delta`` like the chat
    completion server does (it always passes the prompt ids); return
    (reasoning, content, calls)."""
    prompt_ids = list(prompt_ids)
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, dict] = {}
    for i, chunk in enumerate(chunks):
        ids = tokenizer.encode(chunk, add_special_tokens=False) if chunk else []
        delta = parser.parse_delta(
            chunk,
            ids,
            request,
            prompt_token_ids=prompt_ids,
            finished=(i == len(chunks) - 1),
        )
        if delta is None:
            continue
        if delta.reasoning:
            reasoning.append(delta.reasoning)
        if delta.content:
            content.append(delta.content)
        for tc in delta.tool_calls:
            c = calls.setdefault(tc.index, {"id": None, "name": None, "args": ""})
            if tc.id is not None:
                assert c["id"] is None, "tool call id sent twice"
                c["id"] = tc.id
            if tc.function is not None:
                if tc.function.name:
                    assert c["name"] is None, "function name sent twice"
                    c["name"] = tc.function.name
                if tc.function.arguments:
                    assert c["name"] is not None, "arguments before the name"
                    c["args"] += tc.function.arguments
    return "".join(reasoning), "".join(content), [calls[i] for i in sorted(calls)]


def calls_as_tuples(calls) -> list[tuple[str, object]]:
    """(name, parsed arguments) for streamed dicts or FunctionCall objects."""
    out = []
    for c in calls or []:
        if isinstance(c, dict):
            out.append((c["name"], json.loads(c["args"])))
        else:
            out.append((c.name, json.loads(c.arguments)))
    return out


def norm_content(text: str | None) -> str:
    """vLLM drops whitespace-only content next to tool calls (non-streaming)."""
    return text if text and text.strip() else ""


@pytest.fixture(scope="session")
def helpers():
    class H:
        MARK = MARK
        WEATHER_TOOLS = WEATHER_TOOLS
        get_parser_cls = staticmethod(get_parser_cls)
        run_stream = staticmethod(run_stream)
        calls_as_tuples = staticmethod(calls_as_tuples)
        norm_content = staticmethod(norm_content)

    return H
