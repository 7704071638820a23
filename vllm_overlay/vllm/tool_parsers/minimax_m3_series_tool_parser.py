# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tool-call parser for MiniMax-M3 (``--tool-call-parser minimax_m3``).

Accepted grammar
----------------
``M`` stands for the marker ``]<]minimax[>[``; ``ws`` is any whitespace::

    output     := (content | block)*
    block      := M "<tool_call>" ws (invoke ws)+ M "</tool_call>"
    invoke     := M "<invoke name=" NAME ">" ws (param ws)* M "</invoke>"
    param      := M "<" TAG ">" value M "</" TAG ">"
    value      := TEXT                      -- a leaf: raw text, no marker in it
                | ws (param ws)+            -- nested tags: object or array

* ``NAME`` is double-quoted, single-quoted or bare.  ``TAG`` is any run of
  characters other than whitespace, ``<``, ``>``, ``/``, quotes and ``=``
  (so ``-A`` or ``max-count`` are fine).
* Only the marker delimits structure: a leaf value may contain ``<``, ``>``,
  XML/HTML or JSON text freely.  String values are taken verbatim (no
  trimming, no XML entity decoding); other scalars are trimmed first.
* A repeated tag (adjacent siblings with the same name) forms an array, except
  for a parameter whose schema is a plain string (see streaming below), where
  it is malformed.  A later, non-adjacent repeat of a key already set is
  ignored (first wins).

Values are converted by the tool's JSON schema (``$ref`` into ``$defs`` /
``definitions``, ``anyOf``/``oneOf``, type lists, ``nullable`` and ``enum``
are honoured):

* ``string``: the raw text.  ``integer`` / ``number``: decimal literals
  (``3.0`` is accepted for an integer; NaN/Infinity are not numbers).
  ``boolean``: ``true`` / ``false`` (any case).  ``null``: ``null`` / ``None``.
* ``object``: nested tags, converted by ``properties`` (or
  ``additionalProperties``); a leaf holding a JSON object is also accepted;
  an empty leaf is ``{}``.
* ``array``: ``<item>`` children (``M<xs>M<item>1M</item>M<item>2M</item>M</xs>``),
  repeated tags (``M<xs>1M</xs>M<xs>2M</xs>``; a single occurrence is a
  one-element array), or a leaf holding a JSON array.  Items (including
  objects written as nested tags) are converted by ``items``.
* Schema mismatch (e.g. ``abc`` for an integer) never raises: the value is
  kept as the raw string (nested tags become an object/array without schema).
* Unknown tool name or parameter: the call is still returned (the client
  decides); values are converted without a schema: leaves are strings, nested
  tags objects, ``<item>`` children arrays.

Content: all text outside blocks is returned as content, verbatim.

Shapes seen from deployed checkpoints, and what this parser does
---------------------------------------------------------------
Collected from public reports against other servers (facts only).  The rule:
recover a call where the shape is unambiguous, otherwise return the text
verbatim as content; never drop text, never raise, and never latch (a bad
invoke does not lose the calls after it, streamed or not).

1. First parameter without its opening tag, ``M<invoke name="f">MvalueM</k>``
   (emitted deterministically by MiniMax-M3-MXFP8;
   vllm-project/vllm#51073, #51075; vllm-gaudi#1655): recovered, ``k`` is
   named by its closing tag.  Anywhere a parameter may start (also inside a
   nested object).  Its value is sent when it closes.
2. Opening tag written without ``<`` (``M k>valueM</k>``) - the same
   headless rule, the ``k>`` prefix repeating the closing name is dropped.
   ``M invoke name="f">`` (``<`` dropped on the invoke tag;
   vllm-gaudi#1724): recovered as an invoke.  A headless value closed by
   ``</invoke>``, ``</tool_call>`` or its parent's tag is malformed.
3. Prose between the invokes of one block (ai-dynamo/frontend-crates#83,
   fixture TOOLCALLING.batch.8.d): both calls recovered, the prose is
   content (verbatim; whitespace-only layout between invokes is dropped).
   Text inside a block before its first invoke stays malformed
   (TOOLCALLING.batch.4.a: the whole block is content).
4. Missing ``M</invoke>`` when the next ``M<invoke ...>`` or ``M</tool_call>``
   follows a complete parameter (TOOLCALLING.batch.4.d): recovered, the
   invoke ends there (invokes do not nest, so this is unambiguous).  With a
   parameter still open it is malformed.
5. Missing ``M</tool_call>`` at the end (TOOLCALLING.batch.5.a/5.d): the
   complete invokes are calls; a truncated last invoke (5.c/5.e) is content
   in the complete output (streaming: see below).
6. Malformed invoke in the middle - text between parameters
   (smg-project/smg#1815 review), mismatched closing tag, text mixed with
   nested tags (smg#1815, vllm-gaudi#1655 keep it as ``$text``; that has no
   schema meaning, so here it is malformed), a nested ``<tool_call>``: that
   invoke is content, scanning goes on inside the block, so later invokes are
   still calls (no latching; vllm#51073 lost the whole message, and the M2
   parser of SGLang swallowed the valid invokes after an invalid one,
   sgl-project/sglang#24995).
7. Parameter names with hyphens (``-A``, ``-n``; vllm-project/vllm-ascend#12815
   where an XML library rejected them): accepted as tags.
8. Invoke without a name or with an empty one (TOOLCALLING.batch.4.c): that
   invoke is content.  Invoke without parameters (6.a-c; leehack/llamadart#408):
   a call with ``{}``.
9. XML entities in values (``&amp;``; TOOLCALLING.batch.7.b decodes them):
   kept verbatim - the template writes values raw (ml-explore/mlx-lm#1416), so
   decoding would corrupt code that contains ``&amp;``.
10. Invalid JSON in an object-typed leaf (TOOLCALLING.batch.4.b) and other
    schema mismatches (7.c): the raw string.
11. An invoke without the ``M<tool_call>`` opener ("bare", frontend-crates#83
    5.b/5.f/5.g) and a stray ``M</tool_call>`` after plain text
    (anomalyco/opencode#30684, MiniMax-AI/MiniMax-M3#31): content, verbatim -
    without the opener nothing distinguishes a call from a quoted example.
12. The marker is a special token (ggml-org/llama.cpp#24523; vllm#51073 saw it
    leak): see :meth:`MinimaxM3ToolParser.adjust_request`.

Streaming
---------
The function name is sent as soon as ``M<invoke name="...">`` is complete.  A
parameter whose schema is a plain ``string`` (no ``enum``, not nullable) is
streamed while it is generated: ``"key": "`` when its first non-whitespace
character arrives, then its text JSON-escaped as it comes (a possible closing
marker or ``</key>`` at the end is held back), and the closing quote when the
next sibling starts or the invoke closes.  Other parameters (typed, unknown,
nested, headless) go out in one piece when they are final.  The pieces always
concatenate to ``json.dumps(arguments)``, the non-streaming result.  While an
invoke is open every delta carries an (empty) argument delta for it, so vLLM's
end-of-stream step can append what is missing and the final arguments are
valid JSON even when the output is cut off.  A name (and streamed string
text) cannot be withdrawn: if an invoke turns out malformed while streaming,
its call is closed with what was sent and the rest is content.  Text that
could be the start of ``M<tool_call>`` is held back until it is decided; so is
the markup of a block that is still open, which is therefore not sent as
content if the stream ends inside it (vLLM 0.23.0 has no end-of-stream hook
for tool parsers; the complete-output path returns it as content).
"""

import json
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.chat_utils import make_tool_call_id
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.engine.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.logger import init_logger
from vllm.reasoning.minimax_m3_special_tokens import any_special
from vllm.tokenizers import TokenizerLike
from vllm.tool_parsers.abstract_tool_parser import Tool, ToolParser
from vllm.tool_parsers.minimax_m3_scanner import (
    _CONTENT,
    MARKER,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    _Call,
    _Scanner,
)

logger = init_logger(__name__)

__all__ = ["MARKER", "TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "MinimaxM3ToolParser"]


def _json_str_body(text: str) -> str:
    """``text`` JSON-escaped without the quotes (escaping is per character,
    so pieces concatenate to the escape of the whole)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class MinimaxM3ToolParser(ToolParser):
    """MiniMax-M3 ``]<]minimax[>[`` tool calls (grammar in the module doc)."""

    def __init__(self, tokenizer: TokenizerLike, tools: list[Tool] | None = None):
        super().__init__(tokenizer, tools)
        self._scanner: _Scanner | None = None
        self._calls: list[_Call] = []
        self._fed_chars = 0

    def _marker_is_special(self) -> bool:
        return any_special(self.model_tokenizer, [MARKER, TOOL_CALL_OPEN])

    def adjust_request(
        self, request: ChatCompletionRequest | ResponsesRequest
    ) -> ChatCompletionRequest | ResponsesRequest:
        request = super().adjust_request(request)
        if (
            request.tools
            and getattr(request, "tool_choice", None) != "none"
            and hasattr(request, "skip_special_tokens")
            and self._marker_is_special()
        ):
            # The markup must survive detokenization to be parsed.
            request.skip_special_tokens = False
        return request

    def _tools_for(self, request: Any) -> Sequence[Any] | None:
        tools = getattr(request, "tools", None)
        return tools if tools else self.tools

    def get_remaining_unstreamed_args(self) -> str:
        """What the end-of-stream step appends to the last call's arguments
        so that they are complete JSON (computed from the live state, which
        may be ahead of ``prev_tool_call_arr`` while a string streams)."""
        if not self._calls:
            return ""
        call = self._calls[-1]
        expected = json.dumps(call.arguments(), ensure_ascii=False)
        if expected.startswith(call.streamed):
            return expected[len(call.streamed) :]
        return ""

    # ------------------------------------------------------- non-streaming
    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        if TOOL_CALL_OPEN not in model_output:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        try:
            scanner = _Scanner(self._tools_for(request), commit_early=False)
            events = scanner.feed(model_output) + scanner.finish()
        except Exception:  # never fail a request because of odd markup
            logger.exception("minimax_m3: failed to parse tool calls")
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        content: list[str] = []
        tool_calls: list[ToolCall] = []
        for ev in events:
            if ev[0] == "text":
                content.append(ev[1])
            elif ev[0] == "close":
                call = ev[1]
                tool_calls.append(
                    ToolCall(
                        type="function",
                        function=FunctionCall(
                            name=call.name,
                            arguments=json.dumps(call.final, ensure_ascii=False),
                        ),
                    )
                )
        text = "".join(content)
        return ExtractedToolCallInformation(
            tools_called=bool(tool_calls),
            tool_calls=tool_calls,
            content=text if text else None,
        )

    # ----------------------------------------------------------- streaming
    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        if self._scanner is None or (not previous_text and self._fed_chars):
            self._scanner = _Scanner(self._tools_for(request), commit_early=True)
            self._calls = []
            self._fed_chars = 0
            self.prev_tool_call_arr = []
            self.streamed_args_for_tool = []
            self.current_tool_id = -1
        self._fed_chars += len(delta_text)
        try:
            events = self._scanner.feed(delta_text)
        except Exception:  # never fail a stream because of odd markup
            logger.exception("minimax_m3: failed to parse streamed tool calls")
            self._scanner = _Scanner(self._tools_for(request), commit_early=True)
            self._scanner.mode = _CONTENT
            return DeltaMessage(content=delta_text) if delta_text else None

        content: list[str] = []
        deltas: dict[int, DeltaToolCall] = {}

        def add_args(call: _Call, piece: str) -> None:
            d = deltas.get(call.index)
            if d is None:
                d = deltas[call.index] = DeltaToolCall(
                    index=call.index, function=DeltaFunctionCall(arguments="")
                )
            assert d.function is not None
            d.function.arguments = (d.function.arguments or "") + piece
            call.streamed += piece
            self.streamed_args_for_tool[call.index] = call.streamed

        def key_piece(call: _Call, key: str) -> str:
            piece = "{" if call.emitted == 0 else ", "
            call.emitted += 1
            return piece + json.dumps(key, ensure_ascii=False) + ": "

        for ev in events:
            kind = ev[0]
            if kind == "text":
                content.append(ev[1])
                continue
            call = ev[1]
            if kind == "open":
                call.index = len(self._calls)
                self._calls.append(call)
                self.current_tool_id = call.index
                self.current_tool_name_sent = True
                self.prev_tool_call_arr.append({"name": call.name, "arguments": {}})
                self.streamed_args_for_tool.append("")
                deltas[call.index] = DeltaToolCall(
                    index=call.index,
                    id=make_tool_call_id(),
                    type="function",
                    function=DeltaFunctionCall(name=call.name, arguments=""),
                )
            elif kind == "param":
                key, value = ev[2], ev[3]
                add_args(
                    call,
                    key_piece(call, key) + json.dumps(value, ensure_ascii=False),
                )
            elif kind == "str_open":
                add_args(call, key_piece(call, ev[2]) + '"')
            elif kind == "str_text":
                add_args(call, _json_str_body(ev[2]))
            elif kind == "str_close":
                add_args(call, _json_str_body(ev[3]) + '"')
            elif kind == "close":
                add_args(call, "{}" if call.emitted == 0 else "}")
            if call.index >= 0 and kind != "str_text":
                # (not per streamed piece: see get_remaining_unstreamed_args)
                self.prev_tool_call_arr[call.index]["arguments"] = call.arguments()

        open_call = self._scanner.open_call
        if open_call is not None and open_call.index not in deltas:
            # Keep an argument delta in every chunk of an open call, so that
            # the end-of-stream step can complete its JSON.
            deltas[open_call.index] = DeltaToolCall(
                index=open_call.index, function=DeltaFunctionCall(arguments="")
            )
        text = "".join(content)
        if not text and not deltas:
            return None
        return DeltaMessage(
            content=text if text else None,
            tool_calls=[deltas[i] for i in sorted(deltas)],
        )
