"""Apply the series: pristine base -> one git commit per series entry.

The patched tree (build/vllm by default) is a git repository whose first
commit is the pristine base and whose later commits are the series entries in
order, each with the entry's author, date, subject and message. Entries are
checked with `git apply --check` before anything is touched, so a failing entry
leaves the tree at the last good entry. A stamp in .git records which series
and base produced the tree; an unchanged series is a no-op.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from . import gitutil
from .errors import SeriesError
from .fetch import fetch, verify
from .pin import BasePin
from .series import Entry, Series

STAMP = "m3-series.json"
BASE_AUTHOR = "vLLM release <noreply@vllm.invalid>"


@dataclass
class BaseSource:
    """Where the pristine base comes from: a vLLM git clone, or an sdist file."""
    kind: str            # "git" | "sdist"
    location: Path
    ident: str           # stable identity: "git:<sha>" or "sdist:<sha256>"


def resolve_base(pin: BasePin, vllm_src: str | None = None, sdist: str | None = None) -> BaseSource:
    """Pick the base source in the documented order: git clone, local sdist, package index."""
    if vllm_src:
        path = Path(vllm_src).expanduser().resolve()
        repo = gitutil.open_repo(path)
        if repo is None:
            raise SeriesError(f"VLLM_SRC={path} is not a git clone of vLLM")
        sha = gitutil.head(repo)
        if not sha.startswith(pin.commit):
            raise SeriesError(
                f"VLLM_SRC={path} is at {sha[:12]}, not the pinned v{pin.version} commit "
                f"{pin.commit}: run `git -C {path} checkout {pin.commit}` (or `v{pin.version}`)")
        if gitutil.is_dirty(repo):
            raise SeriesError(f"VLLM_SRC={path} has uncommitted changes or untracked files; "
                              f"commit, stash or clean them (`git -C {path} status`)")
        return BaseSource("git", path, f"git:{sha}")
    if sdist:
        path = Path(sdist).expanduser().resolve()
        if not path.is_file():
            raise SeriesError(f"VLLM_SDIST={path} does not exist")
        verify(path, pin.sdist)
        return BaseSource("sdist", path, f"sdist:{pin.sdist.sha256}")
    return BaseSource("sdist", fetch(pin.sdist), f"sdist:{pin.sdist.sha256}")


def _extract_sdist(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members}
        if len(tops) != 1:
            raise SeriesError(f"{sdist}: not an sdist (expected one top-level directory)")
        top = tops.pop()
        for m in members:
            m.name = m.name[len(top) + 1:] if m.name != top else "."
        tar.extractall(dest, members=[m for m in members if m.name != "."], filter="data")


def _create_base(source: BaseSource, pin: BasePin, tree: Path) -> str:
    """Create `tree` as a git repo holding the pristine base; return the base commit."""
    if source.kind == "git":
        print(f"cloning base from {source.location}", file=sys.stderr)
        git.Repo.clone_from(str(source.location), str(tree), no_checkout=True)
        repo = git.Repo(tree)
        gitutil.run(repo, "checkout", "--quiet", "-B", "m3-series", source.ident[4:])
        gitutil.run(repo, "config", "user.name", "vllm-m3-series")
        gitutil.run(repo, "config", "user.email", "series@localhost")
        return gitutil.head(repo)
    print(f"extracting {source.location.name}", file=sys.stderr)
    _extract_sdist(source.location, tree)
    repo = gitutil.init(tree)
    gitutil.run(repo, "checkout", "--quiet", "-B", "m3-series")
    msg = (f"vLLM v{pin.version} (pristine base from {pin.sdist.file})\n\n"
           f"Tag commit {pin.commit}; sdist sha256 {pin.sdist.sha256}.\n")
    return gitutil.commit_all(repo, msg, BASE_AUTHOR, f"{pin.released} 00:00:00 +0000")


def read_stamp(tree: Path) -> dict | None:
    try:
        return json.loads((tree / ".git" / STAMP).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_stamp(tree: Path, stamp: dict) -> None:
    (tree / ".git" / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")


def _rejected_hunk(entry: Entry, stderr: str) -> str:
    """Turn `git apply` errors into 'file, hunk' lines quoting the rejected hunk header."""
    lines = []
    for m in re.finditer(r"error: patch failed: (.+):(\d+)", stderr):
        path, line = m.group(1), int(m.group(2))
        hunk = _find_hunk(entry.diff.decode(errors="replace"), path, line)
        lines.append(f"  file {path}, hunk at line {line}: {hunk}")
    for m in re.finditer(r"error: (.+): (does not exist in index|No such file or directory|"
                         r"already exists in index|already exists in working directory)", stderr):
        lines.append(f"  file {m.group(1)}: {m.group(2)}")
    return "\n".join(lines) or "  " + stderr.strip().replace("\n", "\n  ")


def _find_hunk(diff: str, path: str, line: int) -> str:
    current = None
    for l in diff.splitlines():
        if l.startswith("diff --git "):
            current = l.split(" b/", 1)[-1]
        elif l.startswith("@@") and current == path:
            m = re.match(r"@@ -(\d+)", l)
            if m and int(m.group(1)) == line:
                return l
    return "(hunk header not found)"


def apply_entry(repo: git.Repo, tree: Path, series: Series, entry: Entry, *,
                three_way: bool = False) -> str:
    """Apply one entry as one commit; on failure raise with nothing of it left in the tree."""
    for rel in entry.overlay_files:
        if (tree / rel).exists():
            raise SeriesError(
                f"entry {entry.name}: overlay file {rel} already exists in the tree; the overlay "
                f"only adds new files. Move the change into the entry's diff instead.")
    if entry.diff:
        with tempfile.NamedTemporaryFile(suffix=".diff") as fh:
            fh.write(entry.diff)
            fh.flush()
            args = ["apply", "--index", "--whitespace=nowarn"]
            if three_way:
                args.append("--3way")
            try:
                gitutil.run(repo, *args, "--check", fh.name)
                gitutil.run(repo, *args, fh.name)
            except git.GitCommandError as e:
                gitutil.run(repo, "reset", "--quiet", "--hard", "HEAD")
                raise SeriesError(
                    f"entry {entry.name} ({entry.subject}) does not apply:\n"
                    f"{_rejected_hunk(entry, str(e.stderr))}\n"
                    f"The tree is left at the last good entry. Refresh the patch against the "
                    f"base (edit it in the applied tree and run `python apply.py export`).") from None
    for rel in entry.overlay_files:
        dest = tree / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(series.overlay_bytes(rel))
    return gitutil.commit_all(repo, entry.message, entry.author, entry.date)


def apply_series(series: Series, pin: BasePin, source: BaseSource, tree: Path, *,
                 force: bool = False) -> str:
    """Make `tree` = base + series. Returns a one-line summary."""
    digest = series.digest(source.ident)
    stamp = read_stamp(tree)
    if stamp is None and tree.exists() and any(tree.iterdir()):
        raise SeriesError(f"{tree} exists but was not made by this tool (no .git/{STAMP}); "
                          f"remove it or choose another tree")
    if stamp is not None:
        repo = git.Repo(tree)
        if not force:
            if gitutil.is_dirty(repo):
                raise SeriesError(
                    f"{tree} has uncommitted changes. Commit them and run `python apply.py "
                    f"export` to keep them in the series, or re-run with --force to discard them.")
            if stamp.get("head") and gitutil.head(repo) != stamp["head"]:
                raise SeriesError(
                    f"{tree} has commits that are not in patches/ (HEAD moved since the last "
                    f"apply). Run `python apply.py export` to keep them, or --force to discard.")
        if stamp.get("digest") == digest and stamp.get("head") == gitutil.head(repo) \
                and not gitutil.is_dirty(repo):
            return f"{tree} is up to date ({len(series.entries)} entries, series {digest[:10]})"
    if stamp is None or stamp.get("base_ident") != source.ident:
        staging = tree.with_name(tree.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        base = _create_base(source, pin, staging)
        write_stamp(staging, {"base": base, "base_ident": source.ident, "digest": None,
                               "head": base})
        if tree.exists():
            shutil.rmtree(tree)
        staging.rename(tree)
    else:
        base = stamp["base"]
    repo = git.Repo(tree)
    gitutil.run(repo, "reset", "--quiet", "--hard", base)
    gitutil.run(repo, "clean", "-q", "-fdx")
    state = {"base": base, "base_ident": source.ident, "digest": None, "head": base}
    write_stamp(tree, state)
    for i, entry in enumerate(series.entries, 1):
        print(f"  [{i}/{len(series.entries)}] {entry.subject}", file=sys.stderr)
        state["head"] = apply_entry(repo, tree, series, entry)
        write_stamp(tree, state)
    state["digest"] = digest
    write_stamp(tree, state)
    return f"applied {len(series.entries)} entries onto v{pin.version} in {tree} (series {digest[:10]})"
