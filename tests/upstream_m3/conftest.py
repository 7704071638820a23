"""Tests of the flavors whose base ships upstream's MiniMax-M3 (v0.26.0): run by
`make test BASE=v0.26.0` against that flavor's installed CPU build."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "models"))   # minimax_m3_utils (checkpoints, runner)
