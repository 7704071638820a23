# SPDX-License-Identifier: Apache-2.0
"""Serving benchmark of MiniMax-M3 through `vllm serve` (end to end, GPU; CPU smoke).

A config-only model directory with the released model's layer shapes but only
a few layers (random weights: ``--load-format dummy``) is served with the seed
flags; sections talk to it over HTTP on 127.0.0.1:

  serve        completions of 100 / 1k / 8k / 32k / 64k-token prompts (token ids,
               so lengths are exact; 16 greedy tokens, logprobs) and one chat
               completion: prompt tokens, latency (s), output non-empty, every
               logprob finite.  Every server stop (SIGINT) is timed and checked
               (exit within 60 s with code 0 or the SIGINT code).
  concurrency  64 concurrent greedy requests of mixed lengths, then each alone:
               exact token-id matches, first divergence position and the
               top-1/top-2 logprob margin there (ties under random weights).
  throughput   per mode (CUDA graphs FULL_AND_PIECEWISE / eager x KV fp8 / auto):
               decode tokens/s and ms/token at batch 1 and 32 (512-token prompts,
               256 tokens, ignore_eos; from the engine's timestamps via /metrics)
               and TTFT (ms) of 8k and 32k prompts.
  bench_ab     seed 002's A/B: `vllm bench serve` (random dataset) against the
               FP8-KV server with VLLM_MINIMAX_M3_FOLD_KV_SCALE=1 (fold) and 0:
               output tokens/s and median TTFT (ms).

Jobs that share a server configuration run together, so each configuration
starts once (5 starts for all sections on GPU).  One failing job or section
does not stop the others.  Results: $OUT/e2e.md (dated report), $OUT/e2e.json,
$OUT/serve.log (all servers), $OUT/bench.log (all `vllm bench serve` runs);
the report is rewritten after every job, so a killed run still leaves one.

  python -m benchmarks.serving [--sections serve,concurrency,throughput,bench_ab]
                               [--wheels /tmp/gpu-extra/wheels] [--deadline 560]
  python -m benchmarks.serving --smoke-cpu      # same flow, tiny shapes, on CPU

Sizes (defaults on GPU): --ab-isl 8192,131072 --ab-osl 128 --ab-concurrency 4,8
--ab-prompts-per-conc 2 (num-prompts = 2 x concurrency); with bench_ab selected
every server gets --max-model-len >= the longest ISL + OSL (132096), else 70000.
--tp-modes picks throughput modes.  --deadline S: no job starts after S seconds
(skipped jobs are reported); SIGTERM stops the servers and writes the report.
--wheels DIR: if uvicorn / model_hosting_container_standards do not import, the
wheels of ci/gpu_extra_wheels.sh in DIR are installed (no index) first.

Expected GPU wall (H200, estimates): start-up ~60-90 s per graphs server
(torch.compile + capture), ~30-40 s eager; serve ~10 s, concurrency ~20 s,
throughput ~15 s per mode, bench_ab ~90-120 s per fold at the defaults; all
sections ~9-10 min, so split across two calls (e.g. serve,concurrency,throughput
then bench_ab) when a call is limited to 10 min.

Random dummy weights (uniform +-1e-3) make near-uniform logits: greedy outputs
are often one repeated token and top-1/top-2 margins tiny, so a concurrency
mismatch can be a tie flipped by batching; the report gives the margins.

Exit status: 0 when every selected section passed, 1 otherwise.

Modules: ``model`` (config-only model dir, tokenizer), ``server`` (plan, server
configurations, one server), ``client`` (API calls), ``jobs`` (serve, concurrency,
throughput), ``bench_ab`` (the A/B), ``bench_serve`` / ``bench_worker`` (`vllm bench
serve` arguments, results, one process per run or one long-lived process), ``runner``
(pool of servers, deadline), ``report`` (e2e.md / e2e.json).

The serving matrix A / B / C (upstream's MSA path on v0.26.0, the series' on v0.26.0, the
series on v0.23.0; ISL 1k-128k x concurrency 1 / 8 / 32) is its own entry point,
``python -m benchmarks.serving.matrix`` (``matrix``, ``matrix_spec``, ``matrix_side``,
``matrix_report``; ci/gpu_serve_matrix.sh runs it on the GPU).
"""
