# SPDX-License-Identifier: Apache-2.0
"""The engine A/B's prefill profile end to end on the installed flavor's CPU build
(`--smoke`): one engine start profiles two prompt lengths (each side of a layout threshold
on the GPU), each with unprofiled repeats, and the report gets one wall-time row per
length. The side is the series' path of the installed flavor (C on v0.23.0, B on v0.26.0).
No performance meaning on CPU; what is pinned is that every length is measured and
reported from one engine start."""

import json
import subprocess
import sys
from pathlib import Path

from installed_flavor import series_side_or_skip

REPO = Path(__file__).resolve().parents[2]
SIDE = series_side_or_skip()


def test_prefill_profile_measures_each_length_in_one_engine_start(tmp_path):
    out = tmp_path / "ab"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_ab", "--out", str(out), "--smoke",
         "--sides", SIDE, "--profile", "prefill", "--prefill-ctx", "127,128",
         "--prefill-repeats", "2", "--no-rows", "--timeout", "600"],
        cwd=REPO, capture_output=True, text=True, timeout=700)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    log = (out / f"profile-{SIDE}-prefill.log").read_text()
    assert log.count("Initializing a V1 LLM engine") <= 1   # one engine for both lengths
    profiles = json.loads((out / "engine_ab.json").read_text())["sides"][SIDE]["profiles"]
    assert sorted(profiles) == ["prefill@127", "prefill@128"]
    for ctx in (127, 128):
        prof = json.loads((out / f"profile-{SIDE}-prefill-ctx{ctx}.json").read_text())
        assert prof == profiles[f"prefill@{ctx}"]
        assert prof["phase"] == "prefill" and prof["ctx"] == ctx
        assert len(prof["wall_ms_samples"]) == 2 and prof["wall_median_ms"] > 0
        assert prof["first_wall_ms"] > 0       # the first prefill at that length, apart
        assert prof["step_ms"] > 0 and prof["kernels_us_per_step"]
    report = (out / "engine_ab.md").read_text()
    assert f"| prefill@127 | {profiles['prefill@127']['wall_median_ms']} |" in report
