# SPDX-License-Identifier: Apache-2.0
"""The ``minimax_m3`` tool parser on the malformed shapes that public reports
describe for deployed MiniMax-M3 checkpoints (the list, its sources and the
decisions are in the parser's module docstring), incremental streaming of
string arguments, and chunk-size independence as a property test."""

from __future__ import annotations

import json
import random

import pytest

M = "]<]minimax[>["

EXTRA_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "save_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "filename": {"type": "string"},
                    "content": {"type": "string"},
                    "mode": {"type": "string", "enum": ["w", "a"]},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "grep",
            "parameters": {
                "type": "object",
                "properties": {
                    "-A": {"type": "integer"},
                    "-n": {"type": "boolean"},
                    "pattern": {"type": "string"},
                },
            },
        },
    },
]

NYC = f'{M}<invoke name="get_weather">\n{M}<city>NYC{M}</city>\n{M}</invoke>'
LA = f'{M}<invoke name="get_weather">\n{M}<city>LA{M}</city>\n{M}</invoke>'
UTC = f'{M}<invoke name="get_time">{M}<tz>UTC{M}</tz>{M}</invoke>'
NYC_CALL = ("get_weather", {"city": "NYC"})
LA_CALL = ("get_weather", {"city": "LA"})
UTC_CALL = ("get_time", {"tz": "UTC"})

