# SPDX-License-Identifier: Apache-2.0
"""The serving matrix end to end on the installed flavor's CPU build (`--smoke-cpu`): a real
`vllm serve` of a tiny config-only M3, `vllm bench serve` rows with per-request TTFTs, and the
first-request probe of each concurrency-1 row (benchmarks/serving/first_request.py) through
vLLM's completions API with token-id prompts, and the JIT monitor's compile lists per row and
probe (empty on CPU: no Triton). The side follows the build: C on the v0.23.0 flavor, B on
v0.26.0 (the series' MSA path). `make test` runs this file for both flavors. No performance meaning on CPU; what is pinned is that every row and every probe
produced numbers, and that the report carries them."""

import json
import subprocess
import sys
from pathlib import Path

from installed_flavor import series_side_or_skip

REPO = Path(__file__).resolve().parents[2]
SIDE = series_side_or_skip()


def test_smoke_matrix_serves_every_row_and_times_first_requests(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.serving.matrix", "run", "--smoke-cpu", "--sides", SIDE,
         "--out", str(out), "--workdir", str(tmp_path / "work"), "--deadline", "700"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    side = json.loads((out / f"side-{SIDE}.json").read_text())
    rows = side["rows"]
    assert rows and all(r["status"] == "ok" and r["output_throughput"] > 0 for r in rows.values())
    # --save-detailed: one TTFT per recorded request
    assert all(len(r["ttfts_ms"]) == r["num_prompts"] and min(r["ttfts_ms"]) > 0
               for r in rows.values())
    if SIDE == "B":
        assert side["servers"][0]["msa_path_in_log"] == "series"
    assert all("jit_in_run" in r and "jit_in_warmup" in r for r in rows.values())
    probes = {r["isl"]: r["first_request"] for r in rows.values() if r["concurrency"] == 1}
    assert probes and all("first_request" not in r for r in rows.values() if r["concurrency"] > 1)
    for isl, p in probes.items():
        assert "error" not in p, p
        assert p["fresh"] is True and p["isl"] == isl and len(p["repeat_ttft_ms"]) == 3
        assert p["first_ttft_ms"] > 0 and min(p["repeat_ttft_ms"]) > 0
        assert "jit" in p
    # the server's very first request is timed apart, before the first probe only
    first_isl = min(probes)
    assert (probes[first_isl]["server_warm_isl"] == 16
            and probes[first_isl]["server_first_ttft_ms"] > 0)
    assert all("server_first_ttft_ms" not in p for isl, p in probes.items() if isl != first_isl)
    report = (out / "matrix.md").read_text()
    assert "## First request at a new prompt length" in report
    for isl in probes:
        assert f"| {SIDE} | {isl} | yes |" in report
    assert "not monitored |" not in report
