# SPDX-License-Identifier: Apache-2.0
"""Engine-level A/B of MiniMax-M3 on one vLLM install of the v0.26.0 flavor.

  A  upstream's MiniMax-M3 with vLLM's own MSA kernels   (VLLM_MINIMAX_M3_MSA=upstream)
  B  upstream's MiniMax-M3 with the series' MSA ops      (VLLM_MINIMAX_M3_MSA=series)

Both sides serve the same config-only model directory (the released layer shapes,
a few layers, ``--load-format dummy``) through the offline ``LLM`` API with seed
002's engine settings (FP8 KV cache, FULL_AND_PIECEWISE graphs, chunked prefill
of 8192 tokens, prefix caching off, block size 128). Each side runs in a process
of its own, one after the other, and appends its rows to ``OUT/engine_ab.json``
as they finish, so a crash (upstream's batch-32 decode crashed on the H200
before) keeps the rows before it.

Rows: engine start (s, compilation and graph capture included; the side that runs
second finds some caches warm); the first and repeated prefills of 8k and 32k
tokens (s: a kernel compiled on first use shows as a first call slower than the
repeat); prefill 4 x 8k (s, median after a warm round); decode steps at batch
1, 8 and 32 over 8k contexts (ms per step: generating N+1 tokens minus
generating 1, over N, median, after a warm round). ``--smoke`` runs tiny shapes in fp32 on the CPU
(only the series side can run there) to check the harness.

  python -m benchmarks.engine_ab --out OUT [--layers 4] [--sides A,B] [--smoke]
"""
