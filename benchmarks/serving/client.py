# SPDX-License-Identifier: Apache-2.0
"""OpenAI-API clients: completions with logprobs, streamed timings."""

import asyncio
import math
import random
import time

from .model import FIRST_PLAIN_ID, SERVED_NAME
from .server import Server


def rand_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    """``n`` random non-special token ids."""
    return [rng.randrange(FIRST_PLAIN_ID, vocab) for _ in range(n)]


def client_kwargs(server: "Server", timeout: float) -> dict:
    return dict(base_url=server.url + "/v1", api_key="EMPTY", timeout=timeout, max_retries=0)


def sync_client(server: "Server", timeout: float):
    import openai

    return openai.OpenAI(**client_kwargs(server, timeout))


def run_async(server: "Server", timeout: float, body):
    """``asyncio.run(body(aclient))`` with an AsyncOpenAI client that lives and
    closes inside that one event loop."""
    import openai

    async def main():
        async with openai.AsyncOpenAI(**client_kwargs(server, timeout)) as aclient:
            return await body(aclient)

    return asyncio.run(main())


def finite(values) -> bool:
    """Every logprob finite (vLLM writes -inf as -9999.0: counted as not finite)."""
    return all(v is not None and math.isfinite(v) and v > -9000.0 for v in values)


def choice_token_ids(choice) -> list[int]:
    ids = getattr(choice, "token_ids", None)
    if ids is None and choice.model_extra:
        ids = choice.model_extra.get("token_ids")
    return list(ids or [])


def completion_record(choice, usage) -> dict:
    """Token ids, logprobs (chosen and top-k) and finiteness of one choice."""
    lp = choice.logprobs
    chosen = list(lp.token_logprobs or []) if lp else []
    tops = [sorted((d or {}).values(), reverse=True) for d in (lp.top_logprobs or [])] if lp else []
    return {"tokens": choice_token_ids(choice), "logprobs": chosen, "top": tops,
            "text_nonempty": bool(choice.text and choice.text.strip()),
            "finite": finite(chosen) and all(finite(t) for t in tops),
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}


def complete(client, prompt, max_tokens: int, logprobs: int = 1) -> dict:
    """One greedy completion (ignore_eos) with token ids and logprobs; latency in s."""
    t0 = time.perf_counter()
    r = client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
        logprobs=logprobs, extra_body={"return_token_ids": True, "ignore_eos": True,
                                       "skip_special_tokens": False})
    rec = completion_record(r.choices[0], r.usage)
    rec["latency_s"] = round(time.perf_counter() - t0, 3)
    return rec


async def acomplete(aclient, prompt, max_tokens: int, logprobs: int = 2) -> dict:
    r = await aclient.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
        logprobs=logprobs, extra_body={"return_token_ids": True, "ignore_eos": True,
                                       "skip_special_tokens": False})
    return completion_record(r.choices[0], r.usage)


async def timed_stream(aclient, prompt, max_tokens: int) -> dict:
    """Streamed greedy completion (ignore_eos): absolute start, first-chunk and
    end times (perf_counter s), tokens in the first chunk (> 1 when the stream
    coalesced) and the completion token count from usage."""
    t0 = time.perf_counter()
    first, n_first, n = None, 0, 0
    stream = await aclient.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True})
    async for chunk in stream:
        if chunk.choices and first is None:
            first = time.perf_counter()
            n_first = len(choice_token_ids(chunk.choices[0])) or 1
        if chunk.usage:
            n = chunk.usage.completion_tokens
    return {"t0": t0, "first": first or time.perf_counter(), "end": time.perf_counter(),
            "n": n, "n_first": n_first}

