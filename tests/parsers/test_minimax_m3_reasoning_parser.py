# SPDX-License-Identifier: Apache-2.0
"""Unit tests for the ``minimax_m3`` reasoning parser alone (its interplay with the
tool parser: test_minimax_m3_reasoning_with_tools.py, which needs the tool-parser entry)."""

from __future__ import annotations

import functools
import random

import pytest

M = "]<]minimax[>["
OPEN, CLOSE = "<mm:think>", "</mm:think>"
ENABLED = {"thinking_mode": "enabled"}
DISABLED = {"thinking_mode": "disabled"}


def _rp(tok, kwargs=None):
    from vllm.reasoning import ReasoningParserManager

    cls = ReasoningParserManager.get_reasoning_parser("minimax_m3")
    return cls(tok, chat_template_kwargs=kwargs)


def _stream_reasoning_only(parser, tok, chunks):
    reasoning, content = [], []
    prev = ""
    for chunk in chunks:
        ids = tok.encode(chunk, add_special_tokens=False)
        d = parser.extract_reasoning_streaming(prev, prev + chunk, chunk, [], ids, ids)
        prev += chunk
        if d is not None:
            reasoning.append(d.reasoning or "")
            content.append(d.content or "")
    return "".join(reasoning), "".join(content)


def test_registered():
    from vllm.reasoning import ReasoningParserManager
    from vllm.reasoning.minimax_m3_series_reasoning_parser import MiniMaxM3ReasoningParser

    assert "minimax_m3" in ReasoningParserManager.list_registered()
    assert (
        ReasoningParserManager.get_reasoning_parser("minimax_m3")
        is MiniMaxM3ReasoningParser
    )


def test_needs_a_tokenizer():
    from vllm.reasoning.minimax_m3_series_reasoning_parser import MiniMaxM3ReasoningParser

    with pytest.raises(ValueError, match="tokenizer"):
        MiniMaxM3ReasoningParser(None)


@pytest.mark.parametrize(
    "kwargs, text, expected",
    [
        # thinking mode on: generation starts inside the reasoning
        (ENABLED, "plan it\n</mm:think>\n\nAnswer", ("plan it\n", "\n\nAnswer")),
        (ENABLED, "\n<mm:think>plan</mm:think>Answer", ("plan", "Answer")),
        (ENABLED, "</mm:think>Answer", (None, "Answer")),
        (ENABLED, "still thinking", ("still thinking", None)),
        (ENABLED, "a</mm:think>b</mm:think>c", ("a", "b</mm:think>c")),
        ({"enable_thinking": True}, "x</mm:think>y", ("x", "y")),
        ({"thinking": {"type": "enabled"}}, "x</mm:think>y", ("x", "y")),
        # adaptive / unset: the output decides
        (None, "<mm:think>plan</mm:think>Answer", ("plan", "Answer")),
        (None, " \n<mm:think>plan</mm:think>Answer", ("plan", "Answer")),
        (
            None,
            "Just an answer <mm:think> mention",
            (None, "Just an answer <mm:think> mention"),
        ),
        (None, "</mm:think>\n\nAnswer", (None, "\n\nAnswer")),  # stray closer
        (None, "  </mm:think>Answer", (None, "Answer")),
        (None, "<mm:think>unfinished", ("unfinished", None)),
        (None, "<mm:think>a <mm:think> b</mm:think>c", ("a <mm:think> b", "c")),
        ({"thinking_mode": "adaptive"}, "<mm:think>p</mm:think>A", ("p", "A")),
        # complete output only: a closer without an opener
        (None, "plan</mm:think>Answer", ("plan", "Answer")),
        # thinking disabled: unchanged
        (DISABLED, "<mm:think>p</mm:think>A", (None, "<mm:think>p</mm:think>A")),
        ({"enable_thinking": False}, "A", (None, "A")),
        (None, "", (None, None)),
        # surveyed shapes (see the parser's module docstring)
        # repeated closers at the start / right after the block are dropped
        (None, f"{CLOSE}{CLOSE}Hello.", (None, "Hello.")),
        (None, f"{CLOSE}\n{CLOSE}\nHi {CLOSE}", (None, "\n\nHi " + CLOSE)),
        (ENABLED, f"plan{CLOSE} {CLOSE}Answer", ("plan", " Answer")),
        (ENABLED, f"{CLOSE}{CLOSE}{M}<tool_call>", (None, f"{M}<tool_call>")),
        # a tool call opened without closing the reasoning ends it
        (ENABLED, f"plan\n{M}<tool_call>x", ("plan\n", f"{M}<tool_call>x")),
        (
            None,
            f"<mm:think>p {M}<tool_call>x{CLOSE}",
            ("p ", f"{M}<tool_call>x{CLOSE}"),
        ),
        (ENABLED, f"{M}<tool_call>x", (None, f"{M}<tool_call>x")),
        # the marker alone, or tool markup without the opener, stays reasoning
        (
            ENABLED,
            f"I may write {M} or <invoke>{CLOSE}A",
            (f"I may write {M} or <invoke>", "A"),
        ),
        (ENABLED, f"a {M}<tool_cal{CLOSE}b", (f"a {M}<tool_cal", "b")),
        # no closer at all: everything stays reasoning (MiniMax-M3#28)
        (ENABLED, "thinking... Hola, ¿cómo", ("thinking... Hola, ¿cómo", None)),
    ],
)
def test_extract_reasoning(tok, make_request, kwargs, text, expected):
    assert _rp(tok, kwargs).extract_reasoning(text, make_request()) == expected


