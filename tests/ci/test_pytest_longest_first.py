"""ci/pytest_longest_first.py: the order in which xdist's workers receive test files."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "pytest_longest_first", REPO / "ci" / "pytest_longest_first.py")
plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin)


def test_files_are_ordered_longest_first_and_kept_whole():
    ids = ["a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2[x]", "d.py::t1"]
    order = plugin.longest_first(ids, {"a.py": 5.0, "c.py": 50.0, "b.py": 20.0})
    assert [ids[i] for i in order] == ["c.py::t1", "c.py::t2[x]", "b.py::t1",
                                       "a.py::t1", "a.py::t2", "d.py::t1"]


def test_unknown_files_keep_collection_order_after_the_known_ones():
    ids = ["z.py::t", "y.py::t", "x.py::t"]
    assert plugin.longest_first(ids, {}) == [0, 1, 2]
    assert plugin.longest_first(ids, {"x.py": 1.0}) == [2, 0, 1]


def test_missing_or_broken_table_means_no_reordering(tmp_path):
    assert plugin.load_table(tmp_path / "absent.json") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert plugin.load_table(bad) == {}
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"seconds_per_file": {"a.py": 3}}))
    assert plugin.load_table(good) == {"a.py": 3.0}


def test_the_committed_table_names_the_bisect_test_and_existing_files():
    table = plugin.load_table()
    assert table, "ci/test_durations.json is missing: make test ... --record-durations"
    assert "tests/series/test_entry_check.py" in table
    missing = [f for f in table if not (REPO / f).is_file()]
    assert not missing, f"files gone from the repo, drop them from the table: {missing}"
