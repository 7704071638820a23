# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Reasoning parser for MiniMax-M3 (``--reasoning-parser minimax_m3``).

Format
------
MiniMax-M3 writes its chain of thought as ``<mm:think>REASONING</mm:think>``
followed by the answer.  Everything inside the block goes to
``reasoning`` (``reasoning_content`` in older clients), everything after the
closing tag goes to ``content`` (where the tool-call parser, if any, looks for
tool calls).

Where generation starts depends on the chat template's thinking mode, read
from ``chat_template_kwargs``:

* ``thinking_mode="enabled"`` (also ``enable_thinking=True``,
  ``thinking=True`` or ``thinking={"type": "enabled"}``): the template opens
  the block in the prompt, so generation starts *inside* the reasoning without
  an opening tag.  A re-emitted leading ``<mm:think>`` is tolerated.
* ``thinking_mode="disabled"`` (also ``enable_thinking=False`` ...): no
  reasoning; the output is passed through unchanged as content.
* anything else (``"adaptive"``, unset): the model decides.  Output that
  starts (after whitespace) with ``<mm:think>`` has a reasoning block; output
  that starts with a stray ``</mm:think>`` (M3 prefixes earlier non-thinking
  turns with a bare closer and may imitate that) has it dropped; any other
  output is content.  If the prompt ends with an open ``<mm:think>`` (seen
  through :meth:`is_reasoning_end` on the prompt, as vLLM's streaming path
  does), or - non-streaming only - the output contains a ``</mm:think>``
  without an opening tag, the text before the first closer is reasoning.

Only one reasoning block per generation: after the closer, later tags are
plain content.  The text is parsed with one small state machine for both the
complete and the streamed output, so deltas may be split at any character,
including inside a tag (a partial tag is held back until it is decided).  A
partial tag that is still held back when the stream ends is not emitted
(vLLM gives reasoning parsers no end-of-stream hook).

Shapes seen from deployed checkpoints, and what this parser does
---------------------------------------------------------------
From public reports against other servers (facts only); the rule is the
tool parser's: recover where unambiguous, otherwise keep the text verbatim.

