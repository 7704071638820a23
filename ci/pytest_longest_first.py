"""pytest plugin: hand test files to pytest-xdist's workers longest first.

`make test` runs each flavor's suite in two processes with `--dist loadfile`: a worker
gets whole files. pytest-xdist hands them out by number of tests, most first, which put
the series' bisect test (tests/series/test_entry_check.py: 9 tests, 7-10 minutes) and
several engine-test files near the end, and one worker finished minutes after the other.
This plugin orders the files by their measured time, longest first (LPT scheduling), and
`--no-loadscope-reorder` makes xdist keep that order.

The times are ``ci/test_durations.json``: seconds per test file (setup, call and
teardown summed) as measured on CI's two cores, one table for all flavors. Files not
listed (new ones) run last, in collection order. Refresh the table after adding or
changing a slow test:

    make test BASE=v0.23.0 PYTEST_ARGS="-n 2 --dist loadfile --no-loadscope-reorder \\
        -p ci.pytest_longest_first --record-durations"

which merges the run's per-file times into the table (the other files keep theirs).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("test_durations.json")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _read(path: Path) -> dict:
    """The table file as written (empty when missing or unreadable)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def load_table(path: Path = TABLE) -> dict[str, float]:
    """Seconds per test file; empty when the table is missing or unreadable."""
    return {k: float(v) for k, v in _read(path).get("seconds_per_file", {}).items()}


def longest_first(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """Indices of ``nodeids`` with whole files ordered by ``seconds``, longest first;
    files not in ``seconds`` after the known ones; order kept within a file and
    between files of equal (or unknown) time."""
    first_seen: dict[str, int] = {}
    for nodeid in nodeids:
        first_seen.setdefault(_file_of(nodeid), len(first_seen))

    def key(i: int):
        f = _file_of(nodeids[i])
        return (f not in seconds, -seconds.get(f, 0.0), first_seen[f], i)

    return sorted(range(len(nodeids)), key=key)


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help=f"merge this run's seconds per test file into {TABLE.name}")


def pytest_collection_modifyitems(session, config, items):
    seconds = load_table()
    if seconds:
        order = longest_first([it.nodeid for it in items], seconds)
        items[:] = [items[i] for i in order]


class _Recorder:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[_file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        table = _read(TABLE)
        merged = dict(table.get("seconds_per_file", {}))
        merged.update({f: round(s, 1) for f, s in self.seconds.items()})
        table["seconds_per_file"] = dict(sorted(merged.items(), key=lambda kv: -kv[1]))
        TABLE.write_text(json.dumps(table, indent=1) + "\n")


def pytest_configure(config):
    # the controller records (under xdist it receives every worker's reports)
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(), "longest-first-recorder")
