# SPDX-License-Identifier: Apache-2.0
"""Sections serve, concurrency and throughput: their jobs and what each measures."""

import asyncio
import dataclasses
import random
import statistics
import time
import urllib.request

from .client import acomplete, complete, finite, rand_ids, run_async, sync_client, timed_stream
from .model import SERVED_NAME
from .server import Plan, Server, ServerCfg


@dataclasses.dataclass
class Job:
    section: str
    name: str
    cfg: ServerCfg
    fn: object  # fn(server, plan) -> dict with "ok"


def main_cfg(plan: Plan) -> ServerCfg:
    return ServerCfg(kv=plan.main_kv, graphs=not plan.smoke, fold=True, max_len=plan.max_len)


# serve ---------------------------------------------------------------------
def serve_jobs(plan: Plan) -> list[Job]:
    """Completions at each prompt length and one chat completion, on the main server."""
    return [Job("serve", "completions+chat", main_cfg(plan), run_serve)]


def run_serve(server: Server, plan: Plan) -> dict:
    """Per prompt length: prompt tokens, latency (s, 16 greedy tokens, non-streamed),
    output non-empty, logprobs finite.  Then one chat completion."""
    client = sync_client(server, plan.request_timeout)
    rng, rows = random.Random(0), []
    for n in plan.serve_lens:
        try:
            rec = complete(client, rand_ids(rng, n, plan.vocab), plan.serve_max_tokens)
            rows.append({"prompt_len": n, "prompt_tokens": rec["prompt_tokens"],
                         "completion_tokens": rec["completion_tokens"],
                         "latency_s": rec["latency_s"], "text_nonempty": rec["text_nonempty"],
                         "logprobs_finite": rec["finite"],
                         "distinct_tokens": len(set(rec["tokens"])),
                         "ok": rec["prompt_tokens"] == n and rec["finite"] and rec["text_nonempty"]
                         and rec["completion_tokens"] == plan.serve_max_tokens})
        except Exception as e:
            rows.append({"prompt_len": n, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
    chat = run_chat(client, plan)
    return {"ok": all(r["ok"] for r in rows) and chat["ok"], "rows": rows, "chat": chat}


def run_chat(client, plan: Plan) -> dict:
    """One chat completion through the tokenizer's chat template."""
    try:
        t0 = time.perf_counter()
        r = client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "hello what is vllm ?"}],
            max_tokens=plan.serve_max_tokens, temperature=0.0, logprobs=True, top_logprobs=1,
            extra_body={"ignore_eos": True, "skip_special_tokens": False})
        c = r.choices[0]
        lps = [t.logprob for t in (c.logprobs.content or [])] if c.logprobs else []
        out = {"role": c.message.role, "prompt_tokens": r.usage.prompt_tokens,
               "completion_tokens": r.usage.completion_tokens,
               "latency_s": round(time.perf_counter() - t0, 3),
               "content_nonempty": bool((c.message.content or "").strip()),
               "logprobs_finite": finite(lps) and len(lps) == plan.serve_max_tokens}
        out["ok"] = (out["role"] == "assistant" and out["content_nonempty"]
                     and out["logprobs_finite"])
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    return out


# concurrency ---------------------------------------------------------------
def concurrency_jobs(plan: Plan) -> list[Job]:
    return [Job("concurrency", f"{plan.conc_n} concurrent vs alone", main_cfg(plan),
                run_concurrency)]


def run_concurrency(server: Server, plan: Plan) -> dict:
    """``conc_n`` concurrent greedy requests (random lengths in ``conc_lens``,
    seed 1), then each alone: exact token-id equality per request; for a
    mismatch the first differing position and the alone run's top-1 minus
    top-2 logprob there (a margin near 0 is a tie that batching may flip)."""
    client = sync_client(server, plan.request_timeout)
    rng = random.Random(1)
    prompts = [rand_ids(rng, rng.randint(*plan.conc_lens), plan.vocab) for _ in range(plan.conc_n)]

    async def all_at_once(aclient):
        return await asyncio.gather(
            *(acomplete(aclient, p, plan.conc_max_tokens) for p in prompts),
            return_exceptions=True)

    t0 = time.perf_counter()
    together = run_async(server, plan.request_timeout, all_at_once)
    t_conc = time.perf_counter() - t0
    t0 = time.perf_counter()
    alone = []
    for p in prompts:
        try:
            alone.append(complete(client, p, plan.conc_max_tokens, logprobs=2))
        except Exception as e:
            alone.append(e)
    t_alone = time.perf_counter() - t0
    errors = [f"{type(r).__name__}: {r}"[:200] for r in together + alone
              if isinstance(r, Exception)]
    matches, diverged, nonfinite, max_lp_diff = 0, [], 0, 0.0
    for i, (a, b) in enumerate(zip(together, alone)):
        if isinstance(a, Exception) or isinstance(b, Exception):
            continue
        nonfinite += (not a["finite"]) + (not b["finite"])
        if a["tokens"] == b["tokens"] and a["tokens"]:
            matches += 1
            max_lp_diff = max(max_lp_diff, max_diff(a["logprobs"], b["logprobs"]) or 0)
            continue
        pos = next((k for k, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y),
                   min(len(a["tokens"]), len(b["tokens"])))
        top = b["top"][pos] if pos < len(b["top"]) else []
        margin = top[0] - top[1] if len(top) > 1 else None
        diverged.append({"request": i, "prompt_len": len(prompts[i]), "first_divergence": pos,
                         "alone_top1_minus_top2": margin,
                         "max_logprob_diff_before": max_diff(a["logprobs"][:pos],
                                                             b["logprobs"][:pos])})
        max_lp_diff = max(max_lp_diff, max_diff(a["logprobs"][:pos], b["logprobs"][:pos]) or 0)
    return {"ok": not errors and nonfinite == 0 and matches == len(prompts),
            "requests": len(prompts), "exact_matches": matches, "errors": errors[:5],
            "n_errors": len(errors), "nonfinite_logprob_runs": nonfinite,
            "mismatches": diverged, "max_logprob_diff_equal_prefix": max_lp_diff,
            "distinct_tokens": len({t for r in alone if isinstance(r, dict) for t in r["tokens"]}),
            "concurrent_wall_s": round(t_conc, 2),
            "sequential_wall_s": round(t_alone, 2),
            "prompt_lens": f"{min(map(len, prompts))}..{max(map(len, prompts))}",
            "max_tokens": plan.conc_max_tokens}