# (id, model output, expected calls, expected content[, streamed calls,
# streamed content]) - streamed results differ only where an invoke turns out
# malformed after its name was sent.
SHAPES = [
    (
        "first-param-opening-tag-elided (vllm#51073, MXFP8 capture form)",
        f"{M}<tool_call>\n{M}<invoke name=\"save_file\">{M}offerta.docx{M}</filename>"
        f"{M}<content>Hello{M}</content>{M}</invoke>{M}</tool_call>",
        [("save_file", {"filename": "offerta.docx", "content": "Hello"})],
        "",
    ),
    (
        "param-opening-tag-elided-inside-an-object (vllm#51075)",
        f'{M}<tool_call>{M}<invoke name="get_weather">{M}<city>Oslo{M}</city>'
        f"{M}<options>{M}high{M}</detail>{M}<hours>{M}<item>6{M}</item>{M}</hours>"
        f"{M}</options>{M}</invoke>{M}</tool_call>",
        [
            (
                "get_weather",
                {"city": "Oslo", "options": {"detail": "high", "hours": [6]}},
            )
        ],
        "",
    ),
    (
        "elided-opener-then-a-repeat-is-an-array",
        f'{M}<tool_call>{M}<invoke name="get_weather">{M}celsius{M}</units>'
        f"{M}<units>kelvin{M}</units>{M}<days>2{M}</days>{M}</invoke>{M}</tool_call>",
        [("get_weather", {"units": ["celsius", "kelvin"], "days": 2})],
        "",
    ),
    (
        "param-opening-tag-without-<",
        f'{M}<tool_call>{M}<invoke name="get_weather">{M}city>Paris{M}</city>'
        f"{M}</invoke>{M}</tool_call>",
        [("get_weather", {"city": "Paris"})],
        "",
    ),
    (
        "invoke-tag-without-< (vllm-gaudi#1724)",
        f"{M}<tool_call>\n{M}invoke name=\"get_time\">{M}<tz>UTC{M}</tz>{M}</invoke>"
        f"\n{M}</tool_call>",
        [UTC_CALL],
        "",
    ),
    (
        "prose-between-invokes (frontend-crates#83, batch.8.d)",
        f"I will check both cities. {M}<tool_call>\n{NYC}\nThen check LA.\n{LA}\n"
        f"{M}</tool_call>",
        [NYC_CALL, LA_CALL],
        "I will check both cities. \nThen check LA.\n",
    ),
    (
        "missing-invoke-close-before-block-close (batch.4.d)",
        f'{M}<tool_call>\n{M}<invoke name="get_weather">\n{M}<city>NYC{M}</city>\n'
        f"{M}</tool_call>",
        [NYC_CALL],
        "",
    ),
    (
        "missing-invoke-close-before-next-invoke",
        f'{M}<tool_call>\n{M}<invoke name="get_weather">\n{M}<city>NYC{M}</city>\n'
        f"{UTC}\n{M}</tool_call>",
        [NYC_CALL, UTC_CALL],
        "",
    ),
    (
        "missing-block-close (batch.5.a/5.d)",
        f"{M}<tool_call>\n{NYC}\n{UTC}\n",
        [NYC_CALL, UTC_CALL],
        "",
    ),
    (
        "hyphenated-parameter-names (vllm-ascend#12815)",
        f'{M}<tool_call>{M}<invoke name="grep">{M}<-A>3{M}</-A>{M}<-n>true{M}</-n>'
        f"{M}<pattern>a|b{M}</pattern>{M}</invoke>{M}</tool_call>",
        [("grep", {"-A": 3, "-n": True, "pattern": "a|b"})],
        "",
    ),
    (
        "xml-entities-kept-verbatim (batch.7.b decodes them)",
        f'{M}<tool_call>{M}<invoke name="get_weather">'
        f"{M}<city>Tōkyō &quot;central&quot; &amp; west{M}</city>"
        f"{M}</invoke>{M}</tool_call>",
        [("get_weather", {"city": "Tōkyō &quot;central&quot; &amp; west"})],
        "",
    ),
    (
        "invalid-json-in-an-object-leaf (batch.4.b)",
        f'{M}<tool_call>{M}<invoke name="get_weather">'
        f'{M}<options>{{"detail": "high"{M}</options>{M}</invoke>{M}</tool_call>',
        [("get_weather", {"options": '{"detail": "high"'})],
        "",
    ),
    (
        "nameless-invoke-between-good-ones (batch.4.c), no latching",
        f"{M}<tool_call>\n{NYC}\n{M}<invoke>\n{M}<city>Rome{M}</city>\n{M}</invoke>\n"
        f"{UTC}\n{M}</tool_call>",
        [NYC_CALL, UTC_CALL],
        f"\n{M}<invoke>\n{M}<city>Rome{M}</city>\n{M}</invoke>\n",
    ),
    (
        "invoke-without-parameters (batch.6.a, llamadart#408)",
        f'{M}<tool_call>\n{M}<invoke name="get_time">\n\n{M}</invoke>\n{M}</tool_call>',
        [("get_time", {})],
        "",
    ),
    (
        "garbage-block-body (batch.4.a)",
        f"{M}<tool_call>\nnot a valid invoke\n{M}</tool_call>",
        [],
        f"{M}<tool_call>\nnot a valid invoke\n{M}</tool_call>",
    ),
    (
        "bare-invoke-without-opener (frontend-crates#83 5.b)",
        f"See: {NYC}{M}</tool_call>",
        [],
        f"See: {NYC}{M}</tool_call>",
    ),
    (
        "stray-block-close-after-text (opencode#30684)",
        f"All done.{M}</tool_call>",
        [],
        f"All done.{M}</tool_call>",
    ),
    (
        "headless-value-closed-by-invoke-is-content",
        f"{M}<tool_call>{M}<invoke name=\"get_time\">{M}UTC{M}</invoke>{M}</tool_call>",
        [],
        f"{M}<tool_call>{M}<invoke name=\"get_time\">{M}UTC{M}</invoke>{M}</tool_call>",
        [("get_time", {})],
        f"{M}UTC{M}</invoke>",
    ),
]


@pytest.fixture
def tools_request(make_request, helpers):
    # get_weather and get_time (conftest), save_file and grep
    return make_request(tools=[*helpers.WEATHER_TOOLS, *EXTRA_TOOLS])


@pytest.fixture
def parser_cls(helpers):
    return helpers.get_parser_cls(reasoning=False, tools=True)


def _complete(tok, request, text):
    from vllm.tool_parsers import ToolParserManager

    parser = ToolParserManager.get_tool_parser("minimax_m3")(tok, request.tools)
    return parser.extract_tool_calls(text, request)


def _chunks(text: str, rng: random.Random, max_len: int) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, max_len)
        out.append(text[i : i + n])
        i += n
    return out or [""]


