# SPDX-License-Identifier: Apache-2.0
"""The serving matrix end to end on the default flavor's CPU build (`--smoke-cpu --sides
C`: vLLM 0.23.0 with the series): a real `vllm serve` of a tiny config-only M3, `vllm
bench serve` rows with per-request TTFTs, and the first-request probe of each
concurrency-1 row (benchmarks/serving/first_request.py). v0.23.0 has no JIT monitor, so
no compile lists are recorded and the report says so. The v0.26.0 flavor's side B runs in
tests/upstream_m3/test_upstream_m3_serve_matrix_smoke.py. No performance meaning on CPU."""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _installed_vllm() -> str | None:
    """The installed vLLM's version, read from its metadata: importing vllm here would
    import triton before tests/kernels/conftest.py sets TRITON_INTERPRET."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


VLLM = _installed_vllm()
if VLLM is None or not VLLM.startswith("0.23."):
    pytest.skip(f"side C needs the v0.23.0 flavor's CPU build (make install-cpu); found vllm "
                f"{VLLM}", allow_module_level=True)


def test_smoke_matrix_side_c_serves_every_row_and_times_first_requests(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.serving.matrix", "run", "--smoke-cpu", "--sides", "C",
         "--out", str(out), "--workdir", str(tmp_path / "work"), "--deadline", "700"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    rows = json.loads((out / "side-C.json").read_text())["rows"]
    assert rows and all(r["status"] == "ok" and r["output_throughput"] > 0 for r in rows.values())
    assert all(len(r["ttfts_ms"]) == r["num_prompts"] for r in rows.values())
    assert all("jit_in_run" not in r for r in rows.values())  # no monitor on v0.23.0
    probes = {r["isl"]: r["first_request"] for r in rows.values() if r["concurrency"] == 1}
    assert probes
    for isl, p in probes.items():
        assert "error" not in p and "jit" not in p, p
        assert p["fresh"] is True and len(p["repeat_ttft_ms"]) == 3 and p["first_ttft_ms"] > 0
    report = (out / "matrix.md").read_text()
    for isl in probes:
        assert f"| C | {isl} | yes |" in report
    assert "not monitored |" in report
