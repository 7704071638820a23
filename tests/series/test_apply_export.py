"""apply / export / status on the fake base: happy paths, idempotence, round trip, refusals."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import ENGINE_DIFF, UTIL_DIFF, patch_text, sha256


def test_apply_makes_one_commit_per_entry_with_entry_metadata(two_entries):
    p = two_entries
    p.run("apply", check=True)
    log = p.git("log", "--reverse", "--format=%an <%ae>|%aD|%s").splitlines()
    assert len(log) == 3
    assert log[0].startswith("vLLM release")
    assert log[1] == "Dev <dev@example.invalid>|Sun, 29 Nov 2026 18:00:00 +0000|Fix the engine"
    assert log[2].endswith("|Add the M3 model")
    assert "line 12 patched" in (p.tree / "vllm/engine.py").read_text()
    # the overlay file enters with the entry that owns it, not before
    assert p.git("show", "--name-status", "--format=", "HEAD").split() == [
        "A", "vllm/models/m3/__init__.py"]
    assert p.git("show", "--name-status", "--format=", "HEAD~1").split() == ["M", "vllm/engine.py"]
    body = p.git("log", "-1", "--format=%B", "HEAD~1")
    assert "Origin: upstream, https://example.invalid/pr/1" in body


def test_reapply_unchanged_series_is_a_noop(two_entries):
    p = two_entries
    p.run("apply", check=True)
    head = p.git("rev-parse", "HEAD")
    out = p.run("apply", check=True)
    assert "up to date" in out.stdout
    assert p.git("rev-parse", "HEAD") == head


def test_changed_series_is_reapplied_from_the_base_reproducibly(two_entries):
    p = two_entries
    p.run("apply", check=True)
    first = p.git("rev-parse", "HEAD")
    p.add_patch("util.patch", patch_text("Change util", UTIL_DIFF))
    p.set_series(["engine-fix.patch", "util.patch", "add-m3.patch"])
    p.run("apply", check=True)
    assert p.git("log", "--format=%s").splitlines()[:3] == [
        "Add the M3 model", "Change util", "Fix the engine"]
    p.set_series(["engine-fix.patch", "add-m3.patch"])
    p.run("apply", check=True)
    assert p.git("rev-parse", "HEAD") == first      # same series -> same commits


def test_export_round_trips_byte_for_byte(two_entries):
    p = two_entries
    p.run("apply", check=True)
    # a hand-written diff (no index lines) is canonicalised once, and only that file changes
    out = p.run("export", check=True)
    assert out.stdout.split() == ["wrote", "patches/engine-fix.patch"]
    canonical = p.snapshot()
    assert b"\nindex " in canonical["patches/engine-fix.patch"]
    # from then on: apply from scratch + export leaves every byte as it was
    subprocess.run(["rm", "-rf", str(p.tree)], check=True)
    p.run("apply", check=True)
    assert "series unchanged" in p.run("export", check=True).stdout
    assert p.snapshot() == canonical


def test_export_writes_back_an_amended_entry_and_a_new_one(two_entries):
    p = two_entries
    p.run("apply", check=True)
    p.run("export", check=True)           # canonicalise the hand-written fixture diff first
    # amend the model entry's overlay file, and add a new entry with an edit and a new file
    (p.tree / "vllm/models/m3/__init__.py").write_text("MODEL = 'm3 v2'\n")
    p.git("commit", "-q", "-a", "--amend", "--no-edit")
    (p.tree / "vllm/util.py").write_text("def f():\n    return 3\n")
    (p.tree / "vllm/models/m3/kernels.py").write_text("K = 1\n")
    p.git("add", "-A")
    subprocess.run(["git", "-C", str(p.tree), "commit", "-q", "-F", "-"], check=True, text=True,
                   input="[Kernel] Add M3 kernels\n\nNew kernels.\n\nOrigin: vendor\n"
                         "Forwarded: no\nLast-Update: 2026-11-29\n")
    before = p.snapshot()
    out = p.run("export", check=True)
    after = p.snapshot()
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == {"patches/series", "patches/add-m3-kernels.patch",
                       "vllm_overlay/vllm/models/m3/__init__.py",
                       "vllm_overlay/vllm/models/m3/kernels.py"}, out.stdout
    new = after["patches/add-m3-kernels.patch"].decode()
    assert "Overlay-File: vllm/models/m3/kernels.py" in new and "return 3" in new
    # the exported series re-applies to the same content, and apply sees it as current
    assert "up to date" in p.run("apply", check=True).stdout
    tree_files = p.git("ls-files").split()
    p.run("apply", "--force", check=True)
    subprocess.run(["rm", "-rf", str(p.tree)], check=True)
    p.run("apply", check=True)
    assert p.git("ls-files").split() == tree_files
    assert (p.tree / "vllm/util.py").read_text().endswith("return 3\n")


def test_sha256_mismatch_is_refused_and_nothing_written(project):
    p = project
    p.write_pin(sdist={"project": "vllm", "file": p.sdist.name, "sha256": "0" * 64})
    out = p.run("apply", "--sdist", str(p.sdist), check=False)
    assert "sha256 mismatch" in out.stderr and "0" * 64 in out.stderr
    assert not p.tree.exists()


def test_missing_patch_file_is_named(two_entries):
    p = two_entries
    (p.root / "patches/add-m3.patch").unlink()
    out = p.run("apply", "--sdist", str(p.sdist), check=False)
    assert "patch file patches/add-m3.patch is missing" in out.stderr
    assert not p.tree.exists()


def test_corrupt_patch_file_is_named(two_entries):
    p = two_entries
    (p.root / "patches/engine-fix.patch").write_text("garbage without a header\n")
    out = p.run("apply", "--sdist", str(p.sdist), check=False)
    assert "patches/engine-fix.patch: corrupt patch file" in out.stderr
    assert not p.tree.exists()


def test_missing_provenance_is_refused(project):
    p = project
    text = patch_text("No origin", UTIL_DIFF).replace("Origin: vendor\n", "")
    p.add_patch("x.patch", text)
    p.set_series(["x.patch"])
    out = p.run("apply", "--sdist", str(p.sdist), check=False)
    assert "provenance header lacks Origin" in out.stderr


def test_stale_entry_stops_at_last_good_entry(two_entries):
    p = two_entries
    stale = ENGINE_DIFF.replace(" line 13\n", " line 13 (upstream changed this)\n")
    p.add_patch("util.patch", patch_text("Change util", UTIL_DIFF))
    p.add_patch("stale.patch", patch_text("Stale edit", stale))
    p.set_series(["util.patch", "stale.patch", "add-m3.patch"])
    out = p.run("apply", "--sdist", str(p.sdist), check=False)
    assert out.returncode == 1
    assert "entry stale.patch (Stale edit) does not apply" in out.stderr
    assert "file vllm/engine.py, hunk at line 9: @@ -9,7 +9,7 @@" in out.stderr
    # left at the last good entry, clean, nothing of the stale entry or later ones
    assert p.git("log", "-1", "--format=%s").strip() == "Change util"
    assert p.git("status", "--porcelain") == ""
    assert not (p.tree / "vllm/models/m3").exists()
    # fixing the series and re-running recovers without --force
    p.set_series(["util.patch", "add-m3.patch"])
    p.run("apply", "--sdist", str(p.sdist), check=True)
    assert p.git("log", "-1", "--format=%s").strip() == "Add the M3 model"


def test_dirty_tree_and_unexported_commits_are_refused(two_entries):
    p = two_entries
    p.run("apply", check=True)
    (p.tree / "vllm/util.py").write_text("edited\n")
    out = p.run("apply", check=False)
    assert "uncommitted changes" in out.stderr and "--force" in out.stderr
    assert (p.tree / "vllm/util.py").read_text() == "edited\n"     # nothing lost
    out = p.run("export", check=False)
    assert "uncommitted changes" in out.stderr
    p.git("commit", "-q", "-a", "-m", "wip")
    out = p.run("apply", check=False)
    assert "not in patches/" in out.stderr
    p.run("apply", "--force", check=True)
    assert (p.tree / "vllm/util.py").read_text() == "def f():\n    return 1\n"


def test_overlay_file_colliding_with_base_is_refused(project):
    p = project
    p.add_overlay("vllm/util.py", "shadow\n")
    p.add_patch("bad.patch", patch_text("Shadow util", overlay=["vllm/util.py"]))
    p.set_series(["bad.patch"])
    out = p.run("apply", "--sdist", str(p.sdist), check=False)
    assert "overlay file vllm/util.py already exists" in out.stderr


def test_foreign_directory_is_not_overwritten(project):
    p = project
    p.tree.mkdir()
    (p.tree / "precious.txt").write_text("keep me\n")
    out = p.run("apply", "--sdist", str(p.sdist), check=False)
    assert "was not made by this tool" in out.stderr
    assert (p.tree / "precious.txt").read_text() == "keep me\n"


def test_base_from_git_clone(two_entries, tmp_path):
    p = two_entries
    clone = tmp_path / "vllm-clone"
    subprocess.run(["tar", "xzf", str(p.sdist), "-C", str(tmp_path)], check=True)
    (tmp_path / "vllm-0.23.0").rename(clone)
    g = ["git", "-C", str(clone), "-c", "user.name=u", "-c", "user.email=u@x"]
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    subprocess.run(g + ["add", "-A"], check=True)
    subprocess.run(g + ["commit", "-q", "-m", "v0.23.0"], check=True)
    sha = subprocess.run(g + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    p.write_pin(commit=sha[:9])
    p.run("apply", "--vllm-src", str(clone), check=True)
    assert p.git("log", "--reverse", "--format=%H").split()[0] == sha   # upstream commit kept
    assert p.git("log", "--format=%s").splitlines()[0] == "Add the M3 model"
    # a dirty clone and a clone at another commit are refused
    (clone / "vllm/util.py").write_text("local edit\n")
    out = p.run("apply", "--vllm-src", str(clone), "--force", check=False)
    assert "has uncommitted changes" in out.stderr
    subprocess.run(g + ["commit", "-q", "-a", "-m", "later"], check=True)
    out = p.run("apply", "--vllm-src", str(clone), "--force", check=False)
    assert f"not the pinned v0.23.0 commit {sha[:9]}" in out.stderr


def test_base_from_package_index(two_entries, tmp_path):
    """PIP_INDEX_URL is honoured (a PEP 503 index on disk), with progress and verification."""
    p = two_entries
    index = tmp_path / "index" / "vllm"
    index.mkdir(parents=True)
    served = index / p.sdist.name
    p.sdist.rename(served)                 # only the index has it now, not the cache
    (index / "index.html").write_text(f'<a href="{served.name}#sha256={sha256(served)}">x</a>\n')
    env = {"PIP_INDEX_URL": (tmp_path / "index").as_uri() + "/", "PIP_EXTRA_INDEX_URL": ""}
    out = p.run("apply", env=env, check=True)
    assert "fetching vllm-0.23.0.tar.gz" in out.stderr
    assert (p.cache / "vllm-0.23.0.tar.gz").exists()
    # a tampered file on the index is refused and not cached
    (p.cache / "vllm-0.23.0.tar.gz").unlink()
    served.write_bytes(served.read_bytes() + b"tampered")
    out = p.run("apply", "--force", env=env, check=False)
    assert "sha256 mismatch" in out.stderr
    assert not (p.cache / "vllm-0.23.0.tar.gz").exists()
    assert not list(p.cache.glob(".part-*"))


def test_status_reports_entries_and_staleness(two_entries):
    p = two_entries
    out = p.run("status", check=True).stdout
    assert "does not exist" in out and "Fix the engine" in out
    p.run("apply", check=True)
    assert "is current" in p.run("status", check=True).stdout
    p.add_overlay("vllm/models/m3/__init__.py", "MODEL = 'changed'\n")
    assert "STALE" in p.run("status", check=True).stdout
