# SPDX-License-Identifier: Apache-2.0
"""Unit tests for the ``minimax_m3`` tool-call parser."""

from __future__ import annotations

import json
import random

import pytest

M = "]<]minimax[>["

WEATHER_INVOKE = (
    f'{M}<invoke name="get_weather">\n'
    f"{M}<city>Paris{M}</city>\n"
    f"{M}<days>3{M}</days>\n"
    f"{M}<threshold>-2.5e1{M}</threshold>\n"
    f"{M}<alerts>True{M}</alerts>\n"
    f"{M}<note>null{M}</note>\n"
    f"{M}<units>{M}<item>celsius{M}</item>{M}<item>kelvin{M}</item>{M}</units>\n"
    f"{M}<options>\n{M}<detail>high{M}</detail>\n"
    f"{M}<hours>{M}<item>6{M}</item>{M}<item>18{M}</item>{M}</hours>\n{M}</options>\n"
    f"{M}<stops>{M}<name>Lyon{M}</name>{M}<minutes>5{M}</minutes>{M}</stops>\n"
    f"{M}<stops>{M}<name>Dijon{M}</name>{M}<minutes>7{M}</minutes>{M}</stops>\n"
    f"{M}</invoke>"
)
WEATHER_ARGS = {
    "city": "Paris",
    "days": 3,
    "threshold": -25.0,
    "alerts": True,
    "note": None,
    "units": ["celsius", "kelvin"],
    "options": {"detail": "high", "hours": [6, 18]},
    "stops": [{"name": "Lyon", "minutes": 5}, {"name": "Dijon", "minutes": 7}],
}
TIME_INVOKE = f'{M}<invoke name="get_time">{M}<tz>Europe/Paris{M}</tz>{M}</invoke>'