def test_request_kwargs_used_when_parser_has_none(tok, make_request):
    req = make_request(chat_template_kwargs=ENABLED)
    assert _rp(tok).extract_reasoning("r</mm:think>c", req) == ("r", "c")


STREAM_SAMPLES = [
    (
        ENABLED,
        "Think <b>about</b> </mm:th it.\n</mm:think>\n\nThe answer is 42. </mm:think>",
    ),
    (ENABLED, "  <mm:think>\nre-opened</mm:think>answer"),
    (None, "\n <mm:think>Let me see: <mm:thin></mm:think>Answer <mm:think>x"),
    (None, "  </mm:think>Plain answer."),
    (None, "<mm:thinking is not a tag"),
    (None, "No reasoning at all."),
    (DISABLED, "<mm:think>a</mm:think>b"),
    (None, f" {CLOSE} \n{CLOSE}{CLOSE}\tx {CLOSE}"),
    (ENABLED, f"r </mm:thin{CLOSE}\n </mm:{CLOSE}{CLOSE}c"),
    (ENABLED, f"r {M}<tool_ca {M} {M}<tool_call>{M}<invoke{CLOSE}"),
    (None, f"<mm:think>{M}<tool_call>{CLOSE}"),
]


@pytest.mark.parametrize("kwargs, text", STREAM_SAMPLES)
@pytest.mark.parametrize("tokenizer", ["tok", "tok_plain"])
def test_streaming_every_split_point(request, make_request, kwargs, text, tokenizer):
    tok = request.getfixturevalue(tokenizer)
    ref_r, ref_c = _rp(tok, kwargs).extract_reasoning(text, make_request())
    ref = (ref_r or "", ref_c or "")
    # character by character
    assert _stream_reasoning_only(_rp(tok, kwargs), tok, list(text)) == ref
    for k in range(len(text) + 1):
        got = _stream_reasoning_only(_rp(tok, kwargs), tok, [text[:k], text[k:]])
        assert got == ref, k
    rng = random.Random(7)
    for _ in range(50):
        a, b = sorted(rng.sample(range(len(text) + 1), 2))
        got = _stream_reasoning_only(
            _rp(tok, kwargs), tok, [text[:a], text[a:b], text[b:]]
        )
        assert got == ref, (a, b)


def test_streaming_holds_back_partial_tags(tok):
    p = _rp(tok, ENABLED)
    d = p.extract_reasoning_streaming("", "abc</mm:th", "abc</mm:th", [], [], [])
    assert d.reasoning == "abc" and d.content is None
    assert not p.is_reasoning_end_streaming([], [])
    d = p.extract_reasoning_streaming(
        "abc</mm:th", "abc</mm:think>x", "ink>x", [], [], []
    )
    assert d.reasoning is None and d.content == "x"
    assert p.is_reasoning_end_streaming([], [])


