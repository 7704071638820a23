"""Import an upstream fix into the series, with its provenance, verified before writing.

The change comes from a patch file (`git format-patch` output, e.g. a PR's .patch,
or a plain diff with --subject), a commit of the applied tree, or a git ref of a
vLLM clone. It becomes one entry whose DEP-3 trailers record where it came from:

    Origin: upstream, <PR or commit URL>
    Forwarded: not-needed
    Applied-Upstream: <version or URL>
    Last-Update: <today>

It is inserted at the asked position (default: after the last upstream/backport
entry). Before anything is written, the whole new series is applied to the base
in a scratch tree; an import that does not apply, or that breaks a later entry,
is refused with the file and hunk named and nothing written.
"""

from __future__ import annotations

import email.header
import re
import sys
import tempfile
from dataclasses import dataclass
from datetime import date
from email.utils import formatdate
from pathlib import Path

import git

from . import applier, exporter, gitutil, txn
from .errors import SeriesError
from .pin import BasePin
from .series import ORDER_FILE, Entry, Series, mail_header_fields

DEP3_KEYS = ("Origin", "Forwarded", "Applied-Upstream", "Last-Update", "Overlay-File",
             "Bug", "Author", "Reviewed-by", "Description")
DEFAULT_AUTHOR = "vllm-m3-series maintainers <m3-series@example.invalid>"
BACKPORT_KINDS = ("upstream", "backport")


@dataclass
class Change:
    author: str
    date: str
    subject: str
    body: str          # without the subject; may be empty
    diff: bytes
    source: str        # for messages


def _decode_header(value: str) -> str:
    return str(email.header.make_header(email.header.decode_header(value)))


def change_from_patch_file(path: Path, subject: str | None = None) -> Change:
    """A `git format-patch` mail (one commit) or a plain git diff (needs --subject)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SeriesError(f"--patch {path}: cannot read it ({e.strerror})") from None
    text = data.decode("utf-8", "replace")
    mails = re.findall(r"^From [0-9a-f]{40} ", text, re.M)
    if len(mails) > 1:
        raise SeriesError(f"--patch {path} holds {len(mails)} commits; import one commit per "
                          f"entry (split the file), or squash them in a clone and use --ref")
    diff_at = text.find("diff --git ")
    if diff_at < 0:
        raise SeriesError(f"--patch {path}: no 'diff --git' in it; give a `git format-patch` "
                          f"file or a git diff")
    if not mails:
        if not subject:
            raise SeriesError(f"--patch {path} is a plain diff without a commit message; "
                              f"pass --subject (and --author) for the entry")
        return Change(DEFAULT_AUTHOR, formatdate(), subject, "", data[data.find(b"diff --git "):],
                      str(path))
    head, _, rest = text.partition("\n\n")
    fields = mail_header_fields(head)
    if "Subject" not in fields or "From" not in fields:
        raise SeriesError(f"--patch {path}: mail header lacks From: or Subject:")
    msg_end = rest.find("\n---\n")
    message = rest[:msg_end] if msg_end >= 0 else rest[:rest.find("diff --git ")]
    subj = subject or re.sub(r"^\[PATCH[^\]]*\]\s*", "", _decode_header(fields["Subject"]))
    diff = data[data.find(b"diff --git "):]
    sig = re.search(rb"\n-- \n[^\n]*\n*\Z", diff)          # format-patch's "-- \n2.43.0"
    if sig:
        diff = diff[:sig.start() + 1]
    return Change(_decode_header(fields["From"]), fields.get("Date") or formatdate(), subj,
                  message.strip("\n"), diff, str(path))


def change_from_commit(repo_path: Path, rev: str, what: str) -> Change:
    repo = gitutil.open_repo(repo_path)
    if repo is None:
        raise SeriesError(f"{what} {repo_path} is not a git repository")
    sha = gitutil.resolve(repo, f"{rev}^{{commit}}")
    if sha is None:
        raise SeriesError(f"{rev!r} is not a commit of {repo_path} "
                          f"(`git -C {repo_path} log --oneline` lists them; fetch it first?)")
    parents = gitutil.run(repo, "rev-list", "--parents", "-n1", sha).split()[1:]
    if len(parents) != 1:
        raise SeriesError(f"{rev} ({sha[:12]}) is a merge or root commit; import the commit "
                          f"that carries the fix itself")
    raw = gitutil.raw(repo, "cat-file", "commit", sha).decode("utf-8", "replace")
    message = raw.split("\n\n", 1)[1]
    subject, _, body = message.partition("\n")
    author, when = gitutil.run(repo, "log", "-1", "--format=%an <%ae>%n%aD", sha).split("\n")
    diff = gitutil.raw(repo, "diff", *gitutil.DIFF_OPTS, parents[0], sha)
    if not diff:
        raise SeriesError(f"{rev} ({sha[:12]}) changes nothing")
    return Change(author, when, subject.strip(), body.strip("\n"), diff, f"{repo_path}@{sha[:12]}")


def build_message(change: Change, url: str, reason: str, applied_upstream: str | None,
                  today: str | None = None) -> str:
    """Subject, the upstream body, the reason, then the DEP-3 trailer block."""
    paragraphs = [p for p in change.body.split("\n\n") if p.strip()] if change.body else []
    if paragraphs:      # drop any earlier provenance lines; they are rewritten below
        last = [l for l in paragraphs[-1].splitlines()
                if not re.match(rf"^({'|'.join(DEP3_KEYS)}): ", l)]
        paragraphs[-1:] = ["\n".join(last)] if last else []
    paragraphs.append(f"Carried in this series: {reason.strip()}")
    trailers = (f"Origin: upstream, {url}\nForwarded: not-needed\n"
                f"Applied-Upstream: {applied_upstream or url}\n"
                f"Last-Update: {today or date.today().isoformat()}")
    return change.subject + "\n\n" + "\n\n".join(paragraphs + [trailers]) + "\n"


def insert_index(series: Series, position: int | None, after: str | None) -> int:
    """0-based index the new entry takes."""
    n = len(series.entries)
    if after:
        names = [e.name for e in series.entries]
        if after not in names:
            raise SeriesError(f"--after {after}: no such entry; entries: {', '.join(names) or 'none'}")
        return names.index(after) + 1
    if position is not None:
        if not 1 <= position <= n + 1:
            raise SeriesError(f"--position {position}: choose 1..{n + 1} (the series has {n} entries)")
        return position - 1
    last = [i for i, e in enumerate(series.entries) if e.origin_kind in BACKPORT_KINDS]
    return last[-1] + 1 if last else 0


def _scratch_source(pin: BasePin, tree: Path | None, sdist: str | None) -> applier.BaseSource:
    """The pinned base; taken from the applied tree's base commit when that is the same base."""
    source = applier.resolve_base(pin, None, sdist)
    stamp = applier.read_stamp(tree) if tree else None
    if stamp and stamp.get("base_ident") == source.ident:
        return applier.BaseSource("git", tree, f"git:{stamp['base']}")
    return source


