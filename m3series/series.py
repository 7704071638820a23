"""The series on disk: patches/series (order file), patch files, overlay files.

Patch files are in `git format-patch` form (mbox header, commit message, `---`,
diff) so that `git am` takes them anywhere. The commit message ends with a
DEP-3 provenance block written as git trailers:

    Origin: upstream, https://github.com/vllm-project/vllm/pull/51585
    Forwarded: not-needed
    Applied-Upstream: v0.30.0, https://github.com/vllm-project/vllm/pull/51585
    Last-Update: 2026-11-29
    Overlay-File: vllm/models/minimax_m3/__init__.py

The Subject plus the message body are the DEP-3 Description. `Overlay-File`
lines name the new files this entry adds from vllm_overlay/ (the diff itself
only edits files the base already has).
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
            if m and m.group(1) != OVERLAY_FIELD:
                out[m.group(1)] = m.group(2)
        return out

    @property
    def overlay_files(self) -> list[str]:
        return [line.split(": ", 1)[1] for line in self.body.splitlines()
                if line.startswith(OVERLAY_FIELD + ": ")]

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


def parse_patch(name: str, data: bytes) -> Entry:
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
        raise SeriesError(f"patches/{name}: corrupt patch file ({e}). Restore it from git "
                          f"or regenerate it with `python apply.py export`.") from None
    missing = [f for f in REQUIRED_FIELDS if f not in entry.fields]
    if missing:
        raise SeriesError(f"patches/{name}: provenance header lacks {', '.join(missing)} "
                          f"(DEP-3 trailers at the end of the message, e.g. "
                          f"'Origin: upstream, <PR url>'). Add them and re-run.")
    if entry.origin_kind not in ORIGIN_KINDS:
        raise SeriesError(f"patches/{name}: Origin must start with one of "
                          f"{', '.join(ORIGIN_KINDS)}; got {entry.fields['Origin']!r}")
    return entry


@dataclass
class Series:
    root: Path                      # the repository holding patches/ and vllm_overlay/
    entries: list[Entry] = field(default_factory=list)

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def overlay_dir(self) -> Path:
        return self.root / "vllm_overlay"

    @classmethod
    def load(cls, root: Path) -> "Series":
        order = root / "patches" / ORDER_FILE
        if not order.exists():
            raise SeriesError(f"{order}: the order file is missing; it lists one patch file "
                              f"per line, in apply order")
        series = cls(root=root)
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
                raise SeriesError(f"{order}:{lineno}: patch file patches/{name} is missing; "
                                  f"restore it or remove the line from patches/{ORDER_FILE}")
            entry = parse_patch(name, path.read_bytes())
            for rel in entry.overlay_files:
                if not (series.overlay_dir / rel).is_file():
                    raise SeriesError(f"patches/{name}: overlay file vllm_overlay/{rel} is "
                                      f"missing; restore it or drop its Overlay-File line")
            series.entries.append(entry)
        owned = [rel for e in series.entries for rel in e.overlay_files]
        dupes = {r for r in owned if owned.count(r) > 1}
        if dupes:
            raise SeriesError(f"overlay files owned by more than one entry: {sorted(dupes)}")
        return series

    def overlay_bytes(self, rel: str) -> bytes:
        return (self.overlay_dir / rel).read_bytes()

    def unowned_overlay_files(self) -> list[str]:
        owned = {rel for e in self.entries for rel in e.overlay_files}
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