def test_is_reasoning_end_on_prompts(tok, tok_plain):
    for t in (tok, tok_plain):
        enc = functools.partial(t.encode, add_special_tokens=False)
        instructions = (
            "Think inside <mm:think></mm:think> tags.\nuser: hi\nassistant:\n"
        )
        # template opened the block: the reply starts inside the reasoning
        assert not _rp(t, ENABLED).is_reasoning_end(enc(instructions + "<mm:think>\n"))
        assert not _rp(t).is_reasoning_end(enc(instructions + "<mm:think>\n"))
        # template closed it: the reply is content
        assert _rp(t).is_reasoning_end(enc(instructions + "</mm:think>\n\n"))
        # adaptive: instructional tags earlier in the prompt do not decide
        assert not _rp(t).is_reasoning_end(enc(instructions))
        assert not _rp(t).is_reasoning_end([])
        assert _rp(t, DISABLED).is_reasoning_end(enc(instructions + "<mm:think>"))


def test_engine_side_streaming_end_detection(tok, tok_plain):
    """A fresh instance (as in the structured-output manager) only sees ids."""
    for t in (tok, tok_plain):
        enc = functools.partial(t.encode, add_special_tokens=False)
        prompt = enc("sys: use <mm:think></mm:think>\nassistant:")
        p = _rp(t)
        out = enc("<mm:think>")
        assert not p.is_reasoning_end_streaming(prompt + out, out)
        more = enc("abc")
        assert not p.is_reasoning_end_streaming(prompt + out + more, more)
        end = enc("</mm:think>x")
        assert p.is_reasoning_end_streaming(prompt + out + more + end, end)
        # adaptive, no thinking: the last tag is the prompt's closer -> ended
        p = _rp(t)
        out = enc("Hello")
        assert p.is_reasoning_end_streaming(prompt + out, out)
        # enabled, template opened the block
        p = _rp(t, ENABLED)
        prompt2 = enc("assistant:<mm:think>")
        out = enc("abc")
        assert not p.is_reasoning_end_streaming(prompt2 + out, out)
        end = enc("</mm:think>")
        assert p.is_reasoning_end_streaming(prompt2 + out + end, end)
        assert _rp(t, DISABLED).is_reasoning_end_streaming(out, out)


def test_extract_content_ids_and_count(tok):
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    ids = enc("<mm:think>abcd</mm:think>xyz")
    p = _rp(tok)
    assert p.extract_content_ids(ids) == enc("xyz")
    assert p.count_reasoning_tokens(ids) == 4
    assert _rp(tok, ENABLED).count_reasoning_tokens(enc("ab</mm:think>xyz")) == 2
    assert _rp(tok, ENABLED).extract_content_ids(enc("ab")) == []
    assert _rp(tok).extract_content_ids(enc("plain")) == enc("plain")
    assert _rp(tok).count_reasoning_tokens(enc("plain")) == 0
    assert _rp(tok, DISABLED).extract_content_ids(ids) == ids
    assert _rp(tok, DISABLED).count_reasoning_tokens(ids) == 0
    assert _rp(tok).reasoning_start_str == "<mm:think>"
    assert _rp(tok).reasoning_end_str == "</mm:think>"


def test_count_reasoning_tokens_without_single_token_tags(tok_plain):
    ids = tok_plain.encode("<mm:think>abcd</mm:think>xyz", add_special_tokens=False)
    assert _rp(tok_plain).count_reasoning_tokens(ids) == 4


def test_adjust_request_when_tags_are_special(char_tokenizer_factory, make_request):
    special = char_tokenizer_factory(added=(), special=(OPEN, CLOSE))
    req = _rp(special).adjust_request(make_request())
    assert req.skip_special_tokens is False
    plain = char_tokenizer_factory()
    assert _rp(plain).adjust_request(make_request()).skip_special_tokens is True
