"""The pinned vLLM base, recorded in one place: patches/base.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import SeriesError


@dataclass(frozen=True)
class Artifact:
    project: str   # distribution name on the package index
    file: str      # exact file name
    sha256: str


@dataclass(frozen=True)
class BasePin:
    version: str
    commit: str          # tag commit (a prefix is enough)
    released: str        # release date, YYYY-MM-DD (the base commit's date for sdist bases)
    sdist: Artifact
    wheels: dict[str, Artifact]   # target ("cuda", "cpu") -> wheel
    path: Path

    @classmethod
    def load(cls, path: Path) -> "BasePin":
        try:
            data = json.loads(path.read_text())
            return cls(
                version=data["version"],
                commit=data["commit"],
                released=data["released"],
                sdist=Artifact(**data["sdist"]),
                wheels={k: Artifact(**v) for k, v in data["wheels"].items()},
                path=path,
            )
        except FileNotFoundError:
            raise SeriesError(f"{path}: the base pin is missing; restore it from git "
                              f"(`git checkout -- {path.name}`)") from None
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise SeriesError(f"{path}: malformed base pin ({e}); it needs version, "
                              "commit, sdist{project,file,sha256} and wheels") from None

    def wheel(self, target: str) -> Artifact:
        if target not in self.wheels:
            raise SeriesError(f"unknown build target {target!r}; choose one of "
                              f"{', '.join(sorted(self.wheels))} (e.g. `make build TARGET=cpu`)")
        return self.wheels[target]
