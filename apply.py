#!/usr/bin/env python3
"""apply.py -- the MiniMax-M3 series tool (thin CLI over the m3series package).

Every command takes --flavor NAME (make's BASE=): the folder of patches/ whose pin,
order file and patches it works on (default: the one patches/default names).

  python apply.py apply   [--tree build/vllm] [--vllm-src DIR | --sdist FILE] [--force]
  python apply.py export  [--tree build/vllm]
  python apply.py build   [--tree build/vllm] [--target cuda|cpu] [--dist dist]
  python apply.py status  [--tree build/vllm]
  python apply.py fetch   {sdist|cuda|cpu}
  python apply.py import  (--patch FILE | --commit REV [--tree] | --ref REF --repo CLONE)
                          --url URL --reason TEXT [--applied-upstream V] [--position N | --after NAME]
  python apply.py rebase  --onto {VERSION | SDIST | REF --vllm-src CLONE} [--write] [--work DIR]
  python apply.py image   --base IMAGE [--out build/image] [--allow-version-mismatch]

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

from m3series import applier, entrycheck, exporter, image, importer, rebaser, wheel  # noqa: E402
from m3series.errors import SeriesError  # noqa: E402
from m3series.fetch import fetch  # noqa: E402
from m3series.pin import BasePin  # noqa: E402
from m3series.series import Series, default_flavor, resolve_flavor  # noqa: E402


def _root(args) -> Path:
    return Path(args.root).resolve()


def _flavor(args) -> str | None:
    """The base flavor (--flavor, else patches/default); sets args.tree's default."""
    root = _root(args)
    name = args.flavor or (image.flavor_for_image(root, args.base) if args.cmd == "image" else None)
    flavor = resolve_flavor(root, name)
    if getattr(args, "tree", None) is None:
        args.tree = str(default_tree(root, flavor))
    return flavor


def default_tree(root: Path, flavor: str | None) -> Path:
    """build/vllm for the default flavor, build/vllm-<flavor> for the others."""
    if flavor is None or flavor == default_flavor(root):
        return root / "build" / "vllm"
    return root / "build" / f"vllm-{flavor}"


def _series_and_pin(args) -> tuple[Series, BasePin]:
    series = Series.load(_root(args), _flavor(args))
    return series, BasePin.load(series.pin_path)


def cmd_apply(args) -> int:
    series, pin = _series_and_pin(args)
    source = applier.resolve_base(pin, args.vllm_src or os.environ.get("VLLM_SRC"),
                                  args.sdist or os.environ.get("VLLM_SDIST"))
    print(applier.apply_series(series, pin, source, Path(args.tree).resolve(), force=args.force))
    return 0


def cmd_export(args) -> int:
    flavor = _flavor(args)
    changed = exporter.export_series(_root(args), Path(args.tree).resolve(), flavor,
                                     force=args.force)
    print("\n".join(f"  wrote {c}" for c in changed) if changed else "series unchanged")
    return 0


def cmd_build(args) -> int:
    series, pin = _series_and_pin(args)
    out = wheel.build_wheel(series, pin, Path(args.tree).resolve(), args.target,
                            Path(args.dist).resolve())
    print(out)
    return 0


def cmd_status(args) -> int:
    series, pin = _series_and_pin(args)
    print(f"flavor: {series.flavor or '(single series)'}; series folder {series.rel}/")
    print(f"base: vLLM v{pin.version} (commit {pin.commit}, sdist sha256 {pin.sdist.sha256[:12]}…)")
    for i, e in enumerate(series.entries, 1):
        f = e.fields
        upstream = f.get("Applied-Upstream", "not upstream")
        print(f"{i:3}. {e.subject}\n     {e.name}: Origin {f.get('Origin')}; "
              f"Applied-Upstream: {upstream}; {len(e.overlay_files)} overlay files")
        if e.origin_kind in ("upstream", "backport"):
            print(f"     upstream status: {rebaser.upstream_status(e, pin.version)}")
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


def cmd_import(args) -> int:
    root = _root(args)
    flavor = _flavor(args)
    tree = Path(args.tree).resolve()
    if sum(x is not None for x in (args.patch, args.commit, args.ref)) != 1:
        raise SeriesError("import takes exactly one of --patch FILE, --commit REV (a commit of the "
                          "applied tree) or --ref REF --repo CLONE")
    if args.patch:
        change = importer.change_from_patch_file(Path(args.patch), args.subject)
    elif args.commit:
        change = importer.change_from_commit(tree, args.commit, "--tree")
    else:
        if not args.repo:
            raise SeriesError("--ref needs --repo CLONE (the vLLM clone that has the commit)")
        change = importer.change_from_commit(Path(args.repo).expanduser().resolve(), args.ref,
                                             "--repo")
    if args.author:
        change.author = args.author
    name, written = importer.import_change(
        root, change, url=args.url, reason=args.reason, applied_upstream=args.applied_upstream,
        position=args.position, after=args.after, name=args.name, tree=tree,
        sdist=args.sdist or os.environ.get("VLLM_SDIST"), flavor=flavor)
    rel = Series(root=root, flavor=flavor).rel
    print(f"imported {change.source} as {rel}/{name}; the series applies on the base")
    print("\n".join(f"  wrote {w}" for w in written))
    print("next: `make apply` (add --force if build/vllm has commits of its own), then review "
          "`git diff patches/`")
    return 0


def cmd_rebase(args) -> int:
    flavor = _flavor(args)
    report = rebaser.rebase(_root(args), args.onto, vllm_src=args.vllm_src,
                            tree=Path(args.tree).resolve(),
                            work=Path(args.work).resolve() if args.work else None,
                            write=args.write, flavor=flavor)
    print(report.render())
    return 0


