# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' layout on CPU: both packages import and parse their arguments
from the repository root, their modules stay small, and every results folder's
generated latest.md is current."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKE_LATEST = REPO / "benchmarks" / "results" / "make_latest.py"


@pytest.mark.parametrize("pkg", ["benchmarks.msa", "benchmarks.serving",
                                 "benchmarks.serving.matrix"])
def test_runs_as_a_module_from_the_repo_root(pkg):
    out = subprocess.run([sys.executable, "-m", pkg, "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage:" in out.stdout


def test_msa_refuses_without_a_gpu_and_bad_sweep_kinds():
    import torch
    out = subprocess.run([sys.executable, "-m", "benchmarks.msa", "--sweep-kinds", "nope"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "unknown --sweep-kinds ['nope']" in out.stderr
    if not torch.cuda.is_available():
        out = subprocess.run([sys.executable, "-m", "benchmarks.msa", "--quick"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 2 and "needs a GPU" in out.stderr


def test_benchmark_modules_stay_small():
    big = {str(p.relative_to(REPO)): n for p in (REPO / "benchmarks").rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 600}
    assert not big, f"split these by concern (at most about 600 lines each): {big}"


def test_latest_md_is_current():
    out = subprocess.run([sys.executable, str(MAKE_LATEST), "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_latest_md_lists_newest_first_and_refuses_undated_folders(tmp_path):
    sys.path.insert(0, str(MAKE_LATEST.parent))
    try:
        import make_latest
    finally:
        sys.path.pop(0)
    d = tmp_path / "bench"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    with pytest.raises(SystemExit, match="no dated result files"):
        make_latest.render(d)
    (d / "2026-01-02-a.md").write_text("# old\n")
    (d / "2026-03-04-b.json").write_text("{}")
    (d / "2026-02-03-c.md").write_text("# newer report\n")
    text = make_latest.render(d)
    assert "## Newest report: [2026-02-03-c.md]" in text and "> # newer report" in text
    rows = [line.split("|")[2].strip() for line in text.splitlines()
            if line.startswith("| 2026-")]
    assert rows == ["[2026-03-04-b.json](2026-03-04-b.json)",
                    "[2026-02-03-c.md](2026-02-03-c.md)", "[2026-01-02-a.md](2026-01-02-a.md)"]