def import_change(root: Path, change: Change, *, url: str, reason: str,
                  applied_upstream: str | None = None, position: int | None = None,
                  after: str | None = None, name: str | None = None, tree: Path | None = None,
                  sdist: str | None = None, today: str | None = None,
                  flavor: str | None = None) -> tuple[str, list[str]]:
    """Verify and write the new entry; return (its patch file name, files written)."""
    if not url or not re.match(r"^[a-z][a-z0-9+.-]*://\S+$", url):
        raise SeriesError("--url must be the upstream PR or commit URL (the entry's Origin), "
                          f"got {url!r}")
    if not reason or not reason.strip():
        raise SeriesError("--reason is required: say why the series carries this fix")
    series = Series.load(root, flavor)
    pin = BasePin.load(series.pin_path)
    for e in series.entries:
        if url in e.fields.get("Origin", "").split():
            raise SeriesError(f"{url} is already in the series as {series.rel}/{e.name}; "
                              f"edit that entry instead")
    at = insert_index(series, position, after)
    message = build_message(change, url, reason, applied_upstream, today)
    subject, _, body = message.partition("\n")
    new = Entry(name="(import)", author=change.author, date=change.date, subject=subject,
                body=body[1:], diff=change.diff)
    with tempfile.TemporaryDirectory(prefix="m3-import-") as tmp:
        scratch = Path(tmp) / "vllm"
        head = Series(root=root, entries=series.entries[:at], flavor=flavor)
        source = _scratch_source(pin, tree, sdist)
        print(applier.apply_series(head, pin, source, scratch, force=True), file=sys.stderr)
        repo = git.Repo(scratch)
        with tempfile.NamedTemporaryFile(suffix=".diff") as fh:
            fh.write(change.diff)
            fh.flush()
            rc, _, err = gitutil.run_full(repo, "apply", "--index", "--whitespace=nowarn", fh.name)
        if rc:
            raise SeriesError(
                f"the import of {change.source} ({subject}) conflicts with the series at position "
                f"{at + 1} on v{pin.version}:\n{applier._rejected_hunk(new, err)}\n"
                f"Nothing was written. Port the fix by hand: `make apply`, edit build/vllm, "
                f"commit, then `python apply.py import --commit HEAD ...`.")
        gitutil.commit_all(repo, message, change.author, change.date)
        for later in series.entries[at:]:
            try:
                applier.apply_entry(repo, scratch, series, later)
            except SeriesError as e:
                raise SeriesError(
                    f"the import of {change.source} applies, but then the later entry {later.name} "
                    f"no longer does (they touch the same lines):\n{e}\nNothing was written. Put "
                    f"the import after it (--after {later.name}) or refresh that entry.") from None
        stamp = applier.read_stamp(scratch)
        applier.write_stamp(scratch, {**stamp, "head": gitutil.head(repo)})
        entries, overlay = exporter.entries_from_tree(scratch, series)
    entry = entries[at]
    entry.name = name or entry.name
    if not entry.name.endswith(".patch"):
        entry.name += ".patch"
    taken = {e.name for e in series.entries} | {p.name for p in series.patches_dir.glob("*.patch")}
    stem, n = entry.name[:-len(".patch")], 2
    while entry.name in taken:
        entry.name, n = f"{stem}-{n}.patch", n + 1
    for rel in entry.overlay_files:
        if (root / "vllm_overlay" / rel).exists():
            raise SeriesError(f"the import adds {rel}, but vllm_overlay/{rel} already exists "
                              f"(owned by another entry or not yet owned); nothing was written")
    writes = {f"{series.rel}/{entry.name}": entry.render()}
    writes.update({f"vllm_overlay/{rel}": overlay[rel] for rel in entry.overlay_files})
    writes[f"{series.rel}/{ORDER_FILE}"] = _order_with(series, at, entry.name)
    return entry.name, txn.write_together(root, writes)


def _order_with(series: Series, at: int, name: str) -> bytes:
    """The order file with `name` inserted before entry `at` (comments kept in place)."""
    lines = (series.patches_dir / ORDER_FILE).read_text().splitlines()
    entry_lines = [i for i, l in enumerate(lines) if l.split("#", 1)[0].strip()]
    if at < len(entry_lines):
        lines.insert(entry_lines[at], name)
    elif entry_lines:
        lines.insert(entry_lines[-1] + 1, name)
    else:
        lines.append(name)
    return ("\n".join(lines) + "\n").encode()
