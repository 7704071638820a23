# SPDX-License-Identifier: Apache-2.0
"""The ``minimax_m3`` reasoning parser together with the ``minimax_m3`` tool parser
inside vLLM's ``Parser.parse_delta`` (needs both parser entries of the series)."""

from __future__ import annotations

import pytest

M = "]<]minimax[>["
OPEN, CLOSE = "<mm:think>", "</mm:think>"
ENABLED = {"thinking_mode": "enabled"}


# ----------------------------------------------- reasoning + tool calls
FULL = (
    "The user wants the weather. I might write ]<]minimax[>[ in my thoughts."
    f"\n{CLOSE}\n\nChecking now.\n"
    f'{M}<tool_call>\n{M}<invoke name="get_weather">\n{M}<city>Paris{M}</city>\n'
    f"{M}<days>2{M}</days>\n{M}<units>{M}<item>celsius{M}</item>{M}</units>\n{M}</invoke>\n"
    f'{M}<invoke name="get_time">{M}<tz>UTC{M}</tz>{M}</invoke>\n{M}</tool_call>'
)
FULL_REASONING = (
    "The user wants the weather. I might write ]<]minimax[>[ in my thoughts.\n"
)
FULL_CALLS = [
    ("get_weather", {"city": "Paris", "days": 2, "units": ["celsius"]}),
    ("get_time", {"tz": "UTC"}),
]


@pytest.mark.parametrize("prompt_tail", ["<mm:think>\n", ""])
def test_reasoning_and_tools_streamed_every_split(
    tok, make_request, helpers, prompt_tail
):
    request = make_request(chat_template_kwargs=ENABLED)
    prompt_ids = tok.encode(
        "user: weather?\nassistant:" + prompt_tail, add_special_tokens=False
    )
    parser_cls = helpers.get_parser_cls()
    ref_r, ref_c, ref_calls = parser_cls(
        tok, request.tools, chat_template_kwargs=ENABLED
    ).parse(FULL, request, enable_auto_tools=True)
    assert ref_r == FULL_REASONING
    assert ref_c == "\n\nChecking now.\n"
    assert helpers.calls_as_tuples(ref_calls) == FULL_CALLS
    splits = [list(FULL)] + [[FULL[:k], FULL[k:]] for k in range(len(FULL) + 1)]
    for chunks in splits:
        parser = parser_cls(tok, request.tools, chat_template_kwargs=ENABLED)
        r, c, calls = helpers.run_stream(parser, tok, chunks, request, prompt_ids)
        assert r == ref_r, len(chunks[0])
        assert c == ref_c, len(chunks[0])
        assert helpers.calls_as_tuples(calls) == FULL_CALLS, len(chunks[0])


def test_adaptive_prompt_opened_by_template(tok, make_request, helpers):
    """No thinking kwargs, but the prompt ends with <mm:think>: the streamed
    reply starts inside the reasoning (seen via is_reasoning_end(prompt))."""
    request = make_request()
    prompt_ids = tok.encode("assistant:<mm:think>", add_special_tokens=False)
    parser_cls = helpers.get_parser_cls()
    ref = parser_cls(tok, request.tools).parse(FULL, request, enable_auto_tools=True)
    assert ref[0] == FULL_REASONING
    parser = parser_cls(tok, request.tools)
    r, c, calls = helpers.run_stream(parser, tok, list(FULL), request, prompt_ids)
    assert (r, c) == (ref[0], ref[1])
    assert helpers.calls_as_tuples(calls) == FULL_CALLS


def test_adaptive_model_opens_block(tok, make_request, helpers):
    text = "<mm:think>" + FULL
    request = make_request()
    prompt_ids = tok.encode(
        "sys: <mm:think></mm:think>\nassistant:", add_special_tokens=False
    )
    parser_cls = helpers.get_parser_cls()
    for chunks in [list(text)] + [[text[:k], text[k:]] for k in range(0, len(text), 7)]:
        r, c, calls = helpers.run_stream(
            parser_cls(tok, request.tools), tok, chunks, request, prompt_ids
        )
        assert r == FULL_REASONING
        assert c == "\n\nChecking now.\n"
        assert helpers.calls_as_tuples(calls) == FULL_CALLS


def test_adaptive_no_reasoning_tool_call(tok, make_request, helpers):
    text = FULL[FULL.index(CLOSE) :]  # a stray closer, then content and tools
    request = make_request()
    parser_cls = helpers.get_parser_cls()
    ref = parser_cls(tok, request.tools).parse(text, request, enable_auto_tools=True)
    assert ref[0] is None and ref[1] == "\n\nChecking now.\n"
    for chunks in [list(text)] + [[text[:k], text[k:]] for k in range(len(text) + 1)]:
        r, c, calls = helpers.run_stream(
            parser_cls(tok, request.tools), tok, chunks, request
        )
        assert r == "" and c == ref[1]
        assert helpers.calls_as_tuples(calls) == FULL_CALLS


@pytest.mark.parametrize("thinking", [ENABLED, None])
def test_tool_call_without_closing_the_reasoning(tok, make_request, helpers, thinking):
    """The model runs from its thoughts straight into a tool call whose first
    parameter also lost its opening tag (both surveyed shapes): streamed at
    every split, the call is recovered and the thoughts stay reasoning."""
    opener = "" if thinking else OPEN
    text = (
        f"{opener}I need the weather.\n"
        f'{M}<tool_call>\n{M}<invoke name="get_weather">{M}Paris{M}</city>'
        f"{M}<days>2{M}</days>{M}</invoke>\n{M}</tool_call>"
    )
    request = make_request(chat_template_kwargs=thinking)
    prompt_ids = tok.encode("assistant:", add_special_tokens=False)
    parser_cls = helpers.get_parser_cls()
    calls_expected = [("get_weather", {"city": "Paris", "days": 2})]
    ref = parser_cls(tok, request.tools, chat_template_kwargs=thinking).parse(
        text, request, enable_auto_tools=True
    )
    assert ref[0] == "I need the weather.\n"
    assert helpers.calls_as_tuples(ref[2]) == calls_expected
    splits = [list(text)] + [[text[:k], text[k:]] for k in range(len(text) + 1)]
    for chunks in splits:
        parser = parser_cls(tok, request.tools, chat_template_kwargs=thinking)
        r, c, calls = helpers.run_stream(parser, tok, chunks, request, prompt_ids)
        assert r == "I need the weather.\n", len(chunks[0])
        assert c == "", len(chunks[0])
        assert helpers.calls_as_tuples(calls) == calls_expected, len(chunks[0])


def test_special_token_helper_is_shared(char_tokenizer_factory):
    """Both parsers ask the same helper whether their markup is special."""
    from vllm.reasoning import minimax_m3_series_reasoning_parser as rp
    from vllm.reasoning.minimax_m3_special_tokens import (
        any_special,
        special_token_strings,
    )
    from vllm.tool_parsers import minimax_m3_series_tool_parser as tp

    assert rp.any_special is any_special and tp.any_special is any_special
    tok = char_tokenizer_factory(added=(OPEN,), special=(M, "<x>"))
    assert {M, "<x>", "<s>", "</s>"} <= special_token_strings(tok)
    assert OPEN not in special_token_strings(tok)
    assert any_special(tok, [M + "<tool_call>"])  # contains a special token
    assert not any_special(tok, [OPEN, CLOSE])
    assert special_token_strings(None) == set()
