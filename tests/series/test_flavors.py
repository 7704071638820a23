"""One repository, several pinned bases: patches/<flavor>/ each with its pin and order
file, one shared vllm_overlay/ whose files the flavors' entries own."""

from __future__ import annotations

import shutil

from conftest import ENGINE_DIFF, UTIL_DIFF, patch_text

from m3series.series import Series, list_flavors


def _run_at(p, tree, *args, check=True):
    """p.run with another applied tree (p.run always passes p.tree)."""
    import os
    import subprocess
    import sys

    from conftest import REPO
    env = dict(os.environ, M3_SERIES_CACHE=str(p.cache))
    proc = subprocess.run([sys.executable, str(REPO / "apply.py"), "--root", str(p.root), *args,
                           "--tree", str(tree)], capture_output=True, text=True, env=env)
    assert (proc.returncode == 0) == check, proc.stdout + proc.stderr
    return proc


def _two_flavors(p):
    """Move the fake project's single series into patches/old/ and add patches/new/
    over the same fake base; both own the shared overlay file."""
    p.add_overlay("vllm/models/m3/__init__.py", "MODEL = 'm3'\n")
    p.add_overlay("vllm/models/m3/only_new.py", "NEW = 1\n")
    p.add_patch("engine-fix.patch", patch_text("Fix the engine", ENGINE_DIFF))
    p.add_patch("add-m3.patch", patch_text("Add the M3 model", overlay=["vllm/models/m3/__init__.py"]))
    p.set_series(["engine-fix.patch", "add-m3.patch"])
    patches = p.root / "patches"
    (patches / "old").mkdir()
    for f in list(patches.iterdir()):
        if f.is_file():
            shutil.move(str(f), patches / "old" / f.name)
    shutil.copytree(patches / "old", patches / "new")
    (patches / "new" / "add-m3.patch").write_text(patch_text(
        "Add the M3 model", overlay=["vllm/models/m3/__init__.py", "vllm/models/m3/only_new.py"]))
    (patches / "new" / "engine-fix.patch").write_text(patch_text("Fix util", UTIL_DIFF))
    (patches / "default").write_text("old\n")
    return p


def test_each_flavor_applies_its_own_series_and_the_default_is_named(project, tmp_path):
    p = _two_flavors(project)
    assert list_flavors(p.root) == ["new", "old"]
    out = p.run("apply", check=True)                      # no --flavor: patches/default's
    assert "engine" in p.git("show", "--stat", "HEAD~1")
    assert not (p.tree / "vllm/models/m3/only_new.py").exists()
    new_tree = tmp_path / "new-tree"
    out = _run_at(p, new_tree, "apply", "--flavor", "new")
    assert "applied 2 entries" in out.stdout
    assert (new_tree / "vllm/models/m3/only_new.py").read_text() == "NEW = 1\n"
    assert (new_tree / "vllm/util.py").read_text().endswith("return 2\n")
    status = _run_at(p, new_tree, "status", "--flavor", "new").stdout
    assert "series folder patches/new/" in status and "is current" in status


def test_unknown_flavor_is_refused_with_the_list(project):
    p = _two_flavors(project)
    out = p.run("apply", "--flavor", "v9.9.9", check=False)
    assert "unknown base flavor 'v9.9.9'" in out.stderr and "new, old" in out.stderr
    assert not p.tree.exists()


def test_overlay_files_are_shared_and_export_keeps_the_other_flavors(project, tmp_path):
    p = _two_flavors(project)
    p.run("apply", check=True)
    # drop the model entry from the default flavor and export: its overlay file stays,
    # because the other flavor still owns it
    p.git("reset", "-q", "--hard", "HEAD~1")
    out = p.run("export", check=True).stdout
    assert "patches/old/add-m3.patch (removed)" in out
    assert (p.root / "vllm_overlay/vllm/models/m3/__init__.py").exists()
    assert Series.load(p.root, "old").unowned_overlay_files() == []
    # an edit exported from one flavor's tree is the shared file the other applies
    new_tree = tmp_path / "new-tree"
    _run_at(p, new_tree, "apply", "--flavor", "new")
    (new_tree / "vllm/models/m3/__init__.py").write_text("MODEL = 'm3 v2'\n")
    import subprocess
    subprocess.run(["git", "-C", str(new_tree), "commit", "-qa", "--amend", "--no-edit"], check=True)
    out = _run_at(p, new_tree, "export", "--flavor", "new").stdout
    assert "vllm_overlay/vllm/models/m3/__init__.py" in out
    assert not list((p.root / "patches").glob("*.patch"))
    assert (p.root / "vllm_overlay/vllm/models/m3/__init__.py").read_text() == "MODEL = 'm3 v2'\n"


def test_export_from_a_tree_older_than_the_series_is_refused(project, tmp_path):
    """A shared overlay file changed by the other flavor's export (or by a merge)
    since this tree was applied: exporting this tree would undo it."""
    p = _two_flavors(project)
    p.run("apply", check=True)                          # the default flavor's tree
    new_tree = tmp_path / "new-tree"
    _run_at(p, new_tree, "apply", "--flavor", "new")
    (new_tree / "vllm/models/m3/__init__.py").write_text("MODEL = 'newer'\n")
    import subprocess
    subprocess.run(["git", "-C", str(new_tree), "commit", "-qa", "--amend", "--no-edit"], check=True)
    _run_at(p, new_tree, "export", "--flavor", "new")
    out = p.run("export", check=False)
    assert "changed since" in out.stderr and "--force" in out.stderr
    assert (p.root / "vllm_overlay/vllm/models/m3/__init__.py").read_text() == "MODEL = 'newer'\n"
    p.run("apply", check=True)                          # re-applied: the export goes through
    p.run("export", check=True)
    assert (p.root / "vllm_overlay/vllm/models/m3/__init__.py").read_text() == "MODEL = 'newer'\n"
