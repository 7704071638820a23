"""Entry-by-entry check: the series stopped after each entry still imports.

A series is bisectable when every prefix of it is a working tree. For each
prefix (entries 1..k of the applied tree, k = 1..N) this check builds the
Python package as it is at that commit and imports, in a fresh interpreter:

* every module of the package that entries 1..k add or change (tests aside),
* every model class the package's model registry maps to a module the series
  touches, and every MiniMax-M3 class it registers (the model, at every entry; on a
  base that ships it but cannot import it on this build, from the entry that makes
  it import on, earlier failures being the base's state, noted),
* the tool and reasoning parsers registered under names the series adds;

then runs the entry's own tests (its `Series-Tests` lines: this repository's
tests of that entry's behaviour) against the same package, in the same interpreter
(one vLLM import per prefix).

The package is a shadow of the installed build of the full series (the
interpreter's own ``vllm``): a folder of symlinks to it, in which the files the
later entries add or change are put back to their state at commit k. Compiled
extensions come from the installed build, so an entry that changes C++/CUDA
sources is reported (its Python side is still checked) rather than rebuilt.
Only the base's Python package is shadowed; the check runs no kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import gitutil
from .applier import read_stamp
from .errors import SeriesError
from .series import Series

PACKAGE = "vllm"
# The model classes resolved at every prefix whether or not the series touches their
# module (on a base that ships its own MiniMax-M3, the series patches around it).
MODEL_ARCH_PREFIX = "MiniMaxM3"
COMPILED_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", "CMakeLists.txt")

# Runs in the child interpreter, one per prefix: argv[1] = JSON {"modules": [...],
# "shadow": path, "touched": [...], "arch_prefix": str, "result": path, "tests": [...]}.
# Writes {"failures": {name: error}, "models": [...], "parsers": [...], "pending_models":
# {...}} to the result file; then, when the imports all passed and `tests` is not empty,
# runs pytest on them in the same interpreter (one vLLM import per prefix, not two) and
# exits with pytest's status, its report on stdout.
_CHILD = r"""
import importlib, json, sys, traceback
spec = json.loads(sys.argv[1])
out = {"failures": {}, "models": [], "parsers": [], "pending_models": {}}
import vllm
if not vllm.__file__.startswith(spec["shadow"]):
    out["failures"]["vllm"] = f"imported from {vllm.__file__}, not the shadow package"
for name in spec["modules"]:
    try:
        importlib.import_module(name)
    except BaseException as e:  # an import that exits or raises anything is a failure
        out["failures"][name] = "".join(traceback.format_exception_only(type(e), e)).strip()
touched = set(spec["touched"])
try:
    from vllm.model_executor.models.registry import _VLLM_MODELS
except ModuleNotFoundError as e:  # a base without vLLM's model registry (the tool's tests)
    if e.name not in ("vllm.model_executor", "vllm.model_executor.models",
                      "vllm.model_executor.models.registry"):
        out["failures"]["model registry"] = repr(e)
    _VLLM_MODELS = {}
except Exception as e:
    out["failures"]["model registry"] = repr(e)
    _VLLM_MODELS = {}
for arch, (mod, cls) in sorted(_VLLM_MODELS.items()):
    full = f"vllm.model_executor.models.{mod}" if not mod.startswith("vllm.") else mod
    if full not in touched and not arch.startswith(spec["arch_prefix"]):
        continue
    try:
        getattr(importlib.import_module(full), cls)
        out["models"].append(arch)
    except BaseException as e:
        err = "".join(traceback.format_exception_only(type(e), e)).strip()
        if full in touched:
            out["failures"][f"model {arch}"] = err
        else:  # judged against the other prefixes (see _judge_untouched_models)
            out["pending_models"][arch] = err
for kind, mgr_path in (("tool", "vllm.tool_parsers:ToolParserManager"),
                       ("reasoning", "vllm.reasoning:ReasoningParserManager")):
    mod, _, attr = mgr_path.partition(":")
    try:
        mgr = getattr(importlib.import_module(mod), attr)
    except Exception:
        continue
    lazy = getattr(mgr, "lazy_parsers", {}) or {}
    for pname, target in sorted(lazy.items()):
        pmod = target[0] if isinstance(target, tuple) else str(target).split(":")[0]
        if pmod not in touched:
            continue
        try:
            mgr.get_tool_parser(pname) if kind == "tool" else mgr.get_reasoning_parser(pname)
            out["parsers"].append(f"{kind}:{pname}")
        except BaseException as e:
            out["failures"][f"{kind} parser {pname}"] = "".join(
                traceback.format_exception_only(type(e), e)).strip()