SAMPLE = (
    "Let me check <both> things.\n"
    f"{M}<tool_call>\n{WEATHER_INVOKE}\n{TIME_INVOKE}\n{M}</tool_call>"
    "\nDone: a]b [x] <ok>."
)
SAMPLE_CALLS = [("get_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]
SAMPLE_CONTENT = "Let me check <both> things.\n\nDone: a]b [x] <ok>."


@pytest.fixture
def parser_cls(helpers):
    return helpers.get_parser_cls(reasoning=False, tools=True)


def _tool_parser(tok, request):
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.get_tool_parser("minimax_m3")(tok, request.tools)


def _extract(tok, request, text):
    return _tool_parser(tok, request).extract_tool_calls(text, request)


def test_registered():
    from vllm.tool_parsers import ToolParserManager
    from vllm.tool_parsers.minimax_m3_series_tool_parser import MinimaxM3ToolParser

    assert "minimax_m3" in ToolParserManager.list_registered()
    assert ToolParserManager.get_tool_parser("minimax_m3") is MinimaxM3ToolParser


def test_complete_output(tok, make_request, helpers):
    res = _extract(tok, make_request(), SAMPLE)
    assert res.tools_called
    assert (
        helpers.calls_as_tuples([tc.function for tc in res.tool_calls]) == SAMPLE_CALLS
    )
    assert res.content == SAMPLE_CONTENT
    assert all(tc.id and tc.type == "function" for tc in res.tool_calls)
    assert len({tc.id for tc in res.tool_calls}) == 2
    # The arguments are exactly json.dumps of the converted values.
    assert res.tool_calls[0].function.arguments == json.dumps(
        WEATHER_ARGS, ensure_ascii=False
    )


def test_no_tool_call_is_plain_content(tok, make_request):
    for text in ["", "hello", f"use {M} markers", '<tool_call><invoke name="x">']:
        res = _extract(tok, make_request(), text)
        assert not res.tools_called and res.tool_calls == []
        assert res.content == text


def test_streamed_char_by_char_matches_complete(tok, make_request, helpers, parser_cls):
    request = make_request()
    parser = parser_cls(tok, request.tools)
    _, content, calls = helpers.run_stream(parser, tok, list(SAMPLE), request)
    assert content == SAMPLE_CONTENT
    assert helpers.calls_as_tuples(calls) == SAMPLE_CALLS
    assert all(c["id"] for c in calls)
    # streamed argument text is exactly the non-streaming JSON
    assert calls[0]["args"] == json.dumps(WEATHER_ARGS, ensure_ascii=False)


def test_streamed_every_split_point(tok, make_request, helpers, parser_cls):
    request = make_request()
    _, ref_content, ref_calls = parser_cls(tok, request.tools).parse(
        SAMPLE, request, enable_auto_tools=True
    )
    assert helpers.calls_as_tuples(ref_calls) == SAMPLE_CALLS
    for k in range(len(SAMPLE) + 1):
        parser = parser_cls(tok, request.tools)
        _, content, calls = helpers.run_stream(
            parser, tok, [SAMPLE[:k], SAMPLE[k:]], request
        )
        assert content == ref_content, k
        assert helpers.calls_as_tuples(calls) == SAMPLE_CALLS, k


def test_streamed_random_three_way_splits(tok, make_request, helpers, parser_cls):
    request = make_request()
    rng = random.Random(1234)
    for _ in range(200):
        a, b = sorted(rng.sample(range(len(SAMPLE) + 1), 2))
        chunks = [SAMPLE[:a], SAMPLE[a:b], SAMPLE[b:]]
        parser = parser_cls(tok, request.tools)
        _, content, calls = helpers.run_stream(parser, tok, chunks, request)
        assert content == SAMPLE_CONTENT, (a, b)
        assert helpers.calls_as_tuples(calls) == SAMPLE_CALLS, (a, b)


def test_streaming_sends_name_before_arguments(tok, make_request):
    request = make_request()
    parser = _tool_parser(tok, request)
    text = f"{M}<tool_call>{WEATHER_INVOKE}{M}</tool_call>"
    name_at = text.index('">') + 2  # the invoke opening tag is complete here
    first_args_at = None
    args_at: dict[int, str] = {}  # arguments streamed after i+1 characters
    streamed = ""
    prev = ""
    for i, ch in enumerate(text):
        delta = parser.extract_tool_calls_streaming(
            prev, prev + ch, ch, [], [], [], request
        )
        prev += ch
        for tc in delta.tool_calls if delta is not None else []:
            if tc.function and tc.function.name:
                assert i + 1 == name_at
                assert tc.id and tc.type == "function"
            if tc.function and tc.function.arguments:
                if first_args_at is None:
                    first_args_at = i + 1
                streamed += tc.function.arguments
        args_at[i + 1] = streamed
    # the string parameter streams from its first character ...
    assert first_args_at == text.index("Paris") + 1
    assert args_at[first_args_at] == '{"city": "P'
    assert args_at[text.index("Paris") + 5] == '{"city": "Paris'
    # ... and is closed when the next parameter starts; the integer after it
    # goes out in one piece when it is final (the next sibling starts)
    days_at = text.index(f"{M}<days>") + len(f"{M}<days>")
    assert args_at[days_at] == '{"city": "Paris"'
    threshold_at = text.index(f"{M}<threshold>") + len(f"{M}<threshold>")
    assert args_at[threshold_at - 1] == '{"city": "Paris"'
    assert args_at[threshold_at] == '{"city": "Paris", "days": 3'
    assert parser.prev_tool_call_arr[0]["name"] == "get_weather"
    assert parser.prev_tool_call_arr[0]["arguments"] == WEATHER_ARGS
    assert parser.streamed_args_for_tool[0] == json.dumps(
        WEATHER_ARGS, ensure_ascii=False
    )


def test_several_invokes_and_blocks(tok, make_request, helpers, parser_cls):
    text = (
        f"A{M}<tool_call>{TIME_INVOKE}{M}</tool_call>B"
        f'{M}<tool_call>\n{TIME_INVOKE}\n{M}<invoke name="get_weather">'
        f"{M}<city>Rome{M}</city>{M}</invoke>\n{M}</tool_call>C"
    )
    expected = [
        ("get_time", {"tz": "Europe/Paris"}),
        ("get_time", {"tz": "Europe/Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    res = _extract(tok, make_request(), text)
    assert helpers.calls_as_tuples([t.function for t in res.tool_calls]) == expected
    assert res.content == "ABC"
    request = make_request()
    _, content, calls = helpers.run_stream(
        parser_cls(tok, request.tools), tok, list(text), request
    )
    assert content == "ABC"
    assert [c["name"] for c in calls] == [e[0] for e in expected]
    assert helpers.calls_as_tuples(calls) == expected


def test_invoke_without_parameters(tok, make_request, helpers, parser_cls):
    text = f"{M}<tool_call>{M}<invoke name='get_time'>\n{M}</invoke>{M}</tool_call>"
    res = _extract(tok, make_request(), text)
    assert res.tool_calls[0].function.arguments == "{}"
    assert res.content is None
    request = make_request()
    _, content, calls = helpers.run_stream(
        parser_cls(tok, request.tools), tok, list(text), request
    )
    assert calls == [{"id": calls[0]["id"], "name": "get_time", "args": "{}"}]


def test_unknown_tool_name(tok, make_request, helpers, parser_cls):
    text = (
        f'{M}<tool_call>{M}<invoke name="launch_rocket">{M}<count>5{M}</count>'
        f"{M}<crew>{M}<item>{M}<name>Ann{M}</name>{M}</item>{M}<item>{M}<name>Bo"
        f"{M}</name>{M}</item>{M}</crew>{M}<flag>true{M}</flag>{M}</invoke>{M}</tool_call>"
    )
    # No schema: leaves stay strings, nested tags objects, <item> children arrays.
    expected = [
        (
            "launch_rocket",
            {"count": "5", "crew": [{"name": "Ann"}, {"name": "Bo"}], "flag": "true"},
        )
    ]
    res = _extract(tok, make_request(), text)
    assert res.tools_called
    assert helpers.calls_as_tuples([t.function for t in res.tool_calls]) == expected
    request = make_request()
    _, _, calls = helpers.run_stream(
        parser_cls(tok, request.tools), tok, list(text), request
    )
    assert helpers.calls_as_tuples(calls) == expected
    # also without any tools in the request
    res = _extract(tok, make_request(tools=None), text)
    assert helpers.calls_as_tuples([t.function for t in res.tool_calls]) == expected


def test_schema_mismatch_keeps_raw_values(tok, make_request, helpers):
    text = (
        f'{M}<tool_call>{M}<invoke name="get_weather">'
        f"{M}<city>{M}<a>1{M}</a>{M}</city>"  # nested tags for a string
        f"{M}<days>three{M}</days>"  # not an integer
        f"{M}<threshold>NaN{M}</threshold>"  # NaN is not a JSON number
        f"{M}<alerts>maybe{M}</alerts>"
        f"{M}<options>plain text{M}</options>"  # not an object
        f"{M}<units>celsius{M}</units>"  # one element of an array
        f"{M}<unknown_param> 7 {M}</unknown_param>"
        f"{M}</invoke>{M}</tool_call>"
    )
    res = _extract(tok, make_request(), text)
    args = json.loads(res.tool_calls[0].function.arguments)
    assert args == {
        "city": {"a": "1"},
        "days": "three",
        "threshold": "NaN",
        "alerts": "maybe",
        "options": "plain text",
        "units": ["celsius"],
        "unknown_param": " 7 ",
    }


def test_value_conversions(tok, make_request, helpers):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "$defs": {
                        "Point": {
                            "type": "object",
                            "properties": {
                                "x": {"type": "number"},
                                "y": {"type": "number"},
                            },
                        }
                    },
                    "properties": {
                        "p": {"$ref": "#/$defs/Point"},
                        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                        "nullable": {"type": "integer", "nullable": True},
                        "level": {"enum": [1, 2, 3]},
                        "whole": {"type": "integer"},
                        "code": {"type": "string"},
                        "json_obj": {"type": "object"},
                        "json_arr": {"type": "array", "items": {"type": "integer"}},
                        "empty_arr": {"type": "array"},
                        "empty_obj": {"type": "object"},
                        "big": {"type": "integer"},
                        "flag": {"type": "boolean"},
                        "points": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
                        "int_or_list": {"type": ["integer", "array"]},
                        "huge": {"type": "integer"},
                    },
                },
            },
        }
    ]
    code = '  if a < b and c > d:\n    print("<b>x</b>", {"k": [1]})\n'
    text = (
        f'{M}<tool_call>{M}<invoke name="f">'
        f"{M}<p>{M}<x>1.5{M}</x>{M}<y>-2{M}</y>{M}</p>"
        f"{M}<maybe>null{M}</maybe>{M}<nullable>None{M}</nullable>"
        f"{M}<level>2{M}</level>{M}<whole> 4.0 {M}</whole>"
        f"{M}<code>{code}{M}</code>"
        f'{M}<json_obj>{{"a": [1, {{"b": null}}]}}{M}</json_obj>'
        f"{M}<json_arr>[1, 2, 3]{M}</json_arr>"
        f"{M}<empty_arr>{M}</empty_arr>{M}<empty_obj>{M}</empty_obj>"
        f"{M}<big>123456789012345678901234567890{M}</big>"
        f"{M}<flag>FALSE{M}</flag>"
        f"{M}<points>{M}<item>{M}<x>0{M}</x>{M}</item>{M}<item>{M}<y>1e3{M}</y>{M}</item>{M}</points>"
        f"{M}<int_or_list>5{M}</int_or_list>"
        f"{M}<huge>{'9' * 5000}{M}</huge>"
        f"{M}</invoke>{M}</tool_call>"
    )
    res = _extract(tok, make_request(tools=tools), text)
    args = json.loads(res.tool_calls[0].function.arguments)
    assert args == {
        "p": {"x": 1.5, "y": -2},
        "maybe": None,
        "nullable": None,
        "level": 2,
        "whole": 4,
        "code": code,
        "json_obj": {"a": [1, {"b": None}]},
        "json_arr": [1, 2, 3],
        "empty_arr": [],
        "empty_obj": {},
        "big": 123456789012345678901234567890,
        "flag": False,
        "points": [{"x": 0}, {"y": 1000.0}],
        "int_or_list": 5,
        "huge": "9" * 5000,  # beyond int(): kept as the raw string
    }


def test_closing_tag_without_marker_is_accepted(tok, make_request, helpers):
    text = (
        f'{M}<tool_call>\n{M}<invoke name="get_weather">{M}<city>Oslo</city>'
        f"{M}<days>2</days>\n{M}</invoke>\n{M}</tool_call>"
    )
    res = _extract(tok, make_request(), text)
    assert helpers.calls_as_tuples([t.function for t in res.tool_calls]) == [
        ("get_weather", {"city": "Oslo", "days": 2})
    ]


@pytest.mark.parametrize(
    "bad",
    [
        f"{M}<city>Paris{M}</town>",  # mismatched closing tag
        f"stray text{M}<city>Paris{M}</city>",  # text between parameters
        f"{M}city>Paris",  # marker not followed by a tag, never closed
        f"{M}<city>Paris{M}<days>1{M}</days>{M}</city>",  # text mixed with tags
        f"{M}<a b>1{M}</a b>",  # attributes are not supported
        f"{M}<city>Paris",  # parameter never closed
    ],
)
def test_malformed_invoke_degrades_to_content(
    tok, make_request, helpers, parser_cls, bad
):
    """A broken invoke between two good ones: the broken one is content,
    verbatim; the calls on both sides of it survive (no latching)."""
    broken = f'{M}<invoke name="get_weather">{bad}{M}</invoke>'
    utc = f'{M}<invoke name="get_time">{M}<tz>UTC{M}</tz>{M}</invoke>'
    text = f"x{M}<tool_call>{TIME_INVOKE}\n{broken}\n{utc}\n{M}</tool_call>y"
    res = _extract(tok, make_request(), text)
    assert helpers.calls_as_tuples([t.function for t in res.tool_calls]) == [
        ("get_time", {"tz": "Europe/Paris"}),
        ("get_time", {"tz": "UTC"}),
    ]
    # the broken invoke is returned as plain content, nothing is lost; the
    # block's closing tag is framing of the calls
    assert res.content == "x\n" + broken + "\ny"
    # streamed: the broken invoke's name was already out, so its call is
    # closed with what it had and the rest of it is content
    request = make_request()
    _, content, calls = helpers.run_stream(
        parser_cls(tok, request.tools), tok, list(text), request
    )
    assert [c["name"] for c in calls] == ["get_time", "get_weather", "get_time"]
    assert helpers.calls_as_tuples(calls)[2] == ("get_time", {"tz": "UTC"})
    head = f'{M}<invoke name="get_weather">'
    assert content == "x" + broken[len(head) :] + "\ny"


@pytest.mark.parametrize(
    "text",
    [
        f"{M}<tool_call>just prose about the format",
        f"{M}<tool_call>\n{M}<tool_call>\n",
        f'{M}<tool_call>{M}<invoke name="">{M}</invoke>{M}</tool_call>',
        f"{M}<tool_call>{M}<invoke>{M}</invoke>{M}</tool_call>",
        f"{M}<tool_call>{M}</tool_call>",
    ],
)
def test_block_without_valid_invoke_is_content(
    tok, make_request, helpers, parser_cls, text
):
    res = _extract(tok, make_request(), text)
    assert not res.tools_called
    assert res.content == text
    request = make_request()
    _, content, calls = helpers.run_stream(
        parser_cls(tok, request.tools), tok, list(text), request
    )
    assert calls == []
    # streaming holds back a trailing block that is still undecided when the
    # stream ends (vLLM has no end-of-stream hook for tool parsers)
    assert text.startswith(content)


def test_truncated_output_every_prefix(tok, make_request, helpers, parser_cls):
    """Every prefix of a sample: no exception, complete invokes are calls,
    the incomplete rest is content; streamed arguments are valid JSON."""
    request = make_request()
    block_start = SAMPLE.index(M)
    weather_end = SAMPLE.index(f"{M}</invoke>") + len(f"{M}</invoke>")
    time_end = SAMPLE.index(f"{M}</invoke>", weather_end) + len(f"{M}</invoke>")
    for k in range(len(SAMPLE) + 1):
        prefix = SAMPLE[:k]
        res = _extract(tok, request, prefix)
        names = [t.function.name for t in res.tool_calls]
        if k < weather_end:
            assert names == [] and res.content == prefix, k
        elif k < time_end:
            assert names == ["get_weather"], k
        else:
            assert names == ["get_weather", "get_time"], k
        for t in res.tool_calls:
            json.loads(t.function.arguments)
        # streamed with the last delta flagged as finished
        parser = parser_cls(tok, request.tools)
        _, content, calls = helpers.run_stream(
            parser, tok, [prefix[: k // 2], prefix[k // 2 :]], request
        )
        for c in calls:
            assert isinstance(json.loads(c["args"]), dict), (k, c)
        if k <= block_start:
            assert content == prefix[: len(content)] and calls == []


def test_streamed_truncation_inside_invoke_gives_valid_json(
    tok, make_request, helpers, parser_cls
):
    request = make_request()
    text = (
        f'ok{M}<tool_call>{M}<invoke name="get_weather">'
        f"{M}<city>Paris{M}</city>{M}<days>4"
    )
    parser = parser_cls(tok, request.tools)
    _, content, calls = helpers.run_stream(parser, tok, list(text), request)
    assert content == "ok"
    assert helpers.calls_as_tuples(calls) == [("get_weather", {"city": "Paris"})]


def test_streamed_malformed_after_name_closes_call(
    tok, make_request, helpers, parser_cls
):
    request = make_request()
    text = (
        f'{M}<tool_call>{M}<invoke name="get_weather">{M}<city>Paris{M}</city>'
        f"{M}<days>1{M}</hours>tail"
    )
    parser = parser_cls(tok, request.tools)
    _, content, calls = helpers.run_stream(parser, tok, list(text), request)
    assert helpers.calls_as_tuples(calls) == [("get_weather", {"city": "Paris"})]
    assert content == f"{M}<days>1{M}</hours>tail"


def test_tool_choice_none_passes_text_through(tok, make_request, helpers, parser_cls):
    request = make_request(tool_choice="none")
    text = f"{M}<tool_call>{TIME_INVOKE}{M}</tool_call>"
    parser = parser_cls(tok, request.tools)
    _, content, calls = helpers.run_stream(parser, tok, list(text), request)
    assert calls == [] and content == text


def test_adjust_request_keeps_special_marker(char_tokenizer_factory, make_request):
    from vllm.tool_parsers.minimax_m3_series_tool_parser import MinimaxM3ToolParser

    plain = char_tokenizer_factory(added=(M,))
    special = char_tokenizer_factory(added=(), special=(M,))
    req = make_request()
    assert MinimaxM3ToolParser(plain, req.tools).adjust_request(req).skip_special_tokens
    req = make_request()
    out = MinimaxM3ToolParser(special, req.tools).adjust_request(req)
    assert out.skip_special_tokens is False
    req = make_request(tool_choice="none")
    assert (
        MinimaxM3ToolParser(special, req.tools).adjust_request(req).skip_special_tokens
    )


def test_fuzzed_markup_never_raises_and_json_stays_valid(
    tok, make_request, helpers, parser_cls
):
    """Random edits of a sample (deleted, duplicated or inserted pieces of
    markup): the complete parse never raises; streamed and complete
    arguments are always JSON objects; complete text is never lost."""
    request = make_request()
    rng = random.Random(2024)
    pieces = [M, "<", ">", "</", f"{M}<item>", f"{M}</invoke>", f"{M}<tool_call>", "\n"]
    for _ in range(300):
        text = SAMPLE
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(text) + 1)
            op = rng.random()
            if op < 0.4:
                text = text[:i] + text[i + rng.randint(1, 15) :]
            elif op < 0.7:
                text = text[:i] + rng.choice(pieces) + text[i:]
            else:
                j = rng.randrange(len(text) + 1)
                a, b = min(i, j), max(i, j)
                text = text[:b] + text[a:b] + text[b:]
        res = _extract(tok, request, text)
        for t in res.tool_calls:
            assert isinstance(json.loads(t.function.arguments), dict)
        if not res.tools_called:
            assert res.content == (text or None)
        cut = rng.randrange(len(text) + 1)
        _, _, calls = helpers.run_stream(
            parser_cls(tok, request.tools), tok, [text[:cut], text[cut:]], request
        )
        for c in calls:
            assert isinstance(json.loads(c["args"]), dict), text
