"""The series' decode path issues few PyTorch ops per step besides its kernels: the
token -> request / position maps are built once per metadata object (2 small kernels
for one token per request), not by every sparse layer's indexer and attention. On the
H100 (2026-12-05) those per-layer rebuilds were about 50 small launches per batch-1
decode step; `benchmarks/engine_ab/host_dispatch.py` counts them on CPU with the
Triton launches stubbed. Counts, not timings."""

import json
import os
import subprocess
import sys

from conftest import REPO


def host_dispatch_rows(tmp_path, *args: str) -> list[dict]:
    """The rows of one `python -m benchmarks.engine_ab.host_dispatch` run."""
    out = tmp_path / "host.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_ab.host_dispatch", *args, "--out", str(out)],
        cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
        text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return json.loads(out.read_text())["rows"]


def test_decode_step_issues_no_per_layer_map_kernels(tmp_path):
    rows = {(r["path"], r["batch"]): r
            for r in host_dispatch_rows(tmp_path, "--steps", "3", "--batches", "1,8",
                                        "--prefills", "")
            if r["kind"] == "decode"}
    for batch in (1, 8):
        series, upstream = rows[("series", batch)], rows[("upstream", batch)]
        # 3 sparse layers share 2 metadata objects (indexer, attention): 2 ops each
        assert series["kernel_ops"] <= 4, series["ops"]
        # each layer: the index (scores, top-k) and the attention (blocks, merge)
        assert series["launches"] <= 12, series["kernels"]
        # the harness drove upstream's path too (its kernels, stubbed, were reached)
        assert upstream["launches"] > 0, upstream


def test_prefill_rows_name_lengths_under_a_threshold_exactly(tmp_path):
    """A 1023-token prefill (the token-tile layout, one under BLOCK_MAJOR_MIN_TOKENS) is
    labelled by its count, not rounded down to "0k"; the 1024-token one (block-major)
    launches more kernels (the grouping and the merge)."""
    rows = {(r["path"], r["row"]): r
            for r in host_dispatch_rows(tmp_path, "--steps", "1", "--batches", "",
                                        "--prefills", "0+1023,0+1024")}
    assert {row for _, row in rows} == {"prefill 1023", "prefill 1k"}
    assert rows[("series", "prefill 1023")]["launches"] < rows[("series", "prefill 1k")]["launches"]