@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_surveyed_shape(tok, tools_request, helpers, parser_cls, shape):
    text, calls, content = shape[1:4]
    s_expected = (shape[4], shape[5]) if len(shape) > 4 else (calls, content)
    res = _complete(tok, tools_request, text)
    got = helpers.calls_as_tuples([t.function for t in res.tool_calls])
    assert got == calls
    assert (res.content or "") == content
    assert res.tools_called == bool(calls)
    # streamed, character by character and in random chunks: the same calls
    # and content, and the streamed arguments are the non-streaming JSON
    rng = random.Random(len(text))
    for chunks in [list(text), [text]] + [_chunks(text, rng, 9) for _ in range(5)]:
        parser = parser_cls(tok, tools_request.tools)
        _, s_content, s_calls = helpers.run_stream(
            parser, tok, chunks, tools_request
        )
        assert (helpers.calls_as_tuples(s_calls), s_content) == s_expected
        if len(shape) == 4:
            assert [c["args"] for c in s_calls] == [
                t.function.arguments for t in res.tool_calls
            ]


def _stream_outcome(parser_cls, tok, request, helpers, chunks):
    parser = parser_cls(tok, request.tools)
    _, content, calls = helpers.run_stream(parser, tok, chunks, request)
    return content, [(c["name"], c["args"]) for c in calls]


def _corpus(rng: random.Random) -> list[str]:
    """Well-formed, recovered and randomly damaged outputs."""
    from test_minimax_m3_tool_parser import SAMPLE

    base = [s[1] for s in SHAPES] + [SAMPLE]
    pieces = [M, "<", ">", "</", f"{M}<item>", f"{M}</invoke>", f"{M}<tool_call>",
              f"{M}</tool_call>", "\n", "x", f'{M}<invoke name="get_time">']  # fmt: skip
    out = list(base)
    for _ in range(60):
        text = rng.choice(base)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(text) + 1)
            op = rng.random()
            if op < 0.4:
                text = text[:i] + text[i + rng.randint(1, 15) :]
            elif op < 0.8:
                text = text[:i] + rng.choice(pieces) + text[i:]
            else:
                text = text[:i]  # truncated
        out.append(text)
    return out


def test_chunk_size_independence_property(tok, tools_request, helpers, parser_cls):
    """Property: for any output (well-formed, recovered or damaged) and any
    split into chunks - from single characters to the whole text at once -
    the streamed content, calls and concatenated argument JSON are the same,
    and the arguments are always valid JSON objects.  Seeded, so a failure
    names a reproducible (text, chunking)."""
    rng = random.Random(46)
    for text in _corpus(rng):
        ref = _stream_outcome(parser_cls, tok, tools_request, helpers, [text])
        for _, args in ref[1]:
            assert isinstance(json.loads(args), dict), (text, args)
        chunkings = [list(text)]
        for _ in range(6):
            chunkings.append(_chunks(text, rng, rng.choice([2, 5, 17, 64])))
        for chunks in chunkings:
            got = _stream_outcome(parser_cls, tok, tools_request, helpers, chunks)
            assert got == ref, (text, chunks)


def test_string_argument_streams_while_generated(tok, tools_request, parser_cls):
    code = 'def f(a):\n    return "<b>x</b>" + \'\\\\\' + "é\t🙂" # a < b\n'
    text = (
        f'{M}<tool_call>{M}<invoke name="save_file">{M}<filename>a.py{M}</filename>'
        f"{M}<content>{code}{M}</content>{M}<mode>w{M}</mode>{M}</invoke>"
        f"{M}</tool_call>"
    )
    parser = parser_cls(tok, tools_request.tools)
    start = text.index(f"{M}<content>") + len(f"{M}<content>")
    deltas: list[str] = []
    streamed_at: dict[int, str] = {}
    streamed = ""
    for i, ch in enumerate(text):
        ids = tok.encode(ch, add_special_tokens=False)
        d = parser.parse_delta(
            ch, ids, tools_request, prompt_token_ids=[], finished=i == len(text) - 1
        )
        for tc in d.tool_calls if d is not None else []:
            if tc.function and tc.function.arguments:
                deltas.append(tc.function.arguments)
                streamed += tc.function.arguments
        streamed_at[i + 1] = streamed
    final = {"filename": "a.py", "content": code, "mode": "w"}
    assert json.loads(streamed) == final
    assert streamed == json.dumps(final, ensure_ascii=False)
    prefix = '{"filename": "a.py", "content": "'
    # every character of the value is out as soon as it is generated, except
    # a "<" that may start the value's own marker-less closing tag, which
    # waits until that is decided ...
    for k in range(1, len(code) + 1):
        expected = prefix + json.dumps(code[:k], ensure_ascii=False)[1:-1]
        if "<" in code[max(0, k - len("</content>")) : k]:
            assert expected.startswith(streamed_at[start + k]), k
        else:
            assert streamed_at[start + k] == expected, k
    # ... one delta per character here, so the value arrives in pieces
    assert len(deltas) >= len(code)
    # the enum-typed "mode" is not streamed as text: it comes whole
    assert any(d.startswith(', "mode": "w"') for d in deltas)


