# SPDX-License-Identifier: Apache-2.0
"""Benchmarks (GPU): ``benchmarks.msa`` (the MSA kernels) and ``benchmarks.serving``
(``vllm serve`` end to end). Results: ``benchmarks/results/<benchmark>/``."""