def cmd_image(args) -> int:
    series, pin = _series_and_pin(args)
    out = Path(args.out).resolve()
    # the applied tree of the flavor first (a no-op when it is current)
    source = applier.resolve_base(pin, os.environ.get("VLLM_SRC"), os.environ.get("VLLM_SDIST"))
    print(applier.apply_series(series, pin, source, Path(args.tree).resolve()), file=sys.stderr)
    manifest = image.write_image_context(series, pin, Path(args.tree).resolve(),
                                         args.base, out,
                                         allow_version_mismatch=args.allow_version_mismatch)
    print(f"wrote {out}/Dockerfile and its build context: {len(manifest['files'])} files over "
          f"{args.base}, series {manifest['series_hash'][:10]}")
    print(f"build it with: docker build -t vllm-m3:{manifest['series_hash'][:10]} {out}")
    return 0


def cmd_check_entries(args) -> int:
    series, _ = _series_and_pin(args)
    results = entrycheck.check_entries(series, Path(args.tree).resolve(), args.python,
                                       run_tests=not args.imports_only,
                                       tests_at_full_series=not args.skip_full_series_tests)
    text = entrycheck.report(results)
    if text:
        print(text)
    bad = [r for r in results if not r.ok]
    print(f"{len(results) - len(bad)} of {len(results)} prefixes import"
          + (f"; first failing: entry {bad[0].index}" if bad else ""))
    return 1 if bad else 0


def cmd_fetch(args) -> int:
    _, pin = _series_and_pin(args)
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
    e.add_argument("--force", action="store_true",
                   help="export even when the series changed since the tree was applied")
    b = sub.add_parser("build", help="patched wheel from the official precompiled wheel")
    b.add_argument("--target", default=os.environ.get("TARGET", "cuda"))
    b.add_argument("--dist", default=str(ROOT / "dist"))
    s = sub.add_parser("status", help="the series at a glance")
    f = sub.add_parser("fetch", help="download and verify a pinned artifact into the cache")
    f.add_argument("what", choices=["sdist", "cuda", "cpu"])
    im = sub.add_parser("import", help="add an upstream fix to the series, with provenance")
    src = im.add_argument_group("where the change comes from (one of)")
    src.add_argument("--patch", help="a `git format-patch` file (e.g. a PR's .patch) or a git diff")
    src.add_argument("--commit", help="a commit of the applied tree (--tree)")
    src.add_argument("--ref", help="a commit/tag/branch of a vLLM clone (with --repo)")
    im.add_argument("--repo", help="the vLLM clone --ref refers to")
    im.add_argument("--url", required=True, help="upstream PR or commit URL (Origin)")
    im.add_argument("--reason", required=True, help="why the series carries it")
    im.add_argument("--applied-upstream", help="release or URL where upstream has it "
                    "(Applied-Upstream; default: the URL), e.g. 'v0.30.0, <url>'")
    im.add_argument("--position", type=int, help="1-based position in the series "
                    "(default: after the last upstream/backport entry)")
    im.add_argument("--after", help="insert after this patch file")
    im.add_argument("--name", help="patch file name (default: from the subject)")
    im.add_argument("--subject", help="subject, for a plain diff (or to override)")
    im.add_argument("--author", help="'Name <mail>' (default: the upstream author)")
    im.add_argument("--sdist", help="local sdist of the pinned base (or $VLLM_SDIST)")
    r = sub.add_parser("rebase", help="apply the series to a new base; per-entry report")
    r.add_argument("--onto", required=True,
                   help="a release version (0.24.0), a local sdist, or a git ref (with --vllm-src)")
    r.add_argument("--vllm-src", help="vLLM clone holding the --onto ref")
    r.add_argument("--write", action="store_true",
                   help="write the new pin, refreshed patches and drops (all or nothing)")
    r.add_argument("--work", help="scratch folder (default build/rebase)")
    i = sub.add_parser("image", help="Dockerfile + context overlaying the series on a vLLM image")
    i.add_argument("--base", required=True, help="vLLM image, e.g. vllm/vllm-openai:v0.23.0")
    i.add_argument("--out", default=str(ROOT / "build" / "image"), help="build context folder")
    i.add_argument("--allow-version-mismatch", action="store_true",
                   help="overlay onto a vLLM other than the pinned version")
    c = sub.add_parser("check-entries", help="bisectability: import the tree at every prefix "
                       "of the series (against the installed build's extensions)")
    c.add_argument("--python", default=sys.executable,
                   help="interpreter with the flavor's build installed (default: this one)")
    c.add_argument("--imports-only", action="store_true",
                   help="skip the entries' own tests (their Series-Tests lines)")
    c.add_argument("--skip-full-series-tests", action="store_true",
                   help="skip the last entry's tests at the full series (the installed build "
                        "itself, which the test suite runs them against anyway)")
    for q in (a, e, b, s, im, r, i, c):
        q.add_argument("--tree", default=None, help="applied tree (default build/vllm for the "
                       "default flavor, build/vllm-<flavor> for the others)")
    for q in (a, e, b, s, f, im, r, i, c):
        q.add_argument("--flavor", default=None,
                       help="base flavor: a folder of patches/ (e.g. v0.26.0; default: the one "
                            "patches/default names; for image: the flavor whose version the "
                            "image tag names, else the default)")
    args = p.parse_args(argv)
    try:
        return {"apply": cmd_apply, "export": cmd_export, "build": cmd_build,
                "status": cmd_status, "fetch": cmd_fetch, "import": cmd_import,
                "rebase": cmd_rebase, "image": cmd_image,
                "check-entries": cmd_check_entries}[args.cmd](args)
    except SeriesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
