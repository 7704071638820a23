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

import asyncio
import json
import random
import statistics
import time

from .client import rand_ids
from .model import SERVED_NAME

LIMIT = 1.2  # first / median(repeats), the "no more than 20% slower"
SERVER_WARM_ISL = 16  # the server's first request, when the probe is the first to call it


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


def request_body(ids: list[int], max_tokens: int) -> bytes:
    """A streamed greedy completion of token ids (ignore_eos), serialized before the clock
    starts: the OpenAI client's own request building costs about 0.3 s for 32k ids on a
    2-core CPU (2026-12-07), which would sit inside every TTFT."""
    return json.dumps({"model": SERVED_NAME, "prompt": ids, "max_tokens": max_tokens,
                       "temperature": 0.0, "stream": True, "ignore_eos": True}).encode()


async def timed_ttft_ms(http, url: str, body: bytes) -> float:
    """Milliseconds from sending ``body`` to the first streamed chunk with a choice; the
    stream is read to its end so that the connection is reused."""
    t0 = time.perf_counter()
    first = None
    async with http.stream("POST", url, content=body,
                           headers={"Content-Type": "application/json"}) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")[:300]
            raise RuntimeError(f"HTTP {resp.status_code} from {url}: {text}")
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {") and \
                    json.loads(line[6:]).get("choices"):
                first = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{url}: the stream ended without a completion chunk")
    return (first - t0) * 1e3


def first_and_repeats(server, isl: int, vocab: int, repeats: int = 3, max_tokens: int = 2,
                      timeout: float = 300.0, seed: int = 0,
                      server_warm_isl: int | None = None) -> dict:
    """TTFTs of the first request of ``isl`` tokens and of ``repeats`` more, summarized
    (``summarize``). ``server``: anything with ``url`` (a ``server.Server``).

    Before the clock: the HTTP client's own first call (``GET /v1/models``, no engine
    work), so its connection set-up is not counted as the server's. With
    ``server_warm_isl``, one request of that many tokens goes first and is reported apart
    (``server_first_ttft_ms``): the server's very first request carries costs that no
    prompt length causes (the front end's first request), which the serving matrix gives
    to the first row's probe otherwise."""
    if isl < 1 or repeats < 1 or vocab < 1 or (server_warm_isl is not None
                                               and server_warm_isl < 1):
        raise ValueError(f"isl {isl}, repeats {repeats}, vocab {vocab} and server_warm_isl "
                         f"{server_warm_isl} must be positive")
    import httpx

    rng = random.Random(seed)
    url = server.url + "/v1/completions"

    async def run() -> tuple[float | None, list[float]]:
        async with httpx.AsyncClient(timeout=timeout) as http:
            (await http.get(server.url + "/v1/models")).raise_for_status()
            warm = None
            if server_warm_isl:
                warm = await timed_ttft_ms(
                    http, url, request_body(rand_ids(rng, server_warm_isl, vocab), max_tokens))
            bodies = [request_body(rand_ids(rng, isl, vocab), max_tokens)
                      for _ in range(1 + repeats)]
            return warm, [await timed_ttft_ms(http, url, b) for b in bodies]

    warm, ttfts = asyncio.run(run())
    out = dict(summarize(ttfts), isl=isl, max_tokens=max_tokens, client="httpx, body "
               "serialized before the clock")
    if warm is not None:
        out.update(server_first_ttft_ms=round(warm, 1), server_warm_isl=server_warm_isl)
    return out
