# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The MiniMax-M3 MSA knobs: environment variables registered as in ``vllm/envs.py``.

Every ``VLLM_MINIMAX_M3_*`` variable the MSA path reads is registered here,
with its parser and what it does; code reads them as attributes of this
module (``envs.VLLM_MINIMAX_M3_PDL``), parsed on each read like vLLM's own
``envs`` (tests set them with ``monkeypatch``). A value the parser refuses
raises ``ValueError`` naming the variable, the allowed values and the value
given. The defaults are the measured best (docs/decisions/); the knobs exist
for A/B runs (docs/design/kernels.md lists them).

(``VLLM_MINIMAX_M3_MSA``, the v0.26.0 flavor's choice between the series' and
upstream's kernels, is registered in ``vllm/envs.py`` itself.)
"""

import os
from collections.abc import Callable
from typing import Any, NamedTuple

# A prefill chunk's span below the dense limit is attended densely from this
# many tokens (``VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS``; ``dense_prefix``).
# H200, an 8192-token chunk whose first P tokens go dense beside the index:
# P = 2048 -10%, 1024 +1%, 512 -1% (the gain is the sparse work saved, which
# grows with P squared).
DENSE_PREFIX_DEFAULT_MIN_TOKENS = 2048


def _flag(name: str, default: str) -> Callable[[], bool]:
    """0 or 1 (unset: ``default``)."""

    def parse() -> bool:
        value = os.environ.get(name, default)
        if value not in ("0", "1"):
            raise ValueError(f"{name} must be 0 or 1, got {value!r}")
        return value == "1"

    return parse


def _auto_flag(name: str, unset: str) -> Callable[[], bool | None]:
    """0 or 1; None when unset or empty (``unset`` says what happens then)."""

    def parse() -> bool | None:
        value = os.environ.get(name)
        if value is None or value == "":
            return None
        if value not in ("0", "1"):
            raise ValueError(f"{name} must be 0 or 1 (unset: {unset}), got {value!r}")
        return value == "1"

    return parse


def _pow2_upto16(name: str, unset: str) -> Callable[[], int | None]:
    """0 or a power of two up to 16; None when unset or empty."""

    def parse() -> int | None:
        value = os.environ.get(name)
        if value is None or value == "":
            return None
        if not value.isdigit() or int(value) & (int(value) - 1) or int(value) > 16:
            raise ValueError(f"{name} must be 0 or a power of two up to 16 (unset: {unset}), "
                             f"got {value!r}")
        return int(value)

    return parse


def _block_major() -> int | None:
    value = _pow2_upto16("VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR",
                         "by the number of prefill tokens")()
    return value if value is None or value > 1 else 0


def _dense_prefix_min_tokens() -> int:
    value = os.environ.get("VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS", "")
    if value == "":
        return DENSE_PREFIX_DEFAULT_MIN_TOKENS
    if not value.isdigit() or 0 < int(value) < 16:
        raise ValueError("VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS must be 0 (off) or a "
                         f"token count of at least 16, got {value!r}")
    return int(value)


class Knob(NamedTuple):
    parse: Callable[[], Any]
    doc: str


environment_variables: dict[str, Knob] = {
    "VLLM_MINIMAX_M3_FOLD_KV_SCALE": Knob(
        _flag("VLLM_MINIMAX_M3_FOLD_KV_SCALE", "1"),
        "1 (default): fold scalar FP8 KV scales out of the attention inner loop "
        "(k_scale into the softmax scale, v_scale once on the output); 0 scales every "
        "K/V element (the kernels' SCALE_MODE 3; A/B only)."),
    "VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE": Knob(
        _flag("VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE", "0"),
        "1: the Triton decode index selects its top-k in the scoring launch and the "
        "attention merges its splits in the attention launch (fused_select / "
        "fused_merge); 0 (default): off until the H200 benchmark shows it pays "
        "(2026-11-30: it does not; slower). 1 also turns score-attend decode off."),
    "VLLM_MINIMAX_M3_SCORE_ATTEND_DECODE": Knob(
        _flag("VLLM_MINIMAX_M3_SCORE_ATTEND_DECODE", "1"),
        "1 (default): decode-only batches that triton_ops.score_attend_fits (batch 1-2 "
        "over block tables of at most 64 sparse blocks) run the whole sparse step in "
        "two launches (score_attend_decode); 0 keeps the four-launch chain."),
    "VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE": Knob(
        _pow2_upto16("VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE", "by context length"),
        "Tokens per program of the Triton prefill attention below the block-major "
        "threshold (token_tile; a power of two up to 16, 0 or 1 for one token per "
        "program). Unset (None): triton_ops.default_prefill_token_tile on the batch's "
        "longest context."),
    "VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR": Knob(
        _block_major,
        "(token, slot) pairs per step of the block-major prefill attention, for every "
        "batch with prefill tokens (a power of two up to 16; 0 or 1: off, reads as 0). "
        "Unset (None): triton_ops.default_prefill_layout (block-major, 4 per step, from "
        "1024 prefill tokens). Set, it replaces the token tiles."),
    "VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS": Knob(
        _dense_prefix_min_tokens,
        "A prefill chunk with at least this many tokens below the dense limit (top-k x "
        "sparse block) attends them densely beside the index (dense_prefix); 0: off; "
        "at least 16 (shorter rows may be speculative-decode rows, whose host sequence "
        f"lengths are only upper bounds). Default {DENSE_PREFIX_DEFAULT_MIN_TOKENS}."),
    "VLLM_MINIMAX_M3_PDL": Knob(
        _auto_flag("VLLM_MINIMAX_M3_PDL", "small batches"),
        "1: launch the decode kernel chain (index scoring, top-k select, attention, "
        "split merge) with programmatic dependent launch on sm90+; 0 never; unset "
        "(None): for launches of at most triton_ops._utils.PDL_MAX_TOKENS tokens."),
}


def __getattr__(name: str) -> Any:
    knob = environment_variables.get(name)
    if knob is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (the "
                             f"registered knobs: {', '.join(environment_variables)})")
    return knob.parse()


def __dir__() -> list[str]:
    return list(environment_variables)
