# SPDX-License-Identifier: Apache-2.0
"""benchmarks/quant_checkpoints.py's driver: a format whose engine runs past --timeout
becomes an error row (the other formats still run), and the result files are written
after each format (pure Python; the benchmark itself runs on the GPU)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import quant_checkpoints as qc  # noqa: E402


def _args(tmp_path, **over):
    a = dict(tp=1, max_model_len=4096, tiny=True, kv_cache_dtype="auto", eager=True,
             decode_batches=[1, 32], prefill_batch=2, prefill_len=2048, repeats=1,
             decode_len=512, decode_tokens=32, gpu_memory_utilization=0.8,
             workdir=str(tmp_path / "work"), out=str(tmp_path / "out"), timeout=45,
             formats=["mxfp8", "bf16"], layers=1, dense_layers=0)
    a.update(over)
    return argparse.Namespace(**a)


def test_a_timed_out_format_is_an_error_row(tmp_path, monkeypatch):
    def run(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"loading weights",
                                        stderr=b"capturing graphs")

    monkeypatch.setattr(qc.subprocess, "run", run)
    r = qc.run_format(_args(tmp_path), "mxfp8", str(tmp_path / "ckpt"))
    assert r["format"] == "mxfp8"
    assert "timed out after 45 s" in r["error"] and "capturing graphs" in r["error"]
    log = (tmp_path / "work" / "run_mxfp8" / "log.txt").read_text()
    assert log.endswith("loading weightscapturing graphs") and "timed out after 45 s" in log


def test_results_are_written_after_each_format(tmp_path):
    args = _args(tmp_path)
    (tmp_path / "out").mkdir()
    ok = {"format": "mxfp8", "weights": {"per_layer": {"0": 3 << 20}, "outside_layers": 1 << 20},
          "prefill": {"tok_s": 1000.0}, "decode": [{"tok_s": 10.0}, {"tok_s": 200.0}]}
    md = qc.write_results(args, [ok], build_s=12.0)
    assert "| mxfp8 | nan | 3.0 | 1.0 | 1000 | 10.0 | 200.0 |" in md
    assert "Not run (the run stopped first): bf16." in md
    saved = json.loads((tmp_path / "out" / "quant_checkpoints.json").read_text())
    assert [r["format"] for r in saved["results"]] == ["mxfp8"]
    md = qc.write_results(args, [ok, {"format": "bf16", "error": "timed out after 45 s"}], 12.0)
    assert "Not run" not in md and "bf16 failed:" in md and "timed out after 45 s" in md
