# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the MiniMax-M3 MSA Triton kernels (GPU only; not a test).

Shapes: one TP4 rank of MiniMax-M3 -- 16 query heads, 1 KV head, head_dim 128,
1 index head of dim 128, top-16 of 128-token sparse blocks.

1. Correctness first, at those real shapes in bf16 and fp8 KV (scalar and
   per-token-head scales), decode and chunked prefill, against a plain torch
   reference (float32/64).  Pass/fail is recorded in the results.
2. Decode: batch 1 and 32 x context 8k/32k/128k x KV bf16/fp8 (scalar scales):
   index+top-k, attention, total -- each a CUDA graph, replayed; median of
   many replays, L2 flushed before each (a warm-L2 median is kept in the JSON);
   the HBM floor (index-key bytes + selected K/V bytes over the device-to-device
   copy bandwidth measured in this run) and dense SDPA over the whole context.
   Plus the one-launch variants (fused top-k select in the index kernel,
   split merge fused into the attention kernel: ``fused_select`` /
   ``fused_merge``) with their own timings and a check of equal results.
   Plus the optional fp8 index-key cache, laid out as the engine does (packed
   pages: keys, then their float32 scales): its index+top-k time, the whole
   step with it (``total fp8-idx``, each KV cache) and the overlap of its
   selection with the bf16 one.
3. Prefill: one request, a chunk of 8192 new tokens at the end of an 8k / 32k /
   128k context, bf16 / fp8 KV: index+top-k, attention, total, and dense causal
   SDPA (lower-right causal mask) on the same chunk.

4. Modes: ``--sweep`` / ``--sweep-only --sweep-kinds ...`` time the launch-shape
   knobs (decode blocks per program and splits, prefill tile shapes, PDL, L2, read
   ceiling, ...: ``sweeps.SWEEP_KINDS``); ``--prefix-overlap`` times the whole 8k
   prefill step with the dense prefix (``prefix_overlap.py``).

Inputs are fresh random tensors every run.  Writes ``bench_msa.md`` and
``bench_msa.json`` under ``$OUT`` (default ``./out``).

Usage, from the repository root:
  python -m benchmarks.msa [--quick] [--prefill-only | --decode-only] [--reps N]
                           [--check-only] [--sweep | --sweep-only [--sweep-kinds K,...]]
                           [--prefix-overlap]
Exit status 1 when the correctness check failed.

Modules: ``harness`` (shapes, kernel loading, timing), ``checks`` (inputs and the
torch reference), ``floors`` (bandwidth, launch and read floors), ``decode`` and
``prefill`` (the tables), ``sweeps*`` (the knobs), ``prefix_overlap`` (a mode),
``report`` (markdown), ``table`` (one run).
The kernels are imported from the installed (patched) vLLM; when that fails
they are loaded straight from this repository's ``vllm_overlay`` tree.
"""