with open(spec["result"], "w") as f:
    json.dump(out, f)
if spec["tests"] and not out["failures"]:
    import pytest
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-x", *spec["tests"]]))
"""


@dataclass
class PrefixResult:
    index: int                  # 1-based: the series applied up to entry `index`
    subject: str
    modules: list[str]
    models: list[str] = field(default_factory=list)
    parsers: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    compiled_sources: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    tests_summary: str = ""
    pending_models: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def module_name(path: str) -> str | None:
    """`vllm/a/b.py` -> `vllm.a.b`; `vllm/a/__init__.py` -> `vllm.a`; None outside the package."""
    if not path.startswith(PACKAGE + "/") or not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if any(p in ("tests", "test") for p in parts):
        return None
    return ".".join(parts)


def installed_package(python: str) -> Path:
    """The folder of the `vllm` package that `python` imports."""
    proc = subprocess.run([python, "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"],
                          capture_output=True, text=True)
    if proc.returncode:
        raise SeriesError(f"{python} cannot import vllm; install the flavor's CPU build first "
                          f"(`make install-cpu`):\n{proc.stderr.strip()[-600:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _shadow(installed: Path, dest: Path) -> Path:
    """A copy of the package as symlinks to the installed files (folders are real)."""
    pkg = dest / PACKAGE
    for dirpath, dirnames, filenames in os.walk(installed):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = Path(dirpath).relative_to(installed)
        (pkg / rel).mkdir(parents=True, exist_ok=True)
        for f in filenames:
            os.symlink(Path(dirpath) / f, pkg / rel / f)
    return pkg


def _put(shadow_root: Path, path: str, data: bytes | None) -> None:
    """Set a package file of the shadow to `data` (None: remove it, and the folders it
    leaves empty: an empty folder would still import, as a namespace package)."""
    target = shadow_root / path
    if target.is_symlink() or target.exists():
        target.unlink()
    if data is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return
    folder, top = target.parent, shadow_root / PACKAGE
    while folder != top and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def _missing_tests(series: Series, tests: list[str]) -> str | None:
    """The failure for `Series-Tests` paths the repository lacks (None when all exist)."""
    missing = [t for t in tests if not (series.root / t.split("::")[0]).exists()]
    if missing:
        return (f"Series-Tests names {', '.join(missing)}, which the repository lacks; "
                f"fix the entry's header")
    return None


def _tests_report(proc: subprocess.CompletedProcess) -> tuple[bool, str]:
    """The child's pytest run: (passed, its summary line, or its last lines on failure)."""
    lines = [l for l in proc.stdout.strip().splitlines() if l.strip()]
    if proc.returncode:
        return False, "\n".join(lines[-25:]) or proc.stderr.strip()[-1500:]
    return True, lines[-1] if lines else proc.stderr.strip()[-300:]


def _last_line(res: PrefixResult) -> str:
    """The pytest summary line of the entry's tests ('' when none ran)."""
    lines = res.tests_summary.strip().splitlines()
    return lines[-1].strip("= ") if lines else ""


