"""Rebase the series onto another vLLM base and report, entry by entry, what happens.

The new base is a release version (its sdist fetched from the package index pip
is configured for, verified against the index's sha256 and cached), a local
sdist, or a git ref of a vLLM clone. The series is applied to it in a scratch
tree (build/rebase/new by default) with a 3-way fallback: the preimage blobs
the entries' `index` lines name are copied over from the old applied tree
(base pin + series), so `git apply --3way` can merge. Each entry is reported as

  clean     applies as is
  offset    applies, hunks moved (from `git apply -v`)
  merged    applied only through a 3-way merge
  conflict  does not apply (files and hunks named) or its overlay files collide
  upstream  already contained in the new base (evidence named): proposed for dropping

The series and the pin are untouched unless write=True; then the pin, the
refreshed patches and the dropped entries are written together, or nothing is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import git

from . import applier, exporter, fetch, gitutil, txn
from .errors import SeriesError
from .pin import Artifact, BasePin
from .series import ORDER_FILE, Entry, Series

VERSION_RE = re.compile(r"^v?(\d+\.\d+(?:\.\d+)*(?:(?:a|b|rc|\.post|\.dev)\d+)*)$")
PROJECT = "vllm"


# ---------------------------------------------------------------- versions

def parse_version(text: str):
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:                                    # pragma: no cover
        from pip._vendor.packaging.version import InvalidVersion, Version
    try:
        return Version(text)
    except InvalidVersion:
        return None


def applied_upstream_version(entry: Entry) -> str | None:
    """The release an entry's Applied-Upstream field names ('v0.30.0, <url>' -> '0.30.0')."""
    for token in re.split(r"[,\s]+", entry.fields.get("Applied-Upstream", "")):
        m = VERSION_RE.match(token)
        if m:
            return m.group(1)
    return None


def upstream_status(entry: Entry, base_version: str) -> str:
    """One line for `status`: where upstream stands for this entry relative to a base."""
    applied = entry.fields.get("Applied-Upstream")
    if not applied:
        return "not upstream"
    v = applied_upstream_version(entry)
    if v is None:
        return f"upstream ({applied}); release not named"
    new, base = parse_version(v), parse_version(base_version)
    if new and base and new <= base:
        return f"upstream in v{v} <= base v{base_version}: check with `make rebase ONTO={base_version}`"
    return f"upstream in v{v}: carried until the base is v{v} or later"


# ---------------------------------------------------------------- the new base

@dataclass
class NewBase:
    label: str                      # what the report calls it
    source: applier.BaseSource
    version: str | None
    commit: str | None
    released: str
    sdist: Artifact | None          # the sdist (sha256 recorded) where the base is one


def _index_files(project: str) -> tuple[dict[str, str], list[str]]:
    """{file: url} over every configured index (first index wins), and the errors met."""
    files: dict[str, str] = {}
    errors = []
    for index in fetch.index_urls():
        try:
            for name, url in fetch._project_files(index, project).items():
                files.setdefault(name, url)
        except Exception as e:   # an index that lacks the project or is unreachable
            errors.append(f"{index}: {e}")
    return files, errors


def _sha_of(url: str) -> str | None:
    frag = urllib.parse.urlparse(url).fragment
    m = re.search(r"sha256=([0-9a-f]{64})", frag)
    return m.group(1) if m else None


def index_artifact(project: str, file: str, files: dict[str, str] | None = None) -> Artifact:
    """The index's record of one file, with its sha256 (refused if the index gives none)."""
    if files is None:
        files, errors = _index_files(project)
    else:
        errors = []
    if file not in files:
        versions = sorted({m.group(1) for f in files
                           if (m := re.match(rf"{re.escape(project.replace('-', '_'))}-"
                                             r"(\d[^-]*?)(?:\.tar\.gz|-)", f))},
                          key=lambda v: parse_version(v) or parse_version("0"))
        hint = (f"; versions there: {', '.join(versions[-8:])}" if versions else "")
        raise SeriesError(
            f"{file} is not on the configured package index{hint}"
            + ("".join(f"\n  {e}" for e in errors) if errors else "")
            + "\nCheck the version (e.g. `--onto 0.24.0`), set PIP_INDEX_URL, or pass a "
              "local sdist path to --onto.")
    sha = _sha_of(files[file])
    if not sha:
        raise SeriesError(f"the package index lists {file} without a sha256; download it "
                          f"yourself, check it, and pass the file's path to --onto")
    return Artifact(project=project, file=file, sha256=sha)