def max_diff(xs, ys):
    """Largest |x - y| of two logprob lists (None when empty or not finite)."""
    d = [abs(x - y) for x, y in zip(xs, ys)]
    return max(d) if d and finite(xs) and finite(ys) else None


# throughput ----------------------------------------------------------------
def mode_cfg(mode: str, plan: Plan) -> ServerCfg:
    """'graphs:fp8' -> ServerCfg; graphs = FULL_AND_PIECEWISE CUDA graphs."""
    kind, kv = mode.split(":")
    return ServerCfg(kv=kv, graphs=kind == "graphs", fold=True, max_len=plan.max_len)


def throughput_jobs(plan: Plan) -> list[Job]:
    return [Job("throughput", m, mode_cfg(m, plan), run_throughput) for m in plan.tp_modes]


ENGINE_METRICS = ("vllm:request_decode_time_seconds_sum", "vllm:request_decode_time_seconds_count",
                  "vllm:request_generation_tokens_sum", "vllm:request_prefill_time_seconds_sum",
                  "vllm:request_prefill_time_seconds_count")


def scrape(server: Server) -> dict:
    """The server's Prometheus counters in ENGINE_METRICS, summed over labels."""
    text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    out = dict.fromkeys(ENGINE_METRICS, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def engine_delta(server: Server, before: dict, n_requests: int) -> dict:
    """Counter deltas since ``before`` once ``n_requests`` more have finished
    (the server records a request as it finishes; wait up to 5 s)."""
    for _ in range(50):
        d = {k: v - before[k] for k, v in scrape(server).items()}
        if d["vllm:request_decode_time_seconds_count"] >= n_requests:
            break
        time.sleep(0.1)
    return d


def run_throughput(server: Server, plan: Plan) -> dict:
    """Per batch size b (b concurrent requests, ``tp_prompt``-token prompts,
    ``tp_out`` tokens, ignore_eos), from the engine's own timestamps
    (/metrics: request decode time = first to last token): decode tokens/s =
    b x tokens after the first / mean decode time, and ms per output token.
    The client-side view (streamed chunks) is kept in the JSON.  TTFT ms per
    prompt length: client-side, median of ``tp_repeats`` single requests, and
    the engine's prefill ms (scheduled to first token)."""
    rng = random.Random(2)
    out = {"flags": server.record["flags"], "ok": True}

    async def batch(aclient, b: int, prompt_len: int, max_tokens: int):
        ps = [rand_ids(rng, prompt_len, plan.vocab) for _ in range(b)]
        return await asyncio.gather(*(timed_stream(aclient, p, max_tokens) for p in ps))

    async def decode(aclient, b: int):
        before = scrape(server)
        rs = await batch(aclient, b, plan.tp_prompt, plan.tp_out)
        d = engine_delta(server, before, b)
        gen = d["vllm:request_generation_tokens_sum"] - d["vllm:request_decode_time_seconds_count"]
        mean_decode = d["vllm:request_decode_time_seconds_sum"] / max(
            d["vllm:request_decode_time_seconds_count"], 1)
        out[f"decode_tok_s_b{b}"] = round(gen / mean_decode, 1) if mean_decode > 0 else None
        out[f"ms_per_token_b{b}"] = round(1000 * d["vllm:request_decode_time_seconds_sum"]
                                          / max(gen, 1), 2)
        window = max(r["end"] for r in rs) - max(r["first"] for r in rs)
        client_toks = sum(r["n"] - r["n_first"] for r in rs)
        out[f"client_decode_tok_s_b{b}"] = round(client_toks / window, 1) if window > 0 else None
        out[f"client_first_chunk_max_b{b}"] = max(r["n_first"] for r in rs)
        out[f"tokens_b{b}"] = sorted({r["n"] for r in rs})
        out["ok"] &= all(r["n"] == plan.tp_out for r in rs)

    async def ttft(aclient, n: int):
        before = scrape(server)
        ts = [(await batch(aclient, 1, n, 1))[0] for _ in range(plan.tp_repeats)]
        d = engine_delta(server, before, plan.tp_repeats)
        out[f"ttft_ms_{n}"] = round(1000 * statistics.median(r["first"] - r["t0"] for r in ts), 1)
        out[f"prefill_ms_{n}"] = round(1000 * d["vllm:request_prefill_time_seconds_sum"]
                                       / max(d["vllm:request_prefill_time_seconds_count"], 1), 1)

    async def measure(aclient):
        steps = [(f"b{b}", decode, b) for b in plan.tp_batches]
        steps += [(f"ttft_{n}", ttft, n) for n in plan.tp_ttft_lens]
        for name, fn, arg in steps:
            try:
                await fn(aclient, arg)
            except Exception as e:
                out[f"error_{name}"] = f"{type(e).__name__}: {e}"[:300]
                out["ok"] = False

    run_async(server, plan.request_timeout, measure)
    return out