def check_entries(series: Series, tree: Path, python: str = sys.executable,
                  log=lambda s: print(s, file=sys.stderr),
                  run_tests: bool = True,
                  tests_at_full_series: bool = True) -> list[PrefixResult]:
    """Check the series at every prefix (see the module docstring).
    ``tests_at_full_series=False`` skips the last entry's tests at prefix N: that prefix
    is the installed build unchanged, which the test suite covers itself."""
    stamp = read_stamp(tree)
    if stamp is None:
        raise SeriesError(f"{tree} is not an applied tree; run `make apply` first")
    if stamp.get("digest") != series.digest(stamp["base_ident"]):
        raise SeriesError(f"{tree} is stale (the series changed since it was applied); "
                          f"run `make apply` first")
    repo = gitutil.open_repo(tree)
    commits = gitutil.commits_since(repo, stamp["base"])
    if len(commits) != len(series.entries):
        raise SeriesError(f"{tree} holds {len(commits)} commits over its base, the series "
                          f"{len(series.entries)} entries; run `make apply --force`")
    installed = installed_package(python)
    results: list[PrefixResult] = []
    chain = [stamp["base"], *commits]
    with tempfile.TemporaryDirectory(prefix="m3-entry-check-") as tmp:
        root = Path(tmp)
        _shadow(installed, root)
        # Going down from the full series: prefix k = the installed build with the
        # changes of entries k+1..N undone.
        per_prefix = {}
        for k in range(len(commits), 0, -1):
            if k < len(commits):
                for status, path in gitutil.changed_files(repo, chain[k], chain[k + 1]):
                    if not path.startswith(PACKAGE + "/"):
                        continue
                    exists = gitutil.resolve(repo, f"{chain[k]}:{path}") is not None
                    _put(root, path, gitutil.show_file(repo, chain[k], path) if exists else None)
            changed = gitutil.changed_files(repo, chain[0], chain[k])
            touched = sorted({m for s, p in changed if s != "D" and (m := module_name(p))})
            entry_changes = gitutil.changed_files(repo, chain[k - 1], chain[k])
            res = PrefixResult(k, series.entries[k - 1].subject, touched,
                               compiled_sources=[p for _, p in entry_changes
                                                 if p.endswith(COMPILED_SUFFIXES)])
            res.tests = series.entries[k - 1].tests
            at_full = k == len(commits) and not tests_at_full_series
            tests = res.tests if run_tests and not at_full else []
            missing = _missing_tests(series, tests)
            result = root / f"prefix-{k}.json"
            spec = json.dumps({"modules": touched, "shadow": str(root / PACKAGE),
                               "touched": touched, "arch_prefix": MODEL_ARCH_PREFIX,
                               "result": str(result), "tests": [] if missing else tests})
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
                PYTHONDONTWRITEBYTECODE="1")
            # cwd: the series repository, where the tests' paths and conftest files are
            proc = subprocess.run([python, "-c", _CHILD, spec], capture_output=True, text=True,
                                  env=env, cwd=series.root)
            try:
                child = json.loads(result.read_text())
            except (OSError, json.JSONDecodeError):
                child = {"failures": {"interpreter": f"exit {proc.returncode}: "
                                                     f"{proc.stderr.strip()[-1200:]}"}}
            res.failures = child.get("failures", {})
            res.models = child.get("models", [])
            res.pending_models = child.get("pending_models", {})
            res.parsers = child.get("parsers", [])
            if missing:
                res.failures["Series-Tests"] = missing
            elif tests and res.ok:
                passed, res.tests_summary = _tests_report(proc)
                if not passed:
                    res.failures["Series-Tests"] = res.tests_summary
            per_prefix[k] = res
            found = [*res.models, *res.parsers]
            log(f"  [{k}/{len(commits)}] {'ok  ' if res.ok else 'FAIL'} {res.subject} "
                f"({len(touched)} modules{'; ' + ', '.join(found) if found else ''}"
                f"{'; tests: ' + tests_line if (tests_line := _last_line(res)) else ''})")
        results = [per_prefix[k] for k in sorted(per_prefix)]
    _judge_untouched_models(results)
    return results


def _judge_untouched_models(results: list[PrefixResult]) -> None:
    """A MiniMax-M3 class whose module the series does not touch (a base that ships
    the model) may not import before the entry that makes it importable (a CPU build
    the base model does not run on): that is the base's state, noted. Once it imports at
    a prefix, failing at a later one is a regression."""
    first_ok: dict[str, int] = {}
    for r in results:
        for arch in r.models:
            first_ok.setdefault(arch, r.index)
    for r in results:
        for arch, err in r.pending_models.items():
            if arch in first_ok and r.index > first_ok[arch]:
                r.failures[f"model {arch}"] = f"imported at entry {first_ok[arch]}, not here: {err}"
            else:
                r.notes.append(f"model {arch} does not import yet (the base's state): {err}")


def report(results: list[PrefixResult]) -> str:
    """Failures per prefix, with what to do."""
    lines = []
    for r in results:
        if r.compiled_sources:
            lines.append(f"note: entry {r.index} ({r.subject}) changes compiled sources "
                         f"({', '.join(r.compiled_sources)}): checked against the full build's "
                         f"extensions")
        for note in r.notes:
            lines.append(f"note: entry {r.index} ({r.subject}): {note[:300]}")
        for what, err in r.failures.items():
            lines.append(f"entry {r.index} ({r.subject}): {what}: {err}")
    return "\n".join(lines)
