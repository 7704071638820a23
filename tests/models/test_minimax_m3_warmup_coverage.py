"""The v0.23.0 start-up warm-up compiles every kernel variant a request can launch,
checked on CPU (``warmup_coverage.py``, run without TRITON_INTERPRET): the sparse
layer's launches for 300 random batches within the engine's limits, bound by Triton's
own binder for an sm_90 target, are all launches the warm-up's plan made. Before the
2026-12-08 fix (placement arguments unspecialised, every decode count in a mixed
batch) it named index_topk_prefill_kernel, index_block_max_prefill_sm90_kernel,
sparse_attn_tiled_kernel and sparse_attn_fwd_kernel variants, as the H100 had."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).with_name("warmup_coverage.py")


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("limits", [(2048, 8, 4096), (8192, 32, 32768)],
                         ids=["2k-8seqs-4k", "8k-32seqs-32k"])
def test_requests_launch_only_variants_the_warmup_compiled(kv_dtype, limits):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(HELPER), kv_dtype, *map(str, limits)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["plan"] > limits[1] and result["checked"] > 1000, result
    assert result["missing"] == [], result["missing"][:12]
