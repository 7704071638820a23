"""The series on disk: patches/series (order file), patch files, overlay files.

Patch files are in `git format-patch` form (mbox header, commit message, `---`,
diff) so that `git am` takes them anywhere. The commit message ends with a
DEP-3 provenance block written as git trailers:

    Origin: upstream, https://github.com/vllm-project/vllm/pull/51585
    Forwarded: not-needed
    Applied-Upstream: v0.30.0, https://github.com/vllm-project/vllm/pull/51585
    Last-Update: 2026-11-29
    Overlay-File: vllm/models/minimax_m3/__init__.py
    Series-Tests: tests/parsers/test_minimax_m3_tool_parser.py

The Subject plus the message body are the DEP-3 Description. `Overlay-File`
lines name the new files this entry adds from vllm_overlay/ (the diff itself
only edits files the base already has). `Series-Tests` lines name this
repository's tests that pin the entry's own behaviour: `apply.py check-entries`
runs them with the series stopped at the entry (bisectability).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SeriesError

ORDER_FILE = "series"
ZERO_FROM = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
REQUIRED_FIELDS = ("Origin", "Forwarded", "Last-Update")
ORIGIN_KINDS = ("upstream", "backport", "vendor", "other")
OVERLAY_FIELD = "Overlay-File"
TESTS_FIELD = "Series-Tests"
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.*)$")


@dataclass
class Entry:
    name: str            # patch file name, as listed in the order file
    author: str          # "Name <mail>"
    date: str            # RFC 2822, as git writes %aD
    subject: str
    body: str            # message body after the subject (may be empty), ends with "\n"
    diff: bytes          # the diff part (possibly empty)

    @property
    def message(self) -> str:
        return self.subject + "\n" + ("\n" + self.body if self.body else "")

    @property
    def fields(self) -> dict[str, str]:
        """DEP-3 fields from the trailer block (last paragraph of the body)."""
        last = self.body.rstrip("\n").split("\n\n")[-1] if self.body else ""
        out: dict[str, str] = {}
        for line in last.splitlines():
            m = _TRAILER.match(line)
            if m and m.group(1) not in (OVERLAY_FIELD, TESTS_FIELD):
                out[m.group(1)] = m.group(2)
        return out

    @property
    def overlay_files(self) -> list[str]:
        return [line.split(": ", 1)[1] for line in self.body.splitlines()
                if line.startswith(OVERLAY_FIELD + ": ")]

    @property
    def tests(self) -> list[str]:
        """This repository's tests of the entry's own behaviour (Series-Tests lines)."""
        return [line.split(": ", 1)[1] for line in self.body.splitlines()
                if line.startswith(TESTS_FIELD + ": ")]

    @property
    def origin_kind(self) -> str:
        return self.fields.get("Origin", "").split(",")[0].strip()

    def render(self) -> bytes:
        """The patch file's bytes (inverse of parse_patch)."""
        head = (ZERO_FROM + f"From: {self.author}\nDate: {self.date}\n"
                f"Subject: [PATCH] {self.subject}\n\n")
        return (head + self.body + "---\n").encode() + self.diff


def mail_header_fields(header: str) -> dict[str, str]:
    """The fields of a format-patch mail header (the text before the first blank
    line, its 'From <sha> <date>' line first): name -> value, folded continuation
    lines joined with one space. The one mbox-header parser (patch files, imports)."""
    fields: dict[str, str] = {}
    key = None
    for line in header.splitlines()[1:]:
        if line[:1] in (" ", "\t") and key:
            fields[key] += " " + line.strip()
            continue
        key, _, value = line.partition(": ")
        fields[key] = value
    return fields


def parse_patch(name: str, data: bytes, rel: str = "patches") -> Entry:
    """Parse a format-patch file; raise SeriesError naming the file on anything odd."""
    try:
        text_head, sep, diff = data.partition(b"\n---\n")
        if not sep:
            if data.endswith(b"\n---\n") or data.endswith(b"---\n"):
                text_head, diff = data[: data.rfind(b"---\n")].rstrip(b"\n"), b""
            else:
                raise ValueError("no '---' line separating the message from the diff")
        head = text_head.decode("utf-8")
        if not head.startswith("From "):
            raise ValueError("does not start with a 'From <sha> <date>' line")
        header, _, body = head.partition("\n\n")
        fields = mail_header_fields(header)
        for needed in ("From", "Date", "Subject"):
            if needed not in fields:
                raise ValueError(f"missing '{needed}:' header")
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", fields["Subject"])
        if diff and not diff.startswith(b"diff --git "):
            raise ValueError("the part after '---' is not a git diff")
        entry = Entry(name=name, author=fields["From"], date=fields["Date"], subject=subject,
                      body=(body + "\n") if body else "", diff=diff)
    except (ValueError, UnicodeDecodeError) as e:
        raise SeriesError(f"{rel}/{name}: corrupt patch file ({e}). Restore it from git "
                          f"or regenerate it with `python apply.py export`.") from None
    missing = [f for f in REQUIRED_FIELDS if f not in entry.fields]
    if missing:
        raise SeriesError(f"{rel}/{name}: provenance header lacks {', '.join(missing)} "
                          f"(DEP-3 trailers at the end of the message, e.g. "
                          f"'Origin: upstream, <PR url>'). Add them and re-run.")
    if entry.origin_kind not in ORIGIN_KINDS:
        raise SeriesError(f"{rel}/{name}: Origin must start with one of "
                          f"{', '.join(ORIGIN_KINDS)}; got {entry.fields['Origin']!r}")
    return entry