1. Prefilled opener: the template ends the prompt with ``<mm:think>``
   (``thinking_mode="enabled"``; smg-project/smg#1815), the model may still
   re-emit it (smg#2448): reasoning from the first character, a leading
   re-emitted opener is dropped.  Instructional tags earlier in the prompt
   do not decide (only the prompt's tail counts; vllm-project/vllm#46042).
2. Stray or repeated closers: M3 prefixes replies with ``</mm:think>``, once
   or several times (``</mm:think></mm:think>]<]minimax[>[<tool_call>``;
   smg-project/smg#2447, #2448): closers at the start of the reply and closers
   right after the block's own closer (only whitespace between) are dropped;
   a closer after other content is text.
3. Missing closer before a tool call: the reasoning runs straight into
   ``]<]minimax[>[<tool_call>`` (ai-dynamo/frontend-crates#133, a marker leak
   into reasoning; MiniMax-M2 did the same inside ``<think>``,
   waybarrios/vllm-mlx#98): the opener ends the reasoning; it and what
   follows go to content, where the tool parser finds the call.  The marker alone (an
   M3 thought may mention it) stays reasoning.
4. Thinking that contains tool-call markup: a complete ``<tool_call>``
   opener inside the thoughts is treated as in 3 (a drafted call in the
   thoughts cannot be told from a real one without the closer, and losing a
   real call silently breaks an agent loop); markup without the opener is
   reasoning text.
5. Missing closer at the end (truncated thinking, or answer words written
   before the closer; MiniMax-AI/MiniMax-M3#28): everything stays reasoning,
   nothing is guessed out of it.
6. A ``<mm:think>`` that is not at the start (quoted in content;
   vllm-project/vllm#48690): text.

The token-id methods (:meth:`is_reasoning_end`, :meth:`is_reasoning_end_streaming`,
:meth:`extract_content_ids`, :meth:`count_reasoning_tokens`) use the tag token
ids when each tag is a single token of the tokenizer and fall back to decoding
otherwise.  In vLLM 0.23.0 ``is_reasoning_end`` is only called with *prompt*
ids: it answers "does the generation that follows start outside the
reasoning?".  Shape 3 has no closer token: ``count_reasoning_tokens`` then
decodes, while the engine-side scan of :meth:`is_reasoning_end_streaming` (a
fresh instance, ids only, used for structured outputs) still waits for a
``</mm:think>``.
"""

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vllm.entrypoints.openai.engine.protocol import DeltaMessage
from vllm.logger import init_logger
from vllm.reasoning.abs_reasoning_parsers import ReasoningParser
from vllm.reasoning.minimax_m3_special_tokens import any_special
from vllm.tokenizers import TokenizerLike

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

logger = init_logger(__name__)

THINK_START = "<mm:think>"
THINK_END = "</mm:think>"
# The tool-call block opener (see the minimax_m3 tool parser).
TOOL_CALL_OPEN = "]<]minimax[>[<tool_call>"

MODE_ENABLED = "enabled"
MODE_DISABLED = "disabled"
MODE_AUTO = "auto"

_TRUE_WORDS = {"enabled", "enable", "on", "true", "yes"}
_FALSE_WORDS = {"disabled", "disable", "off", "false", "no", "none"}

# Splitter states.
_UNDECIDED = "undecided"  # auto mode, nothing but whitespace seen yet
_LEAD_REASONING = "lead_reasoning"  # inside reasoning, an opener may follow
_REASONING = "reasoning"
_AFTER_CLOSE = "after_close"  # content; repeated closers are dropped
_CONTENT = "content"

# How many trailing prompt tokens are decoded to look for a trailing tag.
_TAIL_TOKENS = 16


def thinking_mode_from_kwargs(kwargs: Any) -> str:
    """Map chat-template kwargs to ``enabled`` / ``disabled`` / ``auto``."""
    if not isinstance(kwargs, dict):
        return MODE_AUTO
    for key in ("thinking_mode", "enable_thinking", "thinking"):
        if key not in kwargs:
            continue
        value = kwargs[key]
        if isinstance(value, dict):
            value = value.get("type")
        if isinstance(value, bool):
            return MODE_ENABLED if value else MODE_DISABLED
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _TRUE_WORDS:
                return MODE_ENABLED
            if word in _FALSE_WORDS:
                return MODE_DISABLED
            return MODE_AUTO
    return MODE_AUTO


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ends ``text``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ThinkSplitter:
    """Incremental ``<mm:think>`` splitter shared by both parse paths.

    ``feed`` takes any chunk of text and returns ``(reasoning, content)``
    decided so far; ``flush`` releases whatever is held back at the end.
    """

    def __init__(self, state: str):
        self.state = state
        self._buf = ""

    @classmethod
    def for_mode(cls, mode: str) -> "ThinkSplitter":
        if mode == MODE_ENABLED:
            return cls(_LEAD_REASONING)
        if mode == MODE_DISABLED:
            return cls(_CONTENT)
        return cls(_UNDECIDED)

    @property
    def started(self) -> bool:
        return bool(self._buf) or self.state not in (_UNDECIDED, _LEAD_REASONING)

    @property
    def in_content(self) -> bool:
        return self.state in (_AFTER_CLOSE, _CONTENT)

    def feed(self, text: str) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        buf = self._buf + text
        self._buf = ""
        while True:
            if self.state == _CONTENT:
                content.append(buf)
                break
            if self.state == _AFTER_CLOSE:
                # Closers repeated right after the block (only whitespace
                # between) are framing noise, not text.
                head = buf.lstrip()
                if len(head) < len(buf):
                    content.append(buf[: len(buf) - len(head)])
                if head.startswith(THINK_END):
                    buf = head[len(THINK_END) :]
                    continue
                if not head or THINK_END.startswith(head):
                    self._buf = head
                    break
                self.state = _CONTENT
                buf = head
                continue
            if self.state in (_UNDECIDED, _LEAD_REASONING):
                head = buf.lstrip()
                if not head:
                    self._buf = buf
                    break
                if head.startswith(THINK_START):
                    self.state = _REASONING
                    buf = head[len(THINK_START) :]
                    continue
                if self.state == _UNDECIDED and head.startswith(THINK_END):
                    # Stray closer at the start of a non-thinking reply.
                    self.state = _AFTER_CLOSE
                    buf = head[len(THINK_END) :]
                    continue
                if THINK_START.startswith(head) or (
                    self.state == _UNDECIDED and THINK_END.startswith(head)
                ):
                    self._buf = buf
                    break
                self.state = _CONTENT if self.state == _UNDECIDED else _REASONING
                continue
            # _REASONING
            end = buf.find(THINK_END)
            call = buf.find(TOOL_CALL_OPEN)
            if call >= 0 and (end < 0 or call < end):
                # A tool call started without closing the reasoning: the
                # reasoning ends there, the call goes to content.
                reasoning.append(buf[:call])
                self.state = _CONTENT
                buf = buf[call:]
                continue
            if end >= 0:
                reasoning.append(buf[:end])
                self.state = _AFTER_CLOSE
                buf = buf[end + len(THINK_END) :]
                continue
            keep = max(
                _partial_suffix(buf, THINK_END), _partial_suffix(buf, TOOL_CALL_OPEN)
            )
            reasoning.append(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            break
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        buf, self._buf = self._buf, ""
        if self.state in (_LEAD_REASONING, _REASONING):
            return buf, ""
        return "", buf


class MiniMaxM3ReasoningParser(ReasoningParser):
    """Splits MiniMax-M3 output into reasoning and content (see module doc)."""

    def __init__(self, tokenizer: TokenizerLike, *args, **kwargs):
        super().__init__(tokenizer, *args, **kwargs)
        if not self.model_tokenizer:
            raise ValueError(
                "MiniMaxM3ReasoningParser needs the model tokenizer; pass it "
                "as the first constructor argument."
            )
        self.chat_template_kwargs = kwargs.get("chat_template_kwargs")
        self.mode = thinking_mode_from_kwargs(self.chat_template_kwargs)
        vocab = self.vocab
        self.start_token_id: int | None = vocab.get(THINK_START)
        self.end_token_id: int | None = vocab.get(THINK_END)
        self._single_token_tags = (
            self.start_token_id is not None and self.end_token_id is not None
        )
        # Streaming state (one parser instance per request and choice).
        self._splitter = ThinkSplitter.for_mode(self.mode)
        self._stream_used = False
        self._fed_chars = 0
        # Incremental token-id scan state (engine-side structured outputs).
        self._scanned = 0
        self._scan_verdict: bool | None = None

    # ------------------------------------------------------------------ tags
    @property
    def reasoning_start_str(self) -> str:
        return THINK_START

    @property
    def reasoning_end_str(self) -> str:
        return THINK_END

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        try:
            return self.model_tokenizer.decode(list(ids), skip_special_tokens=False)
        except TypeError:
            return self.model_tokenizer.decode(list(ids))

    def _tags_are_special(self) -> bool:
        return any_special(self.model_tokenizer, [THINK_START, THINK_END])

    def adjust_request(
        self, request: "ChatCompletionRequest | ResponsesRequest"
    ) -> "ChatCompletionRequest | ResponsesRequest":
        # If the think tags are special tokens they would be stripped from the
        # detokenized text, and the text-level split below would never see them.
        if (
            self.mode != MODE_DISABLED
            and hasattr(request, "skip_special_tokens")
            and self._tags_are_special()
        ):
            request.skip_special_tokens = False
        return request

    # ------------------------------------------------------------ token ids
    def _tail_tag(self, ids: Sequence[int]) -> str | None:
        """Which tag (if any) ends ``ids``, ignoring trailing whitespace."""
        if not ids:
            return None
        tail = list(ids[-_TAIL_TOKENS:])
        if self._single_token_tags:
            for tid in reversed(tail):
                if tid == self.end_token_id:
                    return THINK_END
                if tid == self.start_token_id:
                    return THINK_START
                if self._decode([tid]).strip():
                    return None
            return None
        text = self._decode(tail).rstrip()
        if text.endswith(THINK_END):
            return THINK_END
        if text.endswith(THINK_START):
            return THINK_START
        return None

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether generation after ``input_ids`` (a prompt) starts outside
        the reasoning block."""
        if self.mode == MODE_DISABLED:
            return True
        tag = self._tail_tag(input_ids)
        if tag == THINK_END:
            return True
        if tag == THINK_START:
            # The template opened the block: the reply starts inside it.
            if not self._splitter.started and not self._stream_used:
                self._splitter = ThinkSplitter(_LEAD_REASONING)
            return False
        # enabled: starts inside reasoning; auto: the output decides.
        return False

    def _scan_last_tag(self, input_ids: Sequence[int]) -> bool | None:
        """Incrementally find the last tag in a growing id sequence.

        Returns True if the last tag is a closer, False for an opener, None
        if no tag has been seen.
        """
        n = len(input_ids)
        if n < self._scanned:
            self._scanned, self._scan_verdict = 0, None
        start = self._scanned
        if self._single_token_tags:
            for i in range(n - 1, start - 1, -1):
                tid = input_ids[i]
                if tid == self.end_token_id:
                    self._scan_verdict = True
                    break
                if tid == self.start_token_id:
                    self._scan_verdict = False
                    break
        elif n > start:
            text = self._decode(input_ids[max(0, start - _TAIL_TOKENS) : n])
            i_end, i_start = text.rfind(THINK_END), text.rfind(THINK_START)
            if i_end >= 0 or i_start >= 0:
                self._scan_verdict = i_end > i_start
        self._scanned = n
        return self._scan_verdict

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Iterable[int]
    ) -> bool:
        if self.mode == MODE_DISABLED:
            return True
        if self._stream_used:
            # Same instance parsed the text of this step: its verdict wins, so
            # vLLM hands exactly the content part to the tool parser.
            return self._splitter.in_content
        # Engine side (structured outputs): only token ids are available.
        verdict = self._scan_last_tag(input_ids)
        if verdict is None:
            return self.mode != MODE_ENABLED
        return verdict

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        if self.mode == MODE_DISABLED:
            return list(input_ids)
        if self.end_token_id is not None and self.end_token_id in input_ids:
            last = len(input_ids) - 1 - input_ids[::-1].index(self.end_token_id)
            return list(input_ids[last + 1 :])
        if self._stream_used:
            return list(input_ids) if self._splitter.in_content else []
        if self.mode == MODE_AUTO and (
            self.start_token_id is None or self.start_token_id not in input_ids
        ):
            return list(input_ids)
        return []

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        if self.mode == MODE_DISABLED or not token_ids:
            return 0
        if self._single_token_tags and self.end_token_id in token_ids:
            inside = self.mode == MODE_ENABLED
            count = 0
            for tid in token_ids:
                if tid == self.start_token_id and count == 0:
                    inside = True
                elif tid == self.end_token_id:
                    break  # one reasoning block per generation
                elif inside:
                    count += 1
            return count if inside else 0
        reasoning, _ = self._split_text(self._decode(token_ids))
        if not reasoning:
            return 0
        return len(self.model_tokenizer.encode(reasoning, add_special_tokens=False))

    # ----------------------------------------------------------------- text
    def _split_text(self, text: str, request: Any = None) -> tuple[str, str]:
        mode = self.mode
        if self.chat_template_kwargs is None and request is not None:
            mode = thinking_mode_from_kwargs(
                getattr(request, "chat_template_kwargs", None)
            )
        if mode == MODE_DISABLED:
            return "", text
        splitter = ThinkSplitter.for_mode(mode)
        if mode == MODE_AUTO:
            head = text.lstrip()
            if (self._splitter.state == _LEAD_REASONING and not self._stream_used) or (
                THINK_END in text
                and not head.startswith(THINK_START)
                and not head.startswith(THINK_END)
            ):
                # Prompt opened the block, or a closer without an opener.
                splitter = ThinkSplitter(_LEAD_REASONING)
        r1, c1 = splitter.feed(text)
        r2, c2 = splitter.flush()
        return r1 + r2, c1 + c2

    def extract_reasoning(
        self,
        model_output: str,
        request: "ChatCompletionRequest | ResponsesRequest",
    ) -> tuple[str | None, str | None]:
        reasoning, content = self._split_text(model_output, request)
        return reasoning or None, content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        if not previous_text and self._fed_chars:
            # A new stream on a reused instance.
            self._splitter = ThinkSplitter.for_mode(self.mode)
            self._fed_chars = 0
        self._stream_used = True
        self._fed_chars += len(delta_text)
        reasoning, content = self._splitter.feed(delta_text)
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None)