def fetch_release_sdist(version: str) -> tuple[Path, Artifact]:
    """vllm-<version>.tar.gz, verified against the index's sha256 and cached.

    The sha256 the index gave is recorded next to the cached file (<file>.sha256), so a
    cached sdist is re-verified without asking the index again.
    """
    file = f"{PROJECT}-{version}.tar.gz"
    cached, sidecar = fetch.cache_dir() / file, fetch.cache_dir() / (file + ".sha256")
    if cached.is_file() and sidecar.is_file():
        art = Artifact(PROJECT, file, sidecar.read_text().strip())
        fetch.verify(cached, art)
        return cached, art
    art = index_artifact(PROJECT, file)
    path = fetch.fetch(art)          # downloads if needed; verifies against the index's sha256
    sidecar.write_text(art.sha256 + "\n")
    return path, art


def _tree_facts(tree: Path) -> tuple[str, str | None, str]:
    """(version, commit or None, release date) from an extracted sdist's vllm/_version.py and
    PKG-INFO (its mtime, kept by the extraction, is the release date)."""
    version = commit = None
    try:
        text = (tree / "vllm" / "_version.py").read_text()
        if v := re.search(r"^__version__ = version = ['\"]([^'\"]+)", text, re.M):
            version = v.group(1)
        if c := re.search(r"^__commit_id__ = commit_id = ['\"]g?([0-9a-f]+)", text, re.M):
            commit = c.group(1)
    except OSError:
        pass
    info = tree / "PKG-INFO"
    released = "1970-01-01"
    if info.is_file():
        released = datetime.fromtimestamp(info.stat().st_mtime, timezone.utc).date().isoformat()
        if version is None and (v := re.search(r"^Version: (\S+)", info.read_text(errors="replace"),
                                               re.M)):
            version = v.group(1)
    if version is None:
        raise SeriesError(f"{tree}: the sdist has no vllm/_version.py or PKG-INFO version; "
                          f"is it a vLLM sdist?")
    return version, commit, released


def resolve_onto(onto: str, vllm_src: str | None = None) -> NewBase:
    """--onto as a git ref (with --vllm-src), a local sdist, or a release version."""
    if vllm_src:
        path = Path(vllm_src).expanduser().resolve()
        repo = gitutil.open_repo(path)
        if repo is None:
            raise SeriesError(f"--vllm-src {path} is not a git clone of vLLM")
        sha = gitutil.resolve(repo, f"{onto}^{{commit}}")
        if sha is None:
            raise SeriesError(f"{onto!r} is not a commit, tag or branch of {path}; "
                              f"`git -C {path} fetch --tags` and check the name")
        m = VERSION_RE.match(onto)
        version = m.group(1) if m else None
        if version is None:
            rc, tag, _ = gitutil.run_full(repo, "describe", "--tags", "--exact-match", sha)
            m = VERSION_RE.match(tag.strip()) if rc == 0 else None
            version = m.group(1) if m else None
        released = gitutil.run(repo, "log", "-1", "--format=%cs", sha)
        return NewBase(f"{onto} of {path} ({sha[:12]})", applier.BaseSource("git", path, f"git:{sha}"),
                       version, sha[:9], released, None)
    p = Path(onto).expanduser()
    if p.is_file() or onto.endswith((".tar.gz", ".tgz")):
        if not p.is_file():
            raise SeriesError(f"--onto {p}: no such sdist file")
        p = p.resolve()
        art = Artifact(PROJECT, p.name, fetch.sha256_of(p))
        return NewBase(f"sdist {p}", applier.BaseSource("sdist", p, f"sdist:{art.sha256}"),
                       None, None, "", art)       # version etc.: read when extracted
    m = VERSION_RE.match(onto)
    if not m:
        raise SeriesError(f"--onto {onto!r} is neither a version (e.g. 0.24.0), an existing sdist "
                          f"file, nor (with --vllm-src DIR) a git ref")
    path, art = fetch_release_sdist(m.group(1))
    return NewBase(f"vLLM v{m.group(1)} ({art.file})",
                   applier.BaseSource("sdist", path, f"sdist:{art.sha256}"),
                   m.group(1), None, "", art)


