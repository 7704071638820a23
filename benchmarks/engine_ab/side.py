# SPDX-License-Identifier: Apache-2.0
"""One side of the engine A/B: an ``LLM`` over the model directory, the rows timed
in order, each written to ``--rows`` as soon as it is measured."""

import argparse
import json
import random
import statistics
import time


def _prompts(n: int, length: int, vocab: int, rng: random.Random) -> list[dict]:
    """Fresh random prompts (no two share a prefix, nothing is cached)."""
    return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(length)]}
            for _ in range(n)]


def engine_kwargs(smoke: bool) -> dict:
    """Seed 002's engine settings (FP8 KV, FULL_AND_PIECEWISE, chunks of 8192); smoke:
    tiny fp32 eager on the CPU."""
    if smoke:
        return dict(dtype="float32", enforce_eager=True, max_model_len=4096,
                    max_num_batched_tokens=512, gpu_memory_utilization=0.3,
                    kv_cache_memory_bytes=256 << 20)
    return dict(dtype="bfloat16", kv_cache_dtype="fp8", max_model_len=40960,
                max_num_batched_tokens=8192, gpu_memory_utilization=0.85,
                compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"})


def serving_limits() -> dict:
    """The serving matrix's engine limits (``vllm serve --max-model-len 132096
    --max-num-batched-tokens 32768``), for profiles that must see the engine the serving
    rows saw: buffers, chunking and the warm-up's launch plans follow these limits."""
    from benchmarks.serving.matrix_spec import GPU_DEFAULTS
    from benchmarks.serving.server import Plan

    return dict(max_model_len=GPU_DEFAULTS["max_model_len"],
                max_num_batched_tokens=Plan.batched_tokens)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    rows: dict = {}

    def record(name, value):
        rows[name] = value
        json.dump(rows, open(args.rows, "w"), indent=1)
        print(f"ROW {name} = {value}", flush=True)

    from vllm import LLM, SamplingParams

    smoke = args.smoke
    kw = engine_kwargs(smoke)
    t0 = time.perf_counter()
    llm = LLM(model=args.model, load_format="dummy", block_size=128, skip_tokenizer_init=True,
              language_model_only=True, enable_prefix_caching=False,
              enable_chunked_prefill=True, max_num_seqs=32, seed=0, **kw)
    record("engine_start_s", round(time.perf_counter() - t0, 2))
    vocab = 512 if smoke else 32000
    rng = random.Random(0)
    ctx, long_ctx = (1024, 2048) if smoke else (8192, 32768)

    def timed(prompts, max_tokens):
        sp = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0,
                            ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        return time.perf_counter() - t

    timed(_prompts(1, 1000 if not smoke else 200, vocab, rng), 4)          # warm-up
    # the first request at a new length against a repeat: compilation on first use
    for length in (ctx, long_ctx):
        record(f"prefill_1x{length}_first_s", round(timed(_prompts(1, length, vocab, rng), 1), 4))
        record(f"prefill_1x{length}_repeat_s", round(statistics.median(
            timed(_prompts(1, length, vocab, rng), 1) for _ in range(2)), 4))
    timed(_prompts(4, ctx, vocab, rng), 1)                                   # warm round
    record(f"prefill_4x{ctx}_s", round(statistics.median(
        timed(_prompts(4, ctx, vocab, rng), 1) for _ in range(3)), 4))
    decode = ((1, 8, 2), (4, 4, 1)) if smoke else ((1, 128, 3), (8, 64, 2), (32, 64, 1))
    for batch, steps, rounds in decode:   # batch 32 last: upstream's crashed there before
        timed(_prompts(batch, ctx, vocab, rng), 3)                           # warm round
        per_step = []
        for _ in range(rounds):
            one = timed(_prompts(batch, ctx, vocab, rng), 1)
            many = timed(_prompts(batch, ctx, vocab, rng), steps + 1)
            per_step.append((many - one) / steps * 1e3)
        record(f"decode_b{batch}_at_{ctx}_ms_per_step", round(statistics.median(per_step), 3))


if __name__ == "__main__":
    main()
