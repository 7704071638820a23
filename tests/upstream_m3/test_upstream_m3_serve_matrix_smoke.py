# SPDX-License-Identifier: Apache-2.0
"""The serving matrix end to end on the flavor's CPU build (`--smoke-cpu --sides B`):
a real `vllm serve` of a tiny config-only M3 with the series' MSA path, `vllm bench
serve` rows, and the first-request probe of each concurrency-1 row
(benchmarks/serving/first_request.py) through vLLM's completions API with token-id
prompts. The numbers have no performance meaning on CPU; what is pinned is that every
row and every probe produced them, and that the report carries them."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# found, not imported: importing vllm at collection would import triton early
if importlib.util.find_spec("vllm") is None:
    pytest.skip("needs the v0.26.0 flavor's CPU build (make install-cpu)", allow_module_level=True)


def test_smoke_matrix_serves_every_row_and_times_first_requests(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.serving.matrix", "run", "--smoke-cpu", "--sides", "B",
         "--out", str(out), "--workdir", str(tmp_path / "work"), "--deadline", "700"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    side = json.loads((out / "side-B.json").read_text())
    assert side["servers"][0]["msa_path_in_log"] == "series"
    rows = side["rows"]
    assert rows and all(r["status"] == "ok" and r["output_throughput"] > 0 for r in rows.values())
    # --save-detailed: one TTFT per recorded request
    assert all(len(r["ttfts_ms"]) == r["num_prompts"] and min(r["ttfts_ms"]) > 0
               for r in rows.values())
    probes = {r["isl"]: r["first_request"] for r in rows.values() if r["concurrency"] == 1}
    assert probes and all("first_request" not in r for r in rows.values() if r["concurrency"] > 1)
    for isl, p in probes.items():
        assert "error" not in p, p
        assert p["fresh"] is True and p["isl"] == isl and len(p["repeat_ttft_ms"]) == 3
        assert p["first_ttft_ms"] > 0 and min(p["repeat_ttft_ms"]) > 0
    report = (out / "matrix.md").read_text()
    assert "## First request at a new prompt length" in report
    for isl in probes:
        assert f"| B | {isl} | yes |" in report
