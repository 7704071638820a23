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
  characters other than whitespace, ``<``, ``>``, ``/``, quotes and ``=``.
* Only the marker delimits structure: a leaf value may contain ``<``, ``>``,
  XML/HTML or JSON text freely.  String values are taken verbatim (no
  trimming); other scalars are trimmed before conversion.
* Leniency: a leaf whose closing tag was written without the marker
  (``M<q>text</q>M<next>``) is accepted.
* A repeated tag (adjacent siblings with the same name) forms an array.  A
  later, non-adjacent repeat of a key already set is ignored (first wins).

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
Malformed markup (text where a tag must be, a mismatched or missing closing
tag, a marker not followed by a tag, a nested ``<invoke>``...) or truncated
markup never raises: in a complete output the offending invoke (or the whole
block, if none of its invokes was complete) is returned as plain content and
parsing resumes after it; complete invokes before it are still tool calls.

Streaming: the function name is sent as soon as ``M<invoke name="...">`` is
complete, then the arguments JSON in pieces, one piece per parameter when the
parameter is known to be final (the next sibling tag starts or the invoke
closes), and the closing brace with ``M</invoke>``.  The pieces always
concatenate to ``json.dumps(arguments)``.  While an invoke is open every delta
carries an (empty) argument delta for it, so vLLM's end-of-stream step can
append what is missing and the final arguments are valid JSON even when the
output is cut off.  A name that was sent cannot be withdrawn: if an invoke
turns out malformed while streaming, its call is closed with the parameters
parsed so far and the rest is sent as content.  Text that could be the start
of ``M<tool_call>`` is held back until it is decided; so is the markup of a
block that is still open, which is therefore not sent as content if the
stream ends inside it (vLLM 0.23.0 has no end-of-stream hook for tool
parsers; the complete-output path returns it as content).
"""

import contextlib
import json
import math
from collections.abc import Sequence
from typing import Any

import regex as re

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
from vllm.tokenizers import TokenizerLike
from vllm.tool_parsers.abstract_tool_parser import Tool, ToolParser

logger = init_logger(__name__)

MARKER = "]<]minimax[>["
TOOL_CALL_OPEN = MARKER + "<tool_call>"
TOOL_CALL_CLOSE = MARKER + "</tool_call>"

# A structural tag longer than this without its ">" is malformed.
_MAX_TAG_CHARS = 1024

_INVOKE_RE = re.compile(
    r"""^invoke\s+name\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))\s*$"""
)
_TAG_NAME_RE = re.compile(r"""^[^\s<>/"'=]+$""")
_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")

_CONTENT, _BLOCK, _INVOKE = "content", "block", "invoke"
_FAIL = object()


class _Malformed(Exception):
    pass


