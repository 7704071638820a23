"""import: an upstream fix into the series, with provenance, verified before writing."""

from __future__ import annotations

import subprocess
from datetime import date

from conftest import BASE_FILES, UTIL_DIFF

from m3series.series import Series

URL = "https://github.com/vllm-project/vllm/pull/60001"

MAIL = f"""From 1234567890abcdef1234567890abcdef12345678 Mon Sep 17 00:00:00 2001
From: Upstream Dev <upstream@example.invalid>
Date: Tue, 7 Jul 2026 10:00:00 +0200
Subject: [PATCH] [Bugfix] Make f return two so that the caller sees the
 right count

f returned 1 for two items.

Signed-off-by: Upstream Dev <upstream@example.invalid>
---
 vllm/util.py | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

{UTIL_DIFF}-- 
2.43.0

"""

ENGINE_CONFLICT = """diff --git a/vllm/engine.py b/vllm/engine.py
--- a/vllm/engine.py
+++ b/vllm/engine.py
@@ -11,3 +11,3 @@
 line 11
-line 12
+line 12 fixed upstream
 line 13
"""


def _import(p, *args, check=None):
    return p.run("import", "--tree", str(p.tree), *args, check=check)


def test_import_patch_file_lands_after_upstream_entries_with_provenance(two_entries, tmp_path):
    p = two_entries
    patch = tmp_path / "60001.patch"
    patch.write_text(MAIL)
    out = _import(p, "--patch", str(patch), "--url", URL, "--reason", "MiniMax-M3 counts on it",
                  "--applied-upstream", f"v0.25.0, {URL}", check=True)
    series = Series.load(p.root)
    names = [e.name for e in series.entries]
    assert names == ["engine-fix.patch", "make-f-return-two-so-that-the-caller-sees-the-right-count.patch",
                     "add-m3.patch"]
    e = series.entries[1]
    assert f"wrote patches/{e.name}" in out.stdout
    assert e.subject == "[Bugfix] Make f return two so that the caller sees the right count"
    assert e.author == "Upstream Dev <upstream@example.invalid>"
    assert e.fields == {"Origin": f"upstream, {URL}", "Forwarded": "not-needed",
                        "Applied-Upstream": f"v0.25.0, {URL}",
                        "Last-Update": date.today().isoformat()}
    assert "f returned 1 for two items." in e.body
    assert "Carried in this series: MiniMax-M3 counts on it" in e.body
    assert "Signed-off-by: Upstream Dev" in e.body
    assert e.diff.startswith(b"diff --git a/vllm/util.py") and b"2.43.0" not in e.diff
    # `make apply` re-applies it; apply + export round-trips the imported entry byte for byte
    imported = (p.root / "patches" / e.name).read_bytes()
    p.run("apply", check=True)
    assert (p.tree / "vllm/util.py").read_text() == "def f():\n    return 2\n"
    p.run("export", check=True)
    assert (p.root / "patches" / e.name).read_bytes() == imported


def test_import_commit_of_the_applied_tree_at_a_position(two_entries):
    p = two_entries
    p.run("apply", check=True)
    (p.tree / "vllm/util.py").write_text("def f():\n    return 3\n")
    p.git("commit", "-qam", "[Core] Return three\n\nBecause three.")
    out = _import(p, "--commit", "HEAD", "--url", URL, "--reason", "needed", "--position", "1",
                  check=True)
    assert "make apply" in out.stdout
    series = Series.load(p.root)
    assert series.entries[0].subject == "[Core] Return three"
    assert series.entries[0].fields["Applied-Upstream"] == URL       # default: the URL
    assert "Because three." in series.entries[0].body
    p.run("apply", "--force", check=True)
    assert p.git("log", "--format=%s", "-3").splitlines()[-1] == "[Core] Return three"


def test_import_ref_of_a_clone_with_a_new_file_goes_to_the_overlay(two_entries, tmp_path):
    p = two_entries
    clone = tmp_path / "clone"
    for rel, text in BASE_FILES.items():
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / rel).write_text(text)
    g = lambda *a: subprocess.run(["git", "-C", str(clone), "-c", "user.name=U", "-c",
                                   "user.email=u@x", *a], check=True, capture_output=True, text=True)
    g("init", "-q")
    g("add", "-A")
    g("commit", "-qm", "base")
    (clone / "vllm/helpers.py").write_text("HELP = 1\n")
    (clone / "vllm/util.py").write_text("from vllm.helpers import HELP\ndef f():\n    return HELP\n")
    g("add", "-A")
    g("commit", "-qm", "[Misc] Add helpers (#60002)")
    sha = g("rev-parse", "HEAD").stdout.strip()
    _import(p, "--ref", sha, "--repo", str(clone), "--url",
            f"https://github.com/vllm-project/vllm/commit/{sha}", "--reason", "r", check=True)
    e = [e for e in Series.load(p.root).entries if e.subject.startswith("[Misc]")][0]
    assert e.overlay_files == ["vllm/helpers.py"]
    assert (p.root / "vllm_overlay/vllm/helpers.py").read_text() == "HELP = 1\n"
    assert e.author == "U <u@x>"
    p.run("apply", check=True)
    assert (p.tree / "vllm/helpers.py").exists()


def test_conflicting_import_is_refused_and_nothing_written(two_entries, tmp_path):
    p = two_entries
    patch = tmp_path / "conflict.patch"
    patch.write_text(ENGINE_CONFLICT)
    before = p.snapshot()
    # default position (after engine-fix.patch): the lines it edits are gone
    out = _import(p, "--patch", str(patch), "--subject", "Fix line 12", "--url", URL,
                  "--reason", "r", check=False)
    assert out.returncode == 1
    assert "conflicts with the series at position 2" in out.stderr
    assert "file vllm/engine.py, hunk at line 11: @@ -11,3 +11,3 @@" in out.stderr
    assert "Nothing was written" in out.stderr
    # before engine-fix.patch, it applies, but then engine-fix.patch does not
    out = _import(p, "--patch", str(patch), "--subject", "Fix line 12", "--url", URL,
                  "--reason", "r", "--position", "1", check=False)
    assert "the later entry engine-fix.patch no longer does" in out.stderr
    assert p.snapshot() == before


def test_import_refusals(two_entries, tmp_path):
    p = two_entries
    before = p.snapshot()
    diff = tmp_path / "plain.diff"
    diff.write_text(UTIL_DIFF)
    out = _import(p, "--patch", str(diff), "--url", URL, "--reason", "r", check=False)
    assert "plain diff without a commit message; pass --subject" in out.stderr
    out = _import(p, "--patch", str(diff), "--subject", "S", "--url",
                  "https://example.invalid/pr/1", "--reason", "r", check=False)
    assert "already in the series as patches/engine-fix.patch" in out.stderr
    out = _import(p, "--patch", str(diff), "--subject", "S", "--url", "not a url",
                  "--reason", "r", check=False)
    assert "--url must be the upstream PR or commit URL" in out.stderr
    two = tmp_path / "two.patch"
    two.write_text(MAIL + MAIL)
    out = _import(p, "--patch", str(two), "--url", URL, "--reason", "r", check=False)
    assert "holds 2 commits" in out.stderr
    out = _import(p, "--patch", str(diff), "--subject", "S", "--url", URL, "--reason", "r",
                  "--position", "9", check=False)
    assert "--position 9: choose 1..3" in out.stderr
    out = _import(p, "--commit", "HEAD", "--url", URL, "--reason", "r", check=False)
    assert "is not a git repository" in out.stderr
    assert p.snapshot() == before