def _base_pin(nb: NewBase) -> BasePin:
    art = nb.sdist or Artifact(PROJECT, "(git)", "")
    return BasePin(version=nb.version or "unknown", commit=nb.commit or "", released=nb.released,
                   sdist=art, wheels={}, path=Path("/dev/null"))


def _create_sdist_base(nb: NewBase, tree: Path) -> str:
    """applier's sdist base, faster for a scratch tree: the tar tool extracts (Python's tarfile
    takes several times longer on vLLM's 5,000+ files) and loose objects stay uncompressed."""
    print(f"extracting {nb.source.location.name}", file=sys.stderr)
    tree.mkdir(parents=True)
    tar = shutil.which("tar")
    if tar:
        subprocess.run([tar, "--no-same-owner", "--strip-components=1", "-xzf",
                        str(nb.source.location), "-C", str(tree)], check=True)
    else:                                                   # pragma: no cover
        applier._extract_sdist(nb.source.location, tree)
    _set_facts(nb, *_tree_facts(tree))
    repo = gitutil.init(tree)
    gitutil.run(repo, "config", "core.looseCompression", "0")
    gitutil.run(repo, "checkout", "--quiet", "-B", "m3-series")
    pin = _base_pin(nb)
    msg = (f"vLLM v{pin.version} (pristine base from {pin.sdist.file})\n\n"
           f"Tag commit {pin.commit}; sdist sha256 {pin.sdist.sha256}.\n")
    return gitutil.commit_all(repo, msg, applier.BASE_AUTHOR, f"{pin.released} 00:00:00 +0000")


def prepare_base_tree(nb: NewBase, tree: Path) -> str:
    """`tree` = the pristine new base (reused when it already is that base); its base commit."""
    stamp = applier.read_stamp(tree)
    if stamp and stamp.get("base_ident") == nb.source.ident and "facts" in stamp:
        _set_facts(nb, *stamp["facts"])
        repo = git.Repo(tree)
        gitutil.run(repo, "checkout", "--quiet", "-B", "m3-series", stamp["base"])
        gitutil.run(repo, "reset", "--quiet", "--hard", stamp["base"])
        gitutil.run(repo, "clean", "-q", "-fdx")
        applier.write_stamp(tree, {**stamp, "digest": None, "head": stamp["base"]})
        return stamp["base"]
    shutil.rmtree(tree, ignore_errors=True)
    tree.parent.mkdir(parents=True, exist_ok=True)
    if nb.source.kind == "sdist":
        base = _create_sdist_base(nb, tree)
    else:
        base = applier._create_base(nb.source, _base_pin(nb), tree)
    applier.write_stamp(tree, {"base": base, "base_ident": nb.source.ident, "digest": None,
                               "head": base, "facts": [nb.version, nb.commit, nb.released]})
    return base


def _set_facts(nb: NewBase, version: str | None, commit: str | None, released: str) -> None:
    if nb.source.kind == "sdist" and nb.version and version != nb.version:
        raise SeriesError(f"{nb.source.location}: its vllm/_version.py says {version}, "
                          f"not {nb.version}")
    nb.version, nb.commit, nb.released = version, commit, released


# ---------------------------------------------------------------- the old applied tree

def old_applied_tree(series: Series, pin: BasePin, tree: Path | None, work: Path) -> Path:
    """The series applied on its pinned base: `tree` if it is current, else work/old."""
    if tree is not None:
        stamp = applier.read_stamp(tree)
        if stamp and stamp.get("digest") == series.digest(stamp["base_ident"]):
            repo = git.Repo(tree)
            if gitutil.head(repo) == stamp["head"]:
                return tree
    old = work / "old"
    source = applier.resolve_base(pin, None, os.environ.get("VLLM_SDIST"))
    print(applier.apply_series(series, pin, source, old, force=True), file=sys.stderr)
    return old


