#!/usr/bin/env python3
"""apply.py -- the MiniMax-M3 series tool (thin CLI over the m3series package).

  python apply.py apply   [--tree build/vllm] [--vllm-src DIR | --sdist FILE] [--force]
  python apply.py export  [--tree build/vllm]
  python apply.py build   [--tree build/vllm] [--target cuda|cpu] [--dist dist]
  python apply.py status  [--tree build/vllm]
  python apply.py fetch   {sdist|cuda|cpu}

The base comes from, in this order: --vllm-src / $VLLM_SRC (a vLLM git clone at
the pinned commit, clean), --sdist / $VLLM_SDIST (a local sdist), or the sdist
fetched from the package index pip is configured for. See README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from m3series import applier, exporter, wheel  # noqa: E402
from m3series.errors import SeriesError  # noqa: E402
from m3series.fetch import fetch  # noqa: E402
from m3series.pin import BasePin  # noqa: E402
from m3series.series import Series  # noqa: E402


def _root(args) -> Path:
    return Path(args.root).resolve()


def cmd_apply(args) -> int:
    root = _root(args)
    pin = BasePin.load(root / "patches" / "base.json")
    series = Series.load(root)
    source = applier.resolve_base(pin, args.vllm_src or os.environ.get("VLLM_SRC"),
                                  args.sdist or os.environ.get("VLLM_SDIST"))
    print(applier.apply_series(series, pin, source, Path(args.tree).resolve(), force=args.force))
    return 0


def cmd_export(args) -> int:
    changed = exporter.export_series(_root(args), Path(args.tree).resolve())
    print("\n".join(f"  wrote {c}" for c in changed) if changed else "series unchanged")
    return 0


def cmd_build(args) -> int:
    root = _root(args)
    pin = BasePin.load(root / "patches" / "base.json")
    out = wheel.build_wheel(Series.load(root), pin, Path(args.tree).resolve(), args.target,
                            Path(args.dist).resolve())
    print(out)
    return 0


def cmd_status(args) -> int:
    root = _root(args)
    pin = BasePin.load(root / "patches" / "base.json")
    series = Series.load(root)
    print(f"base: vLLM v{pin.version} (commit {pin.commit}, sdist sha256 {pin.sdist.sha256[:12]}…)")
    for i, e in enumerate(series.entries, 1):
        f = e.fields
        upstream = f.get("Applied-Upstream", "not upstream")
        print(f"{i:3}. {e.subject}\n     {e.name}: Origin {f.get('Origin')}; "
              f"Applied-Upstream: {upstream}; {len(e.overlay_files)} overlay files")
    stray = series.unowned_overlay_files()
    if stray:
        print("overlay files no entry owns (not applied): " + ", ".join(stray))
    tree = Path(args.tree).resolve()
    stamp = applier.read_stamp(tree)
    if stamp is None:
        print(f"applied tree: {tree} does not exist (run `make apply`)")
    else:
        current = stamp.get("digest") == series.digest(stamp["base_ident"])
        print(f"applied tree: {tree} is {'current' if current else 'STALE (run `make apply`)'}")
    return 0


def cmd_fetch(args) -> int:
    pin = BasePin.load(_root(args) / "patches" / "base.json")
    print(fetch(pin.sdist if args.what == "sdist" else pin.wheel(args.what)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", default=str(ROOT), help="series repository (patches/, vllm_overlay/)")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apply", help="base + series -> applied git tree")
    a.add_argument("--vllm-src", help="vLLM git clone at the pinned commit (or $VLLM_SRC)")
    a.add_argument("--sdist", help="local vLLM sdist (or $VLLM_SDIST)")
    a.add_argument("--force", action="store_true", help="discard uncommitted/unexported edits")
    e = sub.add_parser("export", help="applied tree's commits -> patches/ + vllm_overlay/")
    b = sub.add_parser("build", help="patched wheel from the official precompiled wheel")
    b.add_argument("--target", default=os.environ.get("TARGET", "cuda"))
    b.add_argument("--dist", default=str(ROOT / "dist"))
    s = sub.add_parser("status", help="the series at a glance")
    f = sub.add_parser("fetch", help="download and verify a pinned artifact into the cache")
    f.add_argument("what", choices=["sdist", "cuda", "cpu"])
    for q in (a, e, b, s):
        q.add_argument("--tree", default=str(ROOT / "build" / "vllm"), help="applied tree")
    args = p.parse_args(argv)
    try:
        return {"apply": cmd_apply, "export": cmd_export, "build": cmd_build,
                "status": cmd_status, "fetch": cmd_fetch}[args.cmd](args)
    except SeriesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
