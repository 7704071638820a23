"""Export: the applied tree's commits -> patches/ and vllm_overlay/ (byte-stable).

Each commit after the base becomes one entry. Files a commit adds go to
vllm_overlay/ (listed as Overlay-File trailers); edits to files that already
existed go to the entry's diff. Only files whose bytes change are written, so
exporting an unchanged tree leaves the series untouched.
"""

from __future__ import annotations

import re
from pathlib import Path

import git

from . import gitutil
from .applier import read_stamp, write_stamp
from .errors import SeriesError
from .series import OVERLAY_FIELD, ORDER_FILE, Entry, Series, default_flavor, parse_patch


def _commit_message(repo: git.Repo, sha: str) -> str:
    raw = gitutil.raw(repo, "cat-file", "commit", sha).decode()
    return raw.split("\n\n", 1)[1]


def _with_overlay_trailers(body: str, files: list[str]) -> str:
    lines = [l for l in body.rstrip("\n").splitlines() if not l.startswith(OVERLAY_FIELD + ": ")]
    text = "\n".join(lines).rstrip("\n")
    if files:
        text += ("\n" if text else "") + "\n".join(f"{OVERLAY_FIELD}: {f}" for f in sorted(files))
    return text + "\n" if text else ""


def _slug(subject: str) -> str:
    s = re.sub(r"\[[^\]]*\]\s*", "", subject)           # drop [Tags]
    s = re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")
    return (s[:60].rstrip("-") or "entry") + ".patch"


def entries_from_tree(tree: Path, old: Series | None) -> tuple[list[Entry], dict[str, bytes]]:
    """Read the entries and overlay file contents from the applied tree."""
    stamp = read_stamp(tree)
    if stamp is None:
        raise SeriesError(f"{tree} is not an applied tree (run `make apply` first)")
    repo = git.Repo(tree)
    if gitutil.is_dirty(repo):
        raise SeriesError(f"{tree} has uncommitted changes; commit them (one commit per entry, "
                          f"`git commit --amend` or `git rebase -i`) before exporting")
    base = stamp["base"]
    old_names = {e.subject: e.name for e in (old.entries if old else [])}
    entries, overlay, used = [], {}, set()
    for sha in gitutil.commits_since(repo, base):
        parents = gitutil.run(repo, "rev-list", "--parents", "-n1", sha).split()[1:]
        if len(parents) != 1:
            raise SeriesError(f"commit {sha[:12]} in {tree} is a merge; the series is linear "
                              f"(rebase instead of merging)")
        parent = parents[0]
        message = _commit_message(repo, sha)
        subject, _, body = message.partition("\n")
        body = body[1:] if body.startswith("\n") else body
        added = [p for st, p in gitutil.changed_files(repo, parent, sha) if st == "A"]
        edited = [p for st, p in gitutil.changed_files(repo, parent, sha) if st != "A"]
        diff = gitutil.raw(repo, "diff", *gitutil.DIFF_OPTS, parent, sha, "--", *edited) \
            if edited else b""
        for rel in added:
            overlay[rel] = gitutil.show_file(repo, sha, rel)
        author, date = gitutil.run(repo, "log", "-1", "--format=%an <%ae>%n%aD", sha).split("\n")
        name = old_names.get(subject) or _slug(subject)
        stem, n = name[:-len(".patch")], 2
        while name in used:
            name, n = f"{stem}-{n}.patch", n + 1
        used.add(name)
        entry = Entry(name=name, author=author, date=date, subject=subject,
                      body=_with_overlay_trailers(body, added), diff=diff)
        parse_patch(name, entry.render())     # validates provenance before anything is written
        entries.append(entry)
    return entries, overlay


def _write_if_changed(path: Path, data: bytes, changed: list[str], label: str) -> None:
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    changed.append(label)


def export_series(root: Path, tree: Path, flavor: str | None = None,
                  force: bool = False) -> list[str]:
    """Write the tree's entries back into the flavor's patches folder and root/vllm_overlay;
    return what changed. Overlay files are shared between flavors: one that another
    flavor's entries own is never removed."""
    if flavor is None and not (root / "patches" / ORDER_FILE).is_file():
        flavor = default_flavor(root)
    try:
        old = Series.load(root, flavor)
    except SeriesError:
        old = None
    stamp = read_stamp(tree)
    if old is not None and stamp and stamp.get("digest") and not force \
            and old.digest(stamp["base_ident"]) != stamp["digest"]:
        # the series on disk moved on since the tree was applied (a commit, a merge, or
        # an export from another flavor's tree: overlay files are shared): exporting
        # the tree's older copies would undo that
        raise SeriesError(
            f"{old.rel}/ or vllm_overlay/ changed since {tree} was applied; exporting it "
            f"would overwrite those changes with the tree's older files. Re-apply first "
            f"(`make apply`, with the same BASE=; move your commits over with "
            f"`git cherry-pick`), or pass --force to export the tree as it is.")
    entries, overlay = entries_from_tree(tree, old)
    series = old or Series(root=root, flavor=flavor)
    patches, overlay_dir, rel_dir = series.patches_dir, root / "vllm_overlay", series.rel
    other_owned = series.owned_by_other_flavors()
    changed: list[str] = []
    order = patches / ORDER_FILE
    header = [l for l in order.read_text().splitlines() if l.startswith("#")] if order.exists() else []
    order_text = "\n".join(header + [e.name for e in entries]) + "\n"
    for e in entries:
        _write_if_changed(patches / e.name, e.render(), changed, f"{rel_dir}/{e.name}")
    for rel, data in overlay.items():
        _write_if_changed(overlay_dir / rel, data, changed, f"vllm_overlay/{rel}")
    _write_if_changed(order, order_text.encode(), changed, f"{rel_dir}/{ORDER_FILE}")
    if old:
        names = {e.name for e in entries}
        for e in old.entries:
            if e.name not in names:
                (patches / e.name).unlink(missing_ok=True)
                changed.append(f"{rel_dir}/{e.name} (removed)")
            for rel in e.overlay_files:
                if rel not in overlay and rel not in other_owned:
                    (overlay_dir / rel).unlink(missing_ok=True)
                    changed.append(f"vllm_overlay/{rel} (removed)")
    # The tree now is exactly base + the written series: record that, so `make apply`
    # sees it as current instead of refusing over "unexported commits".
    stamp = read_stamp(tree)
    stamp["digest"] = Series.load(root, flavor).digest(stamp["base_ident"])
    stamp["head"] = gitutil.head(git.Repo(tree))
    write_stamp(tree, stamp)
    return changed
