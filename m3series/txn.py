"""Write a set of files under the series root together, or none of them.

Everything is staged first (new contents written next to nothing the user
sees); then each target is swapped in, its previous bytes kept aside. If any
step fails, the swapped targets are put back as they were and the error is
re-raised, so a failure midway leaves the series exactly as it was. Used by
`import` and `rebase --write`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def _checkpoint(step: int) -> None:
    """Called before each swap step (tests replace it to inject a failure midway)."""


def write_together(root: Path, writes: dict[str, bytes], deletes: list[str] = ()) -> list[str]:
    """Write `writes` (rel path -> bytes) and delete `deletes` under root, all or nothing.

    Files whose bytes are already equal are skipped. Returns the changed rel paths
    (deletions suffixed with " (removed)").
    """
    writes = {rel: data for rel, data in writes.items()
              if not ((root / rel).is_file() and (root / rel).read_bytes() == data)}
    deletes = [rel for rel in deletes if (root / rel).exists() and rel not in writes]
    if not writes and not deletes:
        return []
    work = root / "build" / f".txn-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    staged, backup = work / "new", work / "old"
    try:
        for rel, data in writes.items():          # stage: nothing visible changes yet
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            (staged / rel).write_bytes(data)
        done: list[tuple[str, bool, bool]] = []     # (rel, had an old file, is a write)
        try:
            ops = [(rel, True) for rel in writes] + [(rel, False) for rel in deletes]
            for step, (rel, is_write) in enumerate(ops):
                _checkpoint(step)
                target = root / rel
                had_old = target.exists()
                if had_old:
                    (backup / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(target, backup / rel)
                done.append((rel, had_old, is_write))
                if is_write:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staged / rel, target)
        except BaseException:
            for rel, had_old, is_write in reversed(done):   # roll back, newest first
                target = root / rel
                if is_write and target.exists():
                    target.unlink()
                if had_old:
                    os.replace(backup / rel, target)
            raise
        for rel in deletes:                         # tidy now-empty overlay folders
            parent = (root / rel).parent
            while parent != root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
    finally:
        shutil.rmtree(work, ignore_errors=True)
        try:
            (root / "build").rmdir()     # only if we created it and it is empty
        except OSError:
            pass
    return sorted(writes) + [f"{rel} (removed)" for rel in deletes]