def test_marker_less_closer_is_held_back(tok, tools_request, parser_cls, helpers):
    """``M<content>text</content>M...`` (closing tag without its marker) is
    accepted; while streamed, a possible such closer is not sent as text."""
    text = (
        f'{M}<tool_call>{M}<invoke name="save_file">{M}<content>a</b> </content>\n'
        f"{M}<filename>x{M}</filename>{M}</invoke>{M}</tool_call>"
    )
    res = _complete(tok, tools_request, text)
    assert helpers.calls_as_tuples([t.function for t in res.tool_calls]) == [
        ("save_file", {"content": "a</b> ", "filename": "x"})
    ]
    _, _, calls = helpers.run_stream(
        parser_cls(tok, tools_request.tools), tok, list(text), tools_request
    )
    assert calls[0]["args"] == res.tool_calls[0].function.arguments


def test_truncated_inside_a_streamed_string(tok, tools_request, parser_cls, helpers):
    """The stream stops inside a string value: the end-of-stream step closes
    the JSON with exactly what was streamed."""
    text = (
        f'{M}<tool_call>{M}<invoke name="save_file">{M}<filename>a.py{M}</filename>'
        f"{M}<content>line one\nline two"
    )
    for chunks in (list(text), [text[:50], text[50:]], [text]):
        _, _, calls = helpers.run_stream(
            parser_cls(tok, tools_request.tools), tok, chunks, tools_request
        )
        assert helpers.calls_as_tuples(calls) == [
            ("save_file", {"filename": "a.py", "content": "line one\nline two"})
        ]


def test_repeated_string_parameter_is_malformed(tok, tools_request, helpers):
    """A plain-string parameter is streamed as a JSON string, so a repeat of
    it cannot become an array: the invoke is malformed (content), the calls
    around it are kept."""
    bad = (
        f'{M}<invoke name="save_file">{M}<content>a{M}</content>'
        f"{M}<content>b{M}</content>{M}</invoke>"
    )
    # the same when the first one lost its opening tag
    bad2 = (
        f'{M}<invoke name="save_file">{M}a{M}</content>'
        f"{M}<content>b{M}</content>{M}</invoke>"
    )
    for broken in (bad, bad2):
        text = f"{M}<tool_call>{UTC}{broken}{M}</tool_call>"
        res = _complete(tok, tools_request, text)
        got = helpers.calls_as_tuples([t.function for t in res.tool_calls])
        assert got == [UTC_CALL]
        assert res.content == broken


def test_streamed_malformed_string_keeps_what_was_sent(
    tok, tools_request, parser_cls, helpers
):
    text = (
        f'{M}<tool_call>{M}<invoke name="save_file">{M}<content>draft'
        f"{M}<filename>x{M}</filename>{M}</invoke>{UTC}{M}</tool_call>"
    )
    _, content, calls = helpers.run_stream(
        parser_cls(tok, tools_request.tools), tok, list(text), tools_request
    )
    assert helpers.calls_as_tuples(calls) == [
        ("save_file", {"content": "draft"}),
        UTC_CALL,
    ]
    assert content == f"{M}<content>draft{M}<filename>x{M}</filename>{M}</invoke>"