# --------------------------------------------------------------- conversion
def _json_or_fail(text: str) -> Any:
    def _no_constants(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return _FAIL


def _resolve(schema: Any, defs: dict) -> dict:
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        name = ref.rsplit("/", 1)[-1]
        target = defs.get(name) if ref.startswith("#/") else None
        seen += 1
        if not isinstance(target, dict) or seen > 16:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return rest
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema if isinstance(schema, dict) else {}


def _types(schema: dict, defs: dict) -> list[str]:
    """Type names allowed by a schema, in the order given."""
    out: list[str] = []

    def add(t: str) -> None:
        if t not in out:
            out.append(t)

    t = schema.get("type")
    if isinstance(t, str):
        add(t)
    elif isinstance(t, list):
        for x in t:
            if isinstance(x, str):
                add(x)
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            for x in _types(_resolve(sub, defs), defs):
                add(x)
    if not out:
        values = schema.get("enum") or ([schema["const"]] if "const" in schema else [])
        for v in values:
            add(_type_of(v))
        if "properties" in schema or "additionalProperties" in schema:
            add("object")
        if "items" in schema:
            add("array")
    if schema.get("nullable") is True:
        add("null")
    return out


def _type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    return "string"


def _branch(schema: dict, defs: dict, type_name: str) -> dict:
    """The (sub)schema describing values of ``type_name``."""
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            sub = _resolve(sub, defs)
            if type_name in _types(sub, defs):
                return sub
    return schema


class _Node:
    __slots__ = ("tag", "text", "children")

    def __init__(self, tag: str):
        self.tag = tag
        self.text = ""
        self.children: list[_Node] = []


def _group(children: list[_Node]) -> list[tuple[str, list[_Node]]]:
    """Adjacent same-tag siblings form one group; later repeats are dropped."""
    groups: list[tuple[str, list[_Node]]] = []
    seen: set[str] = set()
    for child in children:
        if groups and groups[-1][0] == child.tag:
            groups[-1][1].append(child)
        elif child.tag in seen:
            logger.debug("minimax_m3: ignoring repeated key %r", child.tag)
        else:
            seen.add(child.tag)
            groups.append((child.tag, [child]))
    return groups


def _scalar(text: str, types: list[str], schema: dict) -> Any:
    s = text.strip()
    for value in schema.get("enum") or []:
        if not isinstance(value, (dict, list)) and (
            (isinstance(value, str) and value in (text, s))
            or (not isinstance(value, str) and json.dumps(value) == s)
        ):
            return value
    low = s.lower()
    if "null" in types and low in ("null", "none"):
        return None
    if "boolean" in types and low in ("true", "false"):
        return low == "true"
    if "integer" in types or "number" in types:
        number = _number(s, integral="number" not in types)
        if number is not None:
            return number
    if "object" in types:
        if not s:
            return {}
        v = _json_or_fail(s)
        if isinstance(v, dict):
            return v
    if "array" in types:
        if not s:
            return []
        v = _json_or_fail(s)
        if isinstance(v, list):
            return v
    if "null" in types and not s and "string" not in types:
        return None
    if types and "string" not in types:
        logger.debug("minimax_m3: %r does not match schema types %s", text, types)
    return text


def _number(s: str, integral: bool) -> int | float | None:
    """A decimal literal as int/float; None if it is not one (or not
    integral when ``integral``).  NaN/Infinity are not JSON numbers."""
    try:
        if _INT_RE.match(s):
            return int(s)
        if _FLOAT_RE.match(s):
            f = float(s)
            if math.isfinite(f) and (f.is_integer() or not integral):
                return int(f) if integral else f
    except (ValueError, OverflowError):  # e.g. more digits than int() allows
        pass
    return None


def _array_items(node: _Node, items: Any, defs: dict) -> list[Any]:
    if node.children:
        if all(c.tag == "item" for c in node.children):
            return [_convert(c, items, defs) for c in node.children]
        return [_convert(node, items, defs)]
    s = node.text.strip()
    if not s:
        return []
    v = _json_or_fail(s)
    if isinstance(v, list):
        return v
    return [_convert(node, items, defs)]


def _items_schema(schema: dict, defs: dict) -> Any:
    return _branch(schema, defs, "array").get("items")


def _convert(node: _Node, schema: Any, defs: dict) -> Any:
    schema = _resolve(schema, defs)
    types = _types(schema, defs)
    if node.children:
        all_items = all(c.tag == "item" for c in node.children)
        if "array" in types and (all_items or "object" not in types):
            return _array_items(node, _items_schema(schema, defs), defs)
        if "object" in types:
            return _convert_object(node.children, _branch(schema, defs, "object"), defs)
        return _convert_object(node.children, {}, defs)
    if "array" in types:
        s = node.text.strip()
        if "null" in types and s.lower() in ("null", "none"):
            return None
        v = _json_or_fail(s) if s else []
        if isinstance(v, list):
            return v
        others = [t for t in types if t not in ("array", "string")]
        if others:
            value = _scalar(node.text, others, schema)
            if value is not node.text:
                return value
        if types[0] == "array" or "string" not in types:
            return [_convert(node, _items_schema(schema, defs), defs)]
        return node.text
    return _scalar(node.text, types, schema)


def _convert_group(nodes: list[_Node], schema: Any, defs: dict) -> Any:
    if len(nodes) == 1:
        return _convert(nodes[0], schema, defs)
    schema = _resolve(schema, defs)
    if "array" in _types(schema, defs):
        items = _items_schema(schema, defs)
        out: list[Any] = []
        for n in nodes:
            out.extend(_array_items(n, items, defs))
        return out
    return [_convert(n, schema, defs) for n in nodes]


def _convert_object(children: list[_Node], schema: dict, defs: dict) -> Any:
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = schema.get("additionalProperties")
    extra = extra if isinstance(extra, dict) else {}
    if not props and not extra and all(c.tag == "item" for c in children):
        return [_convert(c, {}, defs) for c in children]
    return {
        tag: _convert_group(nodes, props.get(tag, extra), defs)
        for tag, nodes in _group(children)
    }


def _tool_schemas(tools: Sequence[Any] | None) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for tool in tools or []:
        name = params = None
        fn = getattr(tool, "function", None)
        if fn is not None:  # ChatCompletionToolsParam
            name, params = getattr(fn, "name", None), getattr(fn, "parameters", None)
        elif isinstance(tool, dict):
            fn = tool.get("function", tool)
            name, params = fn.get("name"), fn.get("parameters")
        else:  # Responses FunctionTool
            name, params = (
                getattr(tool, "name", None),
                getattr(tool, "parameters", None),
            )
        if isinstance(name, str) and name not in out:
            out[name] = params if isinstance(params, dict) else {}
    return out


# ------------------------------------------------------------------ scanner
class _Call:
    def __init__(self, name: str, schema: dict | None):
        self.name = name
        self.known = schema is not None
        self.schema = schema or {}
        self.defs: dict = {}
        for key in ("$defs", "definitions"):
            if isinstance(self.schema.get(key), dict):
                self.defs.update(self.schema[key])
        params = _resolve(self.schema, self.defs)
        self.props = params.get("properties") or {}
        extra = params.get("additionalProperties")
        self.extra = extra if isinstance(extra, dict) else {}
        self.final: dict[str, Any] = {}
        self.pending_key: str | None = None
        self.pending: list[_Node] = []
        self.events: list[tuple] = []  # held back (complete-output mode)
        self.index = -1
        self.emitted = 0
        self.streamed = ""

    def convert(self, key: str, nodes: list[_Node]) -> Any:
        return _convert_group(nodes, self.props.get(key, self.extra), self.defs)

    def arguments(self) -> dict[str, Any]:
        args = dict(self.final)
        if self.pending_key is not None and self.pending_key not in args:
            args[self.pending_key] = self.convert(self.pending_key, self.pending)
        return args


class _Scanner:
    """Incremental parser; ``commit_early`` selects the streaming behaviour."""

    def __init__(self, tools: Sequence[Any] | None, commit_early: bool):
        self.schemas = _tool_schemas(tools)
        self.commit_early = commit_early
        self.mode = _CONTENT
        self.buf = ""
        self.block = ""  # raw text of the current block consumed so far
        self.degrade_from = 0
        self.block_invokes = 0
        self.call: _Call | None = None
        self.stack: list[_Node] = []
        self.out: list[tuple] = []

    # events: ("text", s) ("open", call) ("param", call, k, v) ("progress", call)
    # ("close", call)
    def _emit(self, ev: tuple) -> None:
        call = self.call
        if not self.commit_early and call is not None and ev[0] != "text":
            call.events.append(ev)
        else:
            self.out.append(ev)

    def feed(self, text: str) -> list[tuple]:
        self.buf += text
        self._run(final=False)
        out, self.out = self.out, []
        return out

    def finish(self) -> list[tuple]:
        self._run(final=True)
        while self.mode != _CONTENT:
            self._degrade("output ended inside a tool call")
            self._run(final=True)
        if self.buf:
            self.out.append(("text", self.buf))
            self.buf = ""
        out, self.out = self.out, []
        return out

    @property
    def open_call(self) -> _Call | None:
        return self.call if self.mode == _INVOKE else None

    # ---------------------------------------------------------------- loop
    def _run(self, final: bool) -> None:
        while True:
            if self.mode == _CONTENT:
                i = self.buf.find(TOOL_CALL_OPEN)
                if i < 0:
                    keep = 0 if final else _partial(self.buf, TOOL_CALL_OPEN)
                    if len(self.buf) > keep:
                        self.out.append(("text", self.buf[: len(self.buf) - keep]))
                        self.buf = self.buf[len(self.buf) - keep :]
                    return
                if i:
                    self.out.append(("text", self.buf[:i]))
                self.buf = self.buf[i + len(TOOL_CALL_OPEN) :]
                self.mode, self.block, self.degrade_from = _BLOCK, TOOL_CALL_OPEN, 0
                self.block_invokes = 0
                continue
            try:
                lexeme = self._lex(final)
                if lexeme is None:
                    return
                kind, value, raw = lexeme
                if self.mode == _BLOCK:
                    self._in_block(kind, value)
                else:
                    self._in_invoke(kind, value)
                self.buf = self.buf[len(raw) :]
                self.block += raw
                if self.commit_early and self.mode == _INVOKE and not self.stack:
                    self.degrade_from = len(self.block)
            except _Malformed as e:
                self._degrade(str(e))

    def _lex(self, final: bool) -> tuple[str, str, str] | None:
        buf = self.buf
        if buf.startswith(MARKER):
            rest = buf[len(MARKER) :]
            if not rest:
                return None
            if rest[0] != "<":
                raise _Malformed("marker not followed by a tag")
            gt = rest.find(">")
            if gt < 0:
                if len(rest) > _MAX_TAG_CHARS:
                    raise _Malformed("unterminated tag")
                return None
            return "tag", rest[1:gt], MARKER + rest[: gt + 1]
        i = buf.find(MARKER)
        if i >= 0:
            return "text", buf[:i], buf[:i]
        # Text with no marker after it (yet).  Between tags only whitespace
        # is allowed, so garbage can be rejected before the next marker.
        if (self.mode == _BLOCK or not self.stack) and buf[
            : len(buf) - _partial(buf, MARKER)
        ].strip():
            raise _Malformed("text where a tag is expected")
        return None

    def _in_block(self, kind: str, value: str) -> None:
        if kind == "text":
            if value.strip():
                raise _Malformed("text between invokes")
            return
        if value == "/tool_call":
            if not self.block_invokes:
                raise _Malformed("tool_call block without an invoke")
            self.mode = _CONTENT
            self.block = ""
            return
        m = _INVOKE_RE.match(value)
        if not m:
            raise _Malformed(f"unexpected tag <{value}> in a tool_call block")
        name = next(g for g in m.groups() if g is not None).strip()
        if not name:
            raise _Malformed("empty function name")
        self.block_invokes += 1
        self.call = _Call(name, self.schemas.get(name))
        if not self.call.known:
            logger.debug("minimax_m3: call to unknown tool %r", name)
        self.stack = []
        self.mode = _INVOKE
        self._emit(("open", self.call))

    def _implicit_close(self) -> None:
        """Accept ``M<q>text</q>`` (closing tag without the marker)."""
        if not self.stack:
            return
        top = self.stack[-1]
        closer = f"</{top.tag}>"
        body = top.text.rstrip()
        if not top.children and body.endswith(closer):
            top.text = body[: -len(closer)]
            self._close_tag(top.tag)

    def _in_invoke(self, kind: str, value: str) -> None:
        call = self.call
        assert call is not None
        if kind == "text":
            if not self.stack:
                if value.strip():
                    raise _Malformed("text between parameters")
                return
            top = self.stack[-1]
            if top.children and value.strip():
                raise _Malformed(f"text mixed with nested tags in <{top.tag}>")
            top.text += value
            return
        if value.startswith("/"):
            name = value[1:].strip()
            if self.stack and self.stack[-1].tag != name:
                self._implicit_close()
            if name == "invoke" and not self.stack:
                self._finalize_pending()
                self._emit(("close", call))
                self.mode, self.call = _BLOCK, None
                if not self.commit_early:
                    self.out.extend(call.events)
                    call.events = []
                self.degrade_from = len(self.block) + len(MARKER) + len(value) + 2
                return
            if not self.stack or self.stack[-1].tag != name:
                raise _Malformed(f"unexpected closing tag </{name}>")
            self._close_tag(name)
            return
        self._implicit_close()
        if _INVOKE_RE.match(value) or value in ("tool_call", "/tool_call"):
            raise _Malformed(f"<{value}> inside an invoke")
        name = value.strip()
        if not _TAG_NAME_RE.match(name):
            raise _Malformed(f"bad parameter tag <{value}>")
        if self.stack:
            top = self.stack[-1]
            if top.text.strip():
                raise _Malformed(f"nested tag after text in <{top.tag}>")
            top.text = ""
        elif call.pending_key is not None and call.pending_key != name:
            self._finalize_pending()
        self.stack.append(_Node(name))

    def _close_tag(self, name: str) -> None:
        call = self.call
        assert call is not None
        node = self.stack.pop()
        if self.stack:
            self.stack[-1].children.append(node)
            return
        if call.pending_key == name:
            call.pending.append(node)
        elif name in call.final:
            logger.debug("minimax_m3: ignoring repeated parameter %r", name)
            return
        else:
            call.pending_key, call.pending = name, [node]
        self._emit(("progress", call))

    def _finalize_pending(self) -> None:
        call = self.call
        assert call is not None
        if call.pending_key is None:
            return
        key, nodes = call.pending_key, call.pending
        call.pending_key, call.pending = None, []
        value = call.convert(key, nodes)
        call.final[key] = value
        self._emit(("param", call, key, value))

    def _degrade(self, why: str) -> None:
        logger.debug("minimax_m3: malformed tool call markup (%s)", why)
        call = self.call
        if call is not None and self.commit_early:
            # The name is already out: close the call with what it has.
            self.stack = []
            self._finalize_pending()
            self._emit(("close", call))
        elif call is not None:
            call.events = []
        self.call, self.stack = None, []
        self.out.append(("text", self.block[self.degrade_from :]))
        self.mode, self.block = _CONTENT, ""
        if self.buf.startswith(TOOL_CALL_OPEN):
            return  # a new block starts where this one failed
        # Emit at least the first character so that scanning makes progress.
        self.out.append(("text", self.buf[:1]))
        self.buf = self.buf[1:]


def _partial(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


# ------------------------------------------------------------------- parser
class MinimaxM3ToolParser(ToolParser):
    """MiniMax-M3 ``]<]minimax[>[`` tool calls (grammar in the module doc)."""

    def __init__(self, tokenizer: TokenizerLike, tools: list[Tool] | None = None):
        super().__init__(tokenizer, tools)
        self._scanner: _Scanner | None = None
        self._calls: list[_Call] = []
        self._fed_chars = 0

    def _marker_is_special(self) -> bool:
        tok = self.model_tokenizer
        if tok is None:
            return False
        special: set[str] = set()
        with contextlib.suppress(Exception):  # tokenizer quirks
            special.update(getattr(tok, "all_special_tokens", None) or [])
        decoder = getattr(tok, "added_tokens_decoder", None)
        if isinstance(decoder, dict):
            for added in decoder.values():
                if getattr(added, "special", False):
                    special.add(str(getattr(added, "content", added)))
        return any(MARKER in s or s in TOOL_CALL_OPEN for s in special if s)

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
                piece = "{" if call.emitted == 0 else ", "
                piece += json.dumps(key, ensure_ascii=False) + ": "
                piece += json.dumps(value, ensure_ascii=False)
                call.emitted += 1
                add_args(call, piece)
            elif kind == "close":
                add_args(call, "{}" if call.emitted == 0 else "}")
            if call.index >= 0:
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
