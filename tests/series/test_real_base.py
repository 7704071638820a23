"""The repository's own series on the real pinned base, and the installed CPU build.

`make test` applies the series and installs the CPU wheel before running these.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from m3series.pin import BasePin
from m3series.series import Series, default_flavor, list_flavors

FLAVORS = list_flavors(REPO)
DEFAULT = default_flavor(REPO)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for d in ("patches", "vllm_overlay") for p in sorted((root / d).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_series_applies_to_real_base_and_exports_byte_for_byte(tmp_path, flavor):
    root = tmp_path / "series"
    for d in ("patches", "vllm_overlay"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    before = _snapshot(root)
    tree = tmp_path / "vllm"
    run = lambda *a: subprocess.run([sys.executable, str(REPO / "apply.py"), "--root", str(root),
                                     *a, "--flavor", flavor, "--tree", str(tree)],
                               capture_output=True, text=True)
    out = run("apply")
    assert out.returncode == 0, out.stderr
    series = Series.load(root, flavor)
    version = BasePin.load(series.pin_path).version
    log = subprocess.run(["git", "-C", str(tree), "log", "--reverse", "--format=%s"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert log[0].startswith(f"vLLM v{version} (pristine base")
    assert log[1:] == [e.subject for e in series.entries]
    out = run("export")
    assert out.returncode == 0 and "series unchanged" in out.stdout, out.stdout + out.stderr
    assert _snapshot(root) == before


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fix_entries_carry_upstream_provenance(flavor):
    entries = {e.subject: e for e in Series.load(REPO, flavor).entries}
    for pr in ("51585", "51632"):
        (entry,) = [e for e in entries.values() if f"/pull/{pr}" in e.fields.get("Origin", "")]
        assert entry.origin_kind == "upstream"
        assert entry.fields["Forwarded"] and entry.fields["Last-Update"]


def test_every_overlay_file_is_owned_by_an_entry():
    """A file under vllm_overlay/ that no entry lists (Overlay-File) is not
    applied, so it is in no build: the repository's own flavors have none."""
    assert Series.load(REPO, DEFAULT).unowned_overlay_files() == []


def test_installed_cpu_build_is_this_series():
    import vllm

    stamp = json.loads((REPO / "build/vllm/.git/m3-series.json").read_text())
    series = Series.load(REPO, DEFAULT)
    digest = series.digest(stamp["base_ident"])
    pin = BasePin.load(series.pin_path)
    expected = f"{pin.version}+m3.g{digest[:10]}.cpu"
    assert vllm.__version__ == expected
    assert importlib.metadata.version("vllm") == expected
    # the patched modules are the ones imported
    from vllm.model_executor.layers.fused_moe.experts import triton_moe
    assert hasattr(triton_moe, "_num_align_experts")
    from vllm.platforms import current_platform
    assert current_platform.is_cpu()
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
