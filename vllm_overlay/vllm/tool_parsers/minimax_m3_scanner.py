# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Incremental scanner of MiniMax-M3 tool-call markup.

Used by :mod:`vllm.tool_parsers.minimax_m3_series_tool_parser` (grammar, surveyed
malformed shapes and decisions are in that module's docstring) for both the
complete output and the stream.  The scanner consumes text in pieces of any
size and produces events:

* ``("text", s)``: content, verbatim;
* ``("open", call)``: an invoke's name is known;
* ``("param", call, key, value)``: a parameter's final value;
* ``("str_open", call, key)`` / ``("str_text", call, s)`` /
  ``("str_close", call, key, rest)``: a string parameter streamed while it
  is generated (``commit_early`` only);
* ``("progress", call)``: the arguments known so far changed;
* ``("close", call)``: the invoke is complete.

The decisions depend only on the text, never on where it was split, so every
chunking gives the same calls and content.
"""

from collections.abc import Sequence
from typing import Any

import regex as re

from vllm.logger import init_logger
from vllm.tool_parsers.minimax_m3_convert import (
    Node,
    convert_group,
    is_plain_string,
    resolve_schema,
    tool_schemas,
)

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

_CONTENT, _BLOCK, _INVOKE = "content", "block", "invoke"


class _Malformed(Exception):
    """Markup that cannot be parsed; ``skip`` characters of the unconsumed
    input belong to the offending piece and go to content with it."""

    def __init__(self, why: str, skip: int = 0):
        super().__init__(why)
        self.skip = skip


def _partial(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ends ``text``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _is_invoke_form(value: str) -> bool:
    """``invoke`` alone or followed by whitespace (with or without a name)."""
    return value == "invoke" or (value.startswith("invoke") and value[6].isspace())


def _dropped_lt_invoke(rest: str, final: bool) -> str:
    """After a marker not followed by ``<``: is this an invoke tag whose
    ``<`` was dropped (``M invoke name="f">``)?  "yes", "no" or "wait"."""
    if len(rest) > 6 and rest.startswith("invoke") and rest[6].isspace():
        return "yes"
    if not final and len(rest) <= 6 and "invoke".startswith(rest):
        return "wait"
    return "no"


def _closer_hold(text: str, tag: str, start: int) -> int:
    """How much of a streamed string value's end (after ``start``, what was
    sent) must be held back because it may be the value's own closing tag
    written without the marker (``</tag>`` plus whitespace, or a prefix)."""
    i = text.rfind("<", start)
    if i < 0:
        return 0
    tail = text[i:]
    stripped = tail.rstrip()
    return len(tail) if f"</{tag}>".startswith(stripped) else 0


class _Call:
    def __init__(self, name: str, schema: dict | None):
        self.name = name
        self.known = schema is not None
        self.schema = schema or {}
        self.defs: dict = {}
        for key in ("$defs", "definitions"):
            if isinstance(self.schema.get(key), dict):
                self.defs.update(self.schema[key])
        params = resolve_schema(self.schema, self.defs)
        props = params.get("properties")
        self.props = props if isinstance(props, dict) else {}
        extra = params.get("additionalProperties")
        self.extra = extra if isinstance(extra, dict) else {}
        self.final: dict[str, Any] = {}
        self.pending_key: str | None = None
        self.pending: list[Node] = []
        # A top-level string parameter that is streamed while generated:
        # its node and how many characters of its text were sent (None
        # while nothing was sent).
        self.live: Node | None = None
        self.live_sent: int | None = None
        self.events: list[tuple] = []  # held back (complete-output mode)
        self.index = -1
        self.emitted = 0
        self.streamed = ""

    def convert(self, key: str, nodes: list[Node]) -> Any:
        return convert_group(nodes, self.props.get(key, self.extra), self.defs)

    def is_plain_string(self, key: str) -> bool:
        return key in self.props and is_plain_string(self.props[key], self.defs)

    def arguments(self) -> dict[str, Any]:
        """The arguments known so far, in the order they are streamed."""
        args = dict(self.final)
        if self.pending_key is not None and self.pending_key not in args:
            args[self.pending_key] = self.convert(self.pending_key, self.pending)
        elif self.live is not None and self.live_sent is not None:
            assert self.live.tag is not None
            args[self.live.tag] = self.live.text[: self.live_sent]
        return args


class _Scanner:
    """Incremental parser; ``commit_early`` selects the streaming behaviour
    (a call's name and arguments go out as soon as they are known)."""

    def __init__(self, tools: Sequence[Any] | None, commit_early: bool):
        self.schemas = tool_schemas(tools)
        self.commit_early = commit_early
        self.mode = _CONTENT
        self.buf = ""
        self.out: list[tuple] = []
        self.call: _Call | None = None
        self.stack: list[Node] = []
        self._start_block()
        self.mode = _CONTENT

    def _start_block(self) -> None:
        self.mode = _BLOCK
        self.block = ""  # raw text of the current block consumed so far
        self.degrade_from = 0  # block[:degrade_from] is emitted or consumed
        self.block_calls = 0  # calls that came out of this block
        self.committed = False  # the block opener is no longer held back
        self.stray = False  # after a bad invoke: content until a resync tag
        self.prose = False  # inside a run of prose between invokes
        self._resolved = False

    def _emit(self, ev: tuple) -> None:
        call = self.call
        if not self.commit_early and call is not None and ev[0] != "text":
            call.events.append(ev)
        else:
            self.out.append(ev)

    def _content(self, text: str) -> None:
        """Text of the current block that goes out as content now."""
        if text:
            self.out.append(("text", text))
        self._resolved = True

    def feed(self, text: str) -> list[tuple]:
        self.buf += text
        self._run(final=False)
        out, self.out = self.out, []
        return out

    def finish(self) -> list[tuple]:
        self._run(final=True)
        while self.mode == _INVOKE:
            self._degrade("output ended inside a tool call", 0)
            self._run(final=True)
        if self.mode == _BLOCK:
            # A block that is never closed: complete invokes stay calls; a
            # block that gave no call is content.
            if not self.block_calls:
                self._content(self.block[self.degrade_from :])
            self.mode = _CONTENT
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
                self._start_block()
                self.block = TOOL_CALL_OPEN
                continue
            try:
                lexeme = self._lex(final)
                if lexeme is None:
                    return
                kind, value, raw = lexeme
                self._resolved = False
                if self.mode == _BLOCK:
                    self._in_block(kind, value, raw)
                else:
                    self._in_invoke(kind, value, raw)
                self.buf = self.buf[len(raw) :]
                self.block += raw
                if self._resolved:
                    self.degrade_from = len(self.block)
                if self.commit_early and self.mode == _INVOKE and not self.stack:
                    self.degrade_from = len(self.block)
            except _Malformed as e:
                self._degrade(str(e), e.skip)

    def _at_boundary(self) -> bool:
        """A parameter may start here (no leaf text is open)."""
        if not self.stack:
            return True
        top = self.stack[-1]
        return top.tag is not None and not top.text.strip()

    def _lex(self, final: bool) -> tuple[str, str, str] | None:
        buf = self.buf
        if buf.startswith(MARKER):
            rest = buf[len(MARKER) :]
            if not rest:
                return None
            if rest[0] != "<":
                dropped = _dropped_lt_invoke(rest, final)
                if dropped == "wait":
                    return None
                if dropped == "yes":
                    gt = rest.find(">")
                    if gt < 0:
                        if len(rest) > _MAX_TAG_CHARS:
                            raise _Malformed("unterminated tag", len(MARKER))
                        return None
                    return "tag", rest[:gt], MARKER + rest[: gt + 1]
                if self.mode == _INVOKE and self._at_boundary():
                    # A value whose opening tag was lost: its name comes
                    # with the closing tag.
                    return "headless", "", MARKER
                raise _Malformed("marker not followed by a tag", len(MARKER))
            gt = rest.find(">")
            if gt < 0:
                if len(rest) > _MAX_TAG_CHARS:
                    raise _Malformed("unterminated tag", len(MARKER))
                return None
            return "tag", rest[1:gt], MARKER + rest[: gt + 1]
        i = buf.find(MARKER)
        complete = i >= 0
        if complete:
            run = buf[:i]
        else:
            run = buf[: len(buf) - (0 if final else _partial(buf, MARKER))]
        if not run:
            return None
        if self.mode == _BLOCK:
            if self.stray:
                return "text", run, run
            if self.prose or run.strip():
                if not self.committed:
                    raise _Malformed("text where a tag is expected")
                return "prose", run, run
            # Whitespace between invokes is layout: decided at the next tag.
            return ("text", run, run) if complete or final else None
        if not self.stack:
            if run.strip():
                raise _Malformed("text between parameters")
            return ("text", run, run) if complete or final else None
        return "text", run, run

    def _is_resync_tag(self) -> bool:
        """The input starts with a complete tag where scanning can resume
        inside a block after a bad invoke."""
        rest = self.buf[len(MARKER) :]
        if not self.buf.startswith(MARKER) or not rest:
            return False
        if rest[0] == "<":
            gt = rest.find(">")
            value = rest[1:gt] if gt > 0 else None
        else:
            gt = rest.find(">")
            value = rest[:gt] if gt > 0 and rest.startswith("invoke") else None
        if value is None:
            return False
        return value in ("tool_call", "/tool_call") or bool(_INVOKE_RE.match(value))

    # --------------------------------------------------------------- block
    def _in_block(self, kind: str, value: str, raw: str) -> None:
        if kind == "text":
            if self.stray:
                self._content(raw)
            return  # layout whitespace between invokes
        if kind == "prose":
            # Text between invokes is content; the block goes on.
            self.prose = True
            self._content(raw)
            return
        self.prose = False
        if value == "/tool_call":
            if self.block_calls:
                self._resolved = True
            else:  # nothing came out of this block: all of it is content
                self._content(self.block[self.degrade_from :] + raw)
            self.mode, self.call = _CONTENT, None
            return
        if value == "tool_call":
            # A new opener inside a block: the old block ends here.
            if not self.block_calls and self.block[self.degrade_from :]:
                self.out.append(("text", self.block[self.degrade_from :]))
            self._start_block()
            return
        m = _INVOKE_RE.match(value)
        if m:
            name = next(g for g in m.groups() if g is not None).strip()
            if not name:
                raise _Malformed("empty function name", len(raw))
            self.call = _Call(name, self.schemas.get(name))
            if not self.call.known:
                logger.debug("minimax_m3: call to unknown tool %r", name)
            self.stack = []
            self.mode = _INVOKE
            self.stray = False
            if self.commit_early:
                self.committed = True
            self._emit(("open", self.call))
            return
        if _is_invoke_form(value):
            raise _Malformed(f"invoke without a name: <{value}>", len(raw))
        if self.committed:
            self._content(raw)
            self.stray = True
            return
        raise _Malformed(f"unexpected tag <{value}> in a tool_call block", len(raw))

    # -------------------------------------------------------------- invoke
    def _in_invoke(self, kind: str, value: str, raw: str) -> None:
        call = self.call
        assert call is not None
        if kind == "headless":
            if self.stack:
                self.stack[-1].text = ""
            self.stack.append(Node(None))
            return
        if kind == "text":
            if not self.stack:
                return  # whitespace between parameters
            top = self.stack[-1]
            if top.children and value.strip():
                raise _Malformed(f"text mixed with nested tags in <{top.tag}>")
            top.text += value
            if top is call.live and self.commit_early:
                self._stream_live(call)
            return
        closing = value.startswith("/")
        name = value[1:].strip() if closing else value.strip()
        if self.stack and not (closing and self.stack[-1].tag == name):
            self._implicit_close()
        if not self.stack and (
            value in ("tool_call", "/tool_call") or _is_invoke_form(value)
        ):
            # The invoke's closing tag is missing but all of its
            # parameters are complete: it ends here.
            self._close_invoke()
            self._in_block(kind, value, raw)
            return
        if closing:
            if self.stack and self.stack[-1].tag is None:
                self._close_headless(name)
                return
            if name == "invoke" and not self.stack:
                self._close_invoke()
                self._resolved = True
                return
            if not self.stack or self.stack[-1].tag != name:
                raise _Malformed(f"unexpected closing tag </{name}>")
            self._close_tag(name)
            return
        if _is_invoke_form(value) or value == "tool_call":
            raise _Malformed(f"<{value}> inside a parameter")
        if not _TAG_NAME_RE.match(name):
            raise _Malformed(f"bad parameter tag <{value}>")
        if self.stack:
            top = self.stack[-1]
            if top.tag is None:
                raise _Malformed(f"nested tag <{name}> in a value without its tag")
            if top.text.strip():
                raise _Malformed(f"nested tag after text in <{top.tag}>")
            top.text = ""
            self.stack.append(Node(name))
            return
        if call.pending_key is not None:
            if call.pending_key == name and call.is_plain_string(name):
                raise _Malformed(f"repeated string parameter <{name}>")
            if call.pending_key != name:
                self._finalize_pending()
        node = Node(name)
        self.stack.append(node)
        if (
            call.pending_key is None
            and name not in call.final
            and call.is_plain_string(name)
        ):
            call.live, call.live_sent = node, None

    def _stream_live(self, call: _Call) -> None:
        node = call.live
        assert node is not None and node.tag is not None
        text = node.text
        if call.live_sent is None:
            if not text.strip():
                return  # may still turn into nested tags
            self._emit(("str_open", call, node.tag))
            call.live_sent = 0
        end = len(text) - _closer_hold(text, node.tag, call.live_sent)
        if end > call.live_sent:
            self._emit(("str_text", call, text[call.live_sent : end]))
            call.live_sent = end

    def _implicit_close(self) -> None:
        """Accept ``M<q>text</q>`` (closing tag without the marker)."""
        if not self.stack:
            return
        top = self.stack[-1]
        if top.tag is None or top.children:
            return
        closer = f"</{top.tag}>"
        body = top.text.rstrip()
        if body.endswith(closer):
            top.text = body[: -len(closer)]
            self._close_tag(top.tag)

    def _close_headless(self, name: str) -> None:
        """``M value M</name>``: the value's opening tag was lost (or written
        as ``M name>``); the closing tag names it."""
        parent = self.stack[-2].tag if len(self.stack) > 1 else "invoke"
        if (
            name in ("invoke", "tool_call", parent)
            or not _TAG_NAME_RE.match(name)
        ):
            raise _Malformed(f"a value without an opening tag closed by </{name}>")
        node = self.stack[-1]
        if not node.children and node.text.startswith(name + ">"):
            node.text = node.text[len(name) + 1 :]
        node.tag = name
        self._close_tag(name)

    def _close_tag(self, name: str) -> None:
        call = self.call
        assert call is not None
        node = self.stack.pop()
        if self.stack:
            self.stack[-1].children.append(node)
            return
        if call.pending_key is not None and call.pending_key != name:
            self._finalize_pending()
        if call.pending_key == name:
            if call.is_plain_string(name):
                raise _Malformed(f"repeated string parameter <{name}>")
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
        live = call.live if any(n is call.live for n in nodes) else None
        if live is not None:
            call.live = None
        if live is not None and call.live_sent is not None:
            value = live.text
            call.final[key] = value
            self._emit(("str_close", call, key, value[call.live_sent :]))
            call.live_sent = None
            return
        value = call.convert(key, nodes)
        call.final[key] = value
        self._emit(("param", call, key, value))

    def _close_invoke(self) -> None:
        call = self.call
        assert call is not None
        self._finalize_pending()
        self._emit(("close", call))
        self.mode, self.call, self.stack = _BLOCK, None, []
        self.block_calls += 1
        self.committed = True
        if not self.commit_early:
            self.out.extend(call.events)
            call.events = []
        self.degrade_from = len(self.block)

    def _degrade(self, why: str, skip: int) -> None:
        logger.debug("minimax_m3: malformed tool call markup (%s)", why)
        call = self.call
        if call is not None and self.commit_early:
            # The name is already out: close the call with what it has.  A
            # string value that was being streamed keeps what was sent.
            live = call.live
            if live is not None and any(n is live for n in self.stack):
                if call.live_sent is not None:
                    assert live.tag is not None
                    call.final[live.tag] = live.text[: call.live_sent]
                    self._emit(("str_close", call, live.tag, ""))
                call.live, call.live_sent = None, None
            self.stack = []
            self._finalize_pending()
            self._emit(("close", call))
            self.block_calls += 1
        elif call is not None:
            call.events = []
        self.call, self.stack = None, []
        text = self.block[self.degrade_from :] + self.buf[:skip]
        self.block += self.buf[:skip]
        self.buf = self.buf[skip:]
        if not skip and self.buf.startswith(MARKER) and not self._is_resync_tag():
            # Scanning must make progress: the marker goes with the text.
            text += MARKER
            self.block += MARKER
            self.buf = self.buf[len(MARKER) :]
        if text:
            self.out.append(("text", text))
        # The rest of the block is scanned on: later invokes are still calls.
        self.mode = _BLOCK
        self.stray = self.committed = True
        self.prose = False
        self.degrade_from = len(self.block)
