# SPDX-License-Identifier: Apache-2.0
"""Does the first request at a new prompt length pay for compilation? (issue 48, item 5:
"the first request at a new prompt length is no more than 20% slower than a repeat").

Against a running server: one streamed request of ``isl`` fresh random token ids, then
``repeats`` more of the same length (fresh ids each: no prefix is shared, and the matrix
serves with prefix caching off anyway), each generating ``max_tokens`` tokens. TTFT is
client-side (request sent -> first streamed chunk), in ms. The serving matrix runs it at
each concurrency-1 row, before that row's recorded `vllm bench serve`: rows run
concurrency-major, so this is the first request at that length since the server started
(``fresh``), unless the server was restarted in between (recorded per call).

`vllm bench serve` itself cannot say this: its first request is an unrecorded single-prompt
test run, so a compile there never shows in the row's TTFT; the JIT monitor's log lines
name what compiled, this says what it cost."""

import random
import statistics

from .client import rand_ids, run_async, timed_stream

LIMIT = 1.2  # first / median(repeats), the "no more than 20% slower"


def summarize(ttfts_ms: list[float]) -> dict:
    """``ttfts_ms``: the first request's TTFT, then the repeats'. Raises on fewer than
    two values (no repeat to compare with)."""
    if len(ttfts_ms) < 2:
        raise ValueError(f"need the first request and at least one repeat, got {ttfts_ms}")
    first, repeats = ttfts_ms[0], ttfts_ms[1:]
    median = statistics.median(repeats)
    ratio = first / median if median > 0 else float("inf")
    return {"first_ttft_ms": round(first, 1), "repeat_ttft_ms": [round(t, 1) for t in repeats],
            "repeat_median_ms": round(median, 1), "first_over_repeat": round(ratio, 3),
            "within_limit": ratio <= LIMIT}


def first_and_repeats(server, isl: int, vocab: int, repeats: int = 3, max_tokens: int = 2,
                      timeout: float = 300.0, seed: int = 0) -> dict:
    """TTFTs of the first request of ``isl`` tokens and of ``repeats`` more, summarized
    (``summarize``). ``server``: anything with ``url`` (a ``server.Server``)."""
    if isl < 1 or repeats < 1 or vocab < 1:
        raise ValueError(f"isl {isl}, repeats {repeats} and vocab {vocab} must be positive")
    rng = random.Random(seed)

    async def body(aclient):
        out = []
        for _ in range(1 + repeats):
            r = await timed_stream(aclient, rand_ids(rng, isl, vocab), max_tokens)
            out.append((r["first"] - r["t0"]) * 1e3)
        return out

    return dict(summarize(run_async(server, timeout, body)), isl=isl, max_tokens=max_tokens)
