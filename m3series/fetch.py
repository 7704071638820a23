"""Fetch pinned artifacts from the package index pip is configured for.

The index is the one pip would use: $PIP_INDEX_URL, else pip's configured
`index-url`, else pip's built-in default; extra indexes ($PIP_EXTRA_INDEX_URL
or `extra-index-url`) are tried after it. No index host is written in this
repository. Every artifact is verified against its pinned sha256 before it is
moved into the cache; a mismatch leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from .errors import SeriesError
from .pin import Artifact

CHUNK = 1 << 20


def cache_dir() -> Path:
    d = Path(os.environ.get("M3_SERIES_CACHE", Path.home() / ".cache" / "vllm-m3-series"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, art: Artifact) -> None:
    got = sha256_of(path)
    if got != art.sha256:
        raise SeriesError(
            f"sha256 mismatch for {path}: expected {art.sha256} (patches/base.json), got {got}. "
            f"The file is not the pinned {art.file}; fetch it again or point at the right file.")


def _pip_config(key: str) -> str | None:
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        k, _, v = line.partition("=")
        if k.split(".", 1)[-1] == key:
            return v.strip().strip("'\"")
    return None


def index_urls() -> list[str]:
    primary = os.environ.get("PIP_INDEX_URL") or _pip_config("index-url")
    if not primary:
        from pip._internal.models.index import PyPI  # pip's own default
        primary = PyPI.simple_url
    extra = os.environ.get("PIP_EXTRA_INDEX_URL") or _pip_config("extra-index-url") or ""
    return [primary] + [u for u in extra.split() if u]


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _project_files(index: str, project: str) -> dict[str, str]:
    """{file name: absolute URL} from a PEP 691 (JSON) or PEP 503 (HTML) simple index."""
    norm = re.sub(r"[-_.]+", "-", project).lower()
    url = index.rstrip("/") + f"/{norm}/"
    if url.startswith("file:"):       # an index on disk: its directory's index.html
        url += "index.html"
    req = urllib.request.Request(url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        body = resp.read()
        ctype = resp.headers.get("Content-Type", "") if hasattr(resp, "headers") else ""
    if "json" in ctype or body[:1] == b"{":
        # keep the index's sha256 as a URL fragment, as PEP 503 HTML pages carry it
        return {f["filename"]: urllib.parse.urljoin(url, f["url"]).split("#")[0]
                + (f"#sha256={f['hashes']['sha256']}" if f.get("hashes", {}).get("sha256") else "")
                for f in json.loads(body)["files"]}
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    files = {}
    for href in parser.links:
        full = urllib.parse.urljoin(url, href)
        files[urllib.parse.unquote(full.split("#")[0].rsplit("/", 1)[-1])] = full
    return files


def _download(url: str, dest: Path, label: str) -> None:
    with urllib.request.urlopen(url, timeout=300) as resp, open(dest, "wb") as out:
        total = int(resp.headers.get("Content-Length") or 0) if hasattr(resp, "headers") else 0
        done, last = 0, -1
        while chunk := resp.read(CHUNK):
            out.write(chunk)
            done += len(chunk)
            pct = done * 100 // total if total else -1
            if total and pct // 10 != last:
                last = pct // 10
                print(f"  {label}: {done >> 20} / {total >> 20} MiB ({pct}%)", file=sys.stderr,
                      flush=True)


def fetch(art: Artifact) -> Path:
    """Return a verified local copy of `art`, downloading it into the cache if needed."""
    dest = cache_dir() / art.file
    if dest.exists():
        verify(dest, art)
        return dest
    errors = []
    for index in index_urls():
        try:
            files = _project_files(index, art.project)
        except Exception as e:  # an index that lacks the project or is unreachable
            errors.append(f"{index}: {e}")
            continue
        if art.file not in files:
            errors.append(f"{index}: no file {art.file}")
            continue
        print(f"fetching {art.file} from the configured package index", file=sys.stderr)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            _download(files[art.file], tmp_path, art.file)
            verify(tmp_path, art)
            os.replace(tmp_path, dest)
        finally:
            tmp_path.unlink(missing_ok=True)
        return dest
    raise SeriesError(
        f"could not fetch {art.file} ({art.project}) from any configured package index:\n  "
        + "\n  ".join(errors)
        + "\nSet PIP_INDEX_URL, or pass a local file (VLLM_SDIST=... / --sdist) instead.")