DEFAULT_FILE = "default"          # patches/default names the default flavor


def list_flavors(root: Path) -> list[str]:
    """The flavors of a repository: folders of patches/ that hold an order file."""
    d = root / "patches"
    return sorted(p.name for p in d.iterdir() if (p / ORDER_FILE).is_file()) if d.is_dir() else []


def default_flavor(root: Path) -> str | None:
    """patches/default's flavor; None for a single-series repository (patches/series)."""
    if (root / "patches" / ORDER_FILE).is_file():
        return None
    f = root / "patches" / DEFAULT_FILE
    if not f.is_file():
        raise SeriesError(f"{f} is missing: it names the default flavor (one of "
                          f"{', '.join(list_flavors(root)) or 'none found'}); restore it from git")
    return f.read_text().strip()


def resolve_flavor(root: Path, name: str | None) -> str | None:
    """The flavor a command works on: `name` (e.g. "v0.26.0", from BASE=/--base) or the default.

    A repository whose patches/ holds the order file itself has a single series
    (flavor None) and takes no name.
    """
    if (root / "patches" / ORDER_FILE).is_file():
        if name:
            raise SeriesError(f"{root}/patches holds a single series; --base {name} names a "
                              f"flavor, which needs patches/{name}/series")
        return None
    name = name or default_flavor(root)
    if name not in list_flavors(root):
        raise SeriesError(f"unknown base flavor {name!r}: patches/{name}/series does not exist; "
                          f"the flavors are {', '.join(list_flavors(root)) or 'none'} "
                          f"(e.g. `make apply BASE={(list_flavors(root) or ['v0.23.0'])[-1]}`)")
    return name


@dataclass
class Series:
    root: Path                      # the repository holding patches/ and vllm_overlay/
    entries: list[Entry] = field(default_factory=list)
    flavor: str | None = None       # patches/<flavor>/; None: patches/ itself

    @property
    def rel(self) -> str:
        """The series folder relative to root, as messages name it."""
        return "patches" if self.flavor is None else f"patches/{self.flavor}"

    @property
    def patches_dir(self) -> Path:
        return self.root / self.rel

    @property
    def pin_path(self) -> Path:
        return self.patches_dir / "base.json"

    @property
    def overlay_dir(self) -> Path:
        return self.root / "vllm_overlay"

    @classmethod
    def load(cls, root: Path, flavor: str | None = None) -> "Series":
        """The series of `flavor` (None: the default flavor, or patches/ itself in a
        single-series repository)."""
        if flavor is None and not (root / "patches" / ORDER_FILE).is_file():
            flavor = default_flavor(root)
        series = cls(root=root, flavor=flavor)
        order = series.patches_dir / ORDER_FILE
        if not order.exists():
            raise SeriesError(f"{order}: the order file is missing; it lists one patch file "
                              f"per line, in apply order")
        seen = set()
        for lineno, line in enumerate(order.read_text().splitlines(), 1):
            name = line.split("#", 1)[0].strip()
            if not name:
                continue
            if name in seen:
                raise SeriesError(f"{order}:{lineno}: {name} is listed twice")
            seen.add(name)
            path = series.patches_dir / name
            if not path.is_file():
                raise SeriesError(f"{order}:{lineno}: patch file {series.rel}/{name} is missing; "
                                  f"restore it or remove the line from {series.rel}/{ORDER_FILE}")
            entry = parse_patch(name, path.read_bytes(), series.rel)
            for rel in entry.overlay_files:
                if not (series.overlay_dir / rel).is_file():
                    raise SeriesError(f"{series.rel}/{name}: overlay file vllm_overlay/{rel} is "
                                      f"missing; restore it or drop its Overlay-File line")
            series.entries.append(entry)
        owned = [rel for e in series.entries for rel in e.overlay_files]
        dupes = {r for r in owned if owned.count(r) > 1}
        if dupes:
            raise SeriesError(f"overlay files owned by more than one entry: {sorted(dupes)}")
        return series

    def overlay_bytes(self, rel: str) -> bytes:
        return (self.overlay_dir / rel).read_bytes()

    def owned_by_other_flavors(self) -> set[str]:
        """Overlay files that entries of the repository's other flavors own."""
        owned: set[str] = set()
        for name in list_flavors(self.root) if self.flavor is not None else []:
            if name != self.flavor:
                owned |= {rel for e in Series.load(self.root, name).entries
                          for rel in e.overlay_files}
        return owned

    def unowned_overlay_files(self) -> list[str]:
        """Overlay files no entry of any flavor owns."""
        owned = {rel for e in self.entries for rel in e.overlay_files}
        owned |= self.owned_by_other_flavors()
        if not self.overlay_dir.exists():
            return []
        return sorted(str(p.relative_to(self.overlay_dir)) for p in self.overlay_dir.rglob("*")
                      if p.is_file() and str(p.relative_to(self.overlay_dir)) not in owned
                      and "__pycache__" not in p.parts)

    def digest(self, base_id: str) -> str:
        """sha256 over the base identity and every byte the series applies."""
        h = hashlib.sha256()
        h.update(base_id.encode() + b"\0")
        for e in self.entries:
            h.update(e.name.encode() + b"\0" + e.render() + b"\0")
            for rel in sorted(e.overlay_files):
                h.update(rel.encode() + b"\0" + self.overlay_bytes(rel) + b"\0")
        return h.hexdigest()
