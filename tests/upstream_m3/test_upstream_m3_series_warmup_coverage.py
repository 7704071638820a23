"""The v0.26.0 flavor's start-up warm-up compiles every variant of the series' MSA
kernels a request can launch, checked on CPU (``series_warmup_coverage.py``, run without
TRITON_INTERPRET): the series' indexer and attention over 300 random batches within the
engine's limits (decode requests at any context, up to three prefill requests, block
tables of the engine's width), each launch bound by Triton's binder for an sm_90 target,
make only launches the warm-up's plan made. The same check with the plan's decode
batches above 4 and its offset parts removed names a sparse_attn_fwd_kernel variant
(2026-12-08), so it can fail."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).with_name("series_warmup_coverage.py")


@pytest.mark.parametrize("kv_dtype,limits", [("auto", (2048, 8, 4096)),
                                             ("fp8", (8192, 32, 32768))],
                         ids=["bf16-2k-8seqs-4k", "fp8-8k-32seqs-32k"])
def test_requests_launch_only_variants_the_warmup_compiled(kv_dtype, limits):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(HELPER), kv_dtype, *map(str, limits)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["plan"] > limits[1] and result["checked"] > 1000, result
    assert result["missing"] == [], result["missing"][:12]