# ---------------------------------------------------------------- per-entry work

@dataclass
class FileDiff:
    path: str
    old_blob: str | None
    new_blob: str | None
    removed: list[str] = field(default_factory=list)
    indexed: bool = False          # the diff names the blobs (`index a..b` line)


def parse_diff(diff: bytes) -> list[FileDiff]:
    out: list[FileDiff] = []
    for line in diff.decode("utf-8", "replace").splitlines():
        if line.startswith("diff --git "):
            out.append(FileDiff(line.split(" b/", 1)[-1], None, None))
        elif not out:
            continue
        elif m := re.match(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", line):
            zero = lambda s: None if set(s) == {"0"} else s   # noqa: E731
            out[-1].old_blob, out[-1].new_blob = zero(m.group(1)), zero(m.group(2))
            out[-1].indexed = len(m.group(2)) == 40
        elif line.startswith("-") and not line.startswith("--- "):
            out[-1].removed.append(line[1:])
        elif line.startswith("deleted file"):
            out[-1].new_blob = None
    return out


@dataclass
class EntryResult:
    entry: Entry
    status: str = "clean"          # clean | offset | merged | conflict | upstream
    evidence: str = ""             # for upstream
    offsets: list[str] = field(default_factory=list)
    merged_files: list[str] = field(default_factory=list)
    conflict_files: list[str] = field(default_factory=list)
    hunks: list[str] = field(default_factory=list)
    collisions: list[tuple[str, bool]] = field(default_factory=list)   # (path, identical)
    note: str = ""

    def upstream_reference(self) -> str:
        """Which upstream change the entry names: its Origin and Applied-Upstream fields
        (the latter, or a note that it has none)."""
        f = self.entry.fields
        applied = f.get("Applied-Upstream")
        return (f"Origin: {f.get('Origin', '?')}; "
                + (f"Applied-Upstream: {applied}" if applied else "no Applied-Upstream field"))

    def lines(self) -> list[str]:
        out = []
        if self.status == "clean":
            out.append("clean")
        elif self.status == "offset":
            out.append("applied with offset: " + "; ".join(self.offsets))
        elif self.status == "merged":
            out.append("merged (3-way): " + ", ".join(self.merged_files))
        elif self.status == "upstream":
            out.append(f"already contained upstream [{self.upstream_reference()}] "
                       f"({self.evidence}); proposed for dropping")
        else:
            out.append("CONFLICT: " + (", ".join(self.conflict_files) or "overlay collision"))
            out += [f"  {h}" for h in self.hunks]
        for path, same in self.collisions:
            out.append(f"overlay collision: {path} is shipped by the new base "
                       f"({'identical' if same else 'different content'})")
        if self.note:
            out.append(self.note)
        return out


def _blob_at(repo: git.Repo, rev: str, path: str) -> str | None:
    return gitutil.resolve(repo, f"{rev}:{path}")


def _text_at(repo: git.Repo, rev: str, path: str) -> str | None:
    try:
        return gitutil.show_file(repo, rev, path).decode("utf-8", "replace")
    except git.GitCommandError:
        return None


def copy_preimages(old: git.Repo, new: git.Repo, files: list[FileDiff]) -> list[str]:
    """Copy the blobs the diff's `index` lines name from the old tree; return those missing."""
    missing = []
    for f in files:
        if not f.old_blob:
            continue
        rc, _, _ = gitutil.run_full(new, "cat-file", "-e", f"{f.old_blob}^{{blob}}")
        if rc == 0:
            continue
        full = gitutil.resolve(old, f"{f.old_blob}^{{blob}}")
        if full is None:
            missing.append(f.path)
            continue
        data = gitutil.raw(old, "cat-file", "blob", full)
        gitutil.run(new, "hash-object", "-w", "--stdin", stdin=data)
    return missing


def upstream_evidence(entry: Entry, files: list[FileDiff], repo: git.Repo, diff_path: str,
                      series: Series, new_version: str | None) -> str | None:
    """Why the new base already contains the entry, or None."""
    if entry.overlay_files:
        same = all((_blob_at(repo, "HEAD", rel) is not None and gitutil.show_file(repo, "HEAD", rel)
                    == series.overlay_bytes(rel)) for rel in entry.overlay_files)
        if not same:
            return None
        if not files:
            return "the new base ships every overlay file of the entry byte for byte"
    if not files:
        return None
    if all(f.indexed and _blob_at(repo, "HEAD", f.path) == f.new_blob for f in files):
        return "the new base's files already equal the entry's result"
    rc, _, _ = gitutil.run_full(repo, "apply", "--check", "-R", "--whitespace=nowarn", diff_path)
    if rc == 0:
        return "its diff reverse-applies cleanly on the new base"
    removed = [(f.path, line) for f in files for line in f.removed if line.strip()]
    applied = applied_upstream_version(entry)
    if removed and applied and new_version:
        a, n = parse_version(applied), parse_version(new_version)
        if a and n and a <= n:
            texts = {f.path: _text_at(repo, "HEAD", f.path) for f in files}
            present = {p: set((t or "").splitlines()) for p, t in texts.items()}
            if all(line not in present[p] for p, line in removed):
                nfiles = len({p for p, _ in removed})
                return (f"every line it removes is gone from the new base ({len(removed)} "
                        f"line{'s' * (len(removed) != 1)} in {nfiles} file{'s' * (nfiles != 1)}) "
                        f"and Applied-Upstream names "
                        f"v{applied} <= v{new_version}")
    return None


_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")


def _offsets(stderr: str) -> list[str]:
    out, current = [], None
    for line in stderr.splitlines():
        if m := re.match(r"Checking patch (.+)\.\.\.$", line):
            current = m.group(1)
        elif m := _OFFSET.search(line):
            out.append(f"{current} hunk #{m.group(1)} at line {m.group(2)} "
                       f"({int(m.group(3)):+d} lines)")
    return out


def _conflict_markers(tree: Path, path: str) -> list[int]:
    try:
        lines = (tree / path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [i for i, l in enumerate(lines, 1) if l.startswith("<<<<<<< ")]


def rebase_entry(repo: git.Repo, tree: Path, series: Series, entry: Entry, old: git.Repo,
                 new_version: str | None) -> EntryResult:
    """Classify one entry on the tree's HEAD; commit it unless it conflicts or is upstream."""
    res = EntryResult(entry)
    files = parse_diff(entry.diff)
    for rel in entry.overlay_files:
        if _blob_at(repo, "HEAD", rel) is not None:
            res.collisions.append((rel, gitutil.show_file(repo, "HEAD", rel) == series.overlay_bytes(rel)))
    with tempfile.NamedTemporaryFile(suffix=".diff") as fh:
        fh.write(entry.diff)
        fh.flush()
        evidence = upstream_evidence(entry, files, repo, fh.name, series, new_version)
        if evidence:
            res.status, res.evidence = "upstream", evidence
            return res
        if res.collisions:
            res.status = "conflict"
            res.hunks.append("overlay files collide with files the new base ships; the overlay "
                             "only adds new files: merge the entry into upstream's files instead")
            return res
        if files:
            rc, _, err = gitutil.run_full(repo, "apply", "--index", "-v", "--whitespace=nowarn", fh.name)
            if rc == 0:
                res.offsets = _offsets(err)
                res.status = "offset" if res.offsets else "clean"
            else:
                first_err = err
                missing = copy_preimages(old, repo, files)
                rc, _, err = gitutil.run_full(repo, "apply", "--index", "--3way", "-v",
                                              "--whitespace=nowarn", fh.name)
                if rc == 0:
                    res.status = "merged"
                    res.merged_files = sorted({m.group(1) for m in re.finditer(
                        r"Applied patch to '(.+)' cleanly", err)} or {f.path for f in files})
                else:
                    res.status = "conflict"
                    unmerged = gitutil.run(repo, "diff", "--name-only", "--diff-filter=U")
                    res.conflict_files = sorted(set(unmerged.split()) | {
                        m.group(1) for m in re.finditer(r"error: patch failed: (.+):\d+", first_err)})
                    res.hunks = applier._rejected_hunk(entry, first_err).splitlines()
                    for path in unmerged.split():
                        marks = _conflict_markers(tree, path)
                        if marks:
                            res.hunks.append(f"  3-way conflict markers in {path} at lines "
                                             + ", ".join(map(str, marks)))
                    if missing:
                        res.note = ("3-way merge impossible for " + ", ".join(missing)
                                    + ": its preimage blob is not in the old applied tree")
                    gitutil.run(repo, "reset", "--quiet", "--hard", "HEAD")
                    gitutil.run(repo, "clean", "-q", "-fd")
                    return res
    for rel in entry.overlay_files:
        dest = tree / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(series.overlay_bytes(rel))
    gitutil.commit_all(repo, entry.message, entry.author, entry.date)
    if applied := applied_upstream_version(entry):
        a, n = parse_version(applied), parse_version(new_version or "")
        if a and n and a <= n:
            res.note = (f"note: Applied-Upstream names v{applied} <= v{new_version}, but no textual "
                        f"evidence was found; compare by hand")
    return res


# ---------------------------------------------------------------- the whole rebase

@dataclass
class Report:
    base: NewBase
    old_version: str
    tree: Path
    results: list[EntryResult]
    unowned_collisions: list[str]
    written: list[str] | None = None

    def by_status(self, status: str) -> list[EntryResult]:
        return [r for r in self.results if r.status == status]

    def result_for(self, pr: str) -> EntryResult:
        """The result of the entry whose Origin names this PR number."""
        (r,) = [r for r in self.results if re.search(rf"/pull/{pr}\b", r.entry.fields.get("Origin", ""))]
        return r

    def render(self) -> str:
        b = self.base
        head = [f"rebase of the series (base v{self.old_version}) onto {b.label}"]
        facts = [f"version {b.version or 'unknown'}"]
        if b.commit:
            facts.append(f"commit {b.commit}")
        if b.sdist:
            facts.append(f"sdist sha256 {b.sdist.sha256}")
        head.append("  " + ", ".join(facts))
        head.append(f"  scratch tree: {self.tree}")
        lines = head + [""]
        for i, r in enumerate(self.results, 1):
            lines.append(f"{i:3}. {r.entry.name}  [{r.entry.subject}]")
            lines += [f"     {l}" for l in r.lines()]
        collisions = [(r.entry.name, p, s) for r in self.results for p, s in r.collisions]
        lines.append("")
        if collisions:
            lines.append("overlay files that collide with files the new base ships:")
            lines += [f"  vllm_overlay/{p} (entry {n}; {'identical' if s else 'different'})"
                      for n, p, s in collisions]
        else:
            lines.append("overlay files that collide with files the new base ships: none")
        if self.unowned_collisions:
            lines.append("overlay files no entry owns yet that the new base also ships:")
            lines += [f"  vllm_overlay/{p}" for p in self.unowned_collisions]
        counts = {s: len(self.by_status(s)) for s in ("clean", "offset", "merged", "conflict", "upstream")}
        lines.append("summary: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        drop = self.by_status("upstream")
        if drop:
            lines.append("proposed for dropping: " + ", ".join(r.entry.name for r in drop))
        if self.written is None:
            lines.append("series and pin unchanged (pass --write to write the pin, the refreshed "
                         "patches and the drops together)")
        elif self.written:
            lines.append("written:\n" + "\n".join(f"  {w}" for w in self.written))
        else:
            lines.append("written: nothing changed")
        return "\n".join(lines)


def rebase(root: Path, onto: str, *, vllm_src: str | None = None, tree: Path | None = None,
           work: Path | None = None, write: bool = False, flavor: str | None = None) -> Report:
    series = Series.load(root, flavor)
    pin = BasePin.load(series.pin_path)
    work = (work or root / "build" / "rebase").resolve()
    nb = resolve_onto(onto, vllm_src)
    new_tree = work / "new"
    base = prepare_base_tree(nb, new_tree)
    if write:
        _check_writable(nb)
    old_tree = old_applied_tree(series, pin, tree, work)
    repo, old = git.Repo(new_tree), git.Repo(old_tree)
    results = []
    for i, entry in enumerate(series.entries, 1):
        print(f"  [{i}/{len(series.entries)}] {entry.subject}", file=sys.stderr)
        results.append(rebase_entry(repo, new_tree, series, entry, old, nb.version))
    applier.write_stamp(new_tree, {"base": base, "base_ident": nb.source.ident, "digest": None,
                                   "head": gitutil.head(repo),
                                   "facts": [nb.version, nb.commit, nb.released]})
    shipped = set(gitutil.run(repo, "ls-tree", "-r", "--name-only", base).splitlines())
    unowned = [p for p in series.unowned_overlay_files() if p in shipped]
    report = Report(nb, pin.version, new_tree, results, unowned)
    if write:
        report.written = write_rebase(root, series, pin, nb, new_tree, report)
    return report


def _check_writable(nb: NewBase) -> None:
    if not nb.version or not VERSION_RE.match(nb.version) or "dev" in nb.version:
        raise SeriesError(f"--write needs a release base (the pin names a release's sdist and "
                          f"wheels); {nb.label} is version {nb.version or 'unknown'}. Rebase onto "
                          f"the release version instead (e.g. `--onto 0.24.0`).")


def new_pin_json(pin: BasePin, nb: NewBase) -> dict:
    """patches/base.json for the new base: sdist and wheels from the package index's hashes."""
    v = nb.version
    files, _ = _index_files(PROJECT)
    sdist = nb.sdist if nb.sdist and nb.sdist.file == f"{PROJECT}-{v}.tar.gz" else None
    if sdist is None:
        sdist = index_artifact(PROJECT, f"{PROJECT}-{v}.tar.gz", files)
    wheels = {}
    for target, old in pin.wheels.items():
        proj_files = files if old.project == PROJECT else _index_files(old.project)[0]
        want = old.file.replace(f"-{pin.version}-", f"-{v}-")
        if want not in proj_files:
            suffix = old.file.split("-", 2)[-1]            # same python/abi/platform tags
            cands = sorted(f for f in proj_files if f.startswith(want.split("-")[0] + f"-{v}-")
                           and f.endswith(suffix.split("-")[-1]))
            if not cands:
                raise SeriesError(f"no {old.project} {v} wheel like {old.file} on the configured "
                                  f"package index; the pin needs one for target {target!r}")
            want = cands[0]
        wheels[target] = index_artifact(old.project, want, proj_files)
    commit = nb.commit or ""
    return {
        "version": v, "commit": commit, "released": nb.released,
        "sdist": {"project": sdist.project, "file": sdist.file, "sha256": sdist.sha256},
        "wheels": {t: {"project": a.project, "file": a.file, "sha256": a.sha256}
                   for t, a in wheels.items()},
    }


def write_rebase(root: Path, series: Series, pin: BasePin, nb: NewBase, new_tree: Path,
                 report: Report) -> list[str]:
    conflicts = report.by_status("conflict")
    if conflicts:
        raise SeriesError(
            "not written: " + ", ".join(r.entry.name for r in conflicts) + " conflict on the new "
            "base (see the report). Refresh those entries against the new base first (e.g. in "
            f"{new_tree}: `git apply --3way <patch>`, resolve, commit, then move the result into "
            "the series); nothing was written.")
    pin_json = new_pin_json(pin, nb)
    entries, overlay = exporter.entries_from_tree(new_tree, series)
    writes: dict[str, bytes] = {}
    for e in entries:
        writes[f"{series.rel}/{e.name}"] = e.render()
    for rel, data in overlay.items():
        writes[f"vllm_overlay/{rel}"] = data
    order = series.patches_dir / ORDER_FILE
    header = [l for l in order.read_text().splitlines() if l.startswith("#")]
    writes[f"{series.rel}/{ORDER_FILE}"] = ("\n".join(header + [e.name for e in entries]) + "\n").encode()
    writes[f"{series.rel}/base.json"] = (json.dumps(pin_json, indent=2) + "\n").encode()
    kept = {e.name for e in entries}
    other_owned = series.owned_by_other_flavors()
    deletes = [f"{series.rel}/{e.name}" for e in series.entries if e.name not in kept]
    deletes += [f"vllm_overlay/{rel}" for e in series.entries if e.name not in kept
                for rel in e.overlay_files if rel not in overlay and rel not in other_owned]
    return txn.write_together(root, writes, deletes)
