# SPDX-License-Identifier: Apache-2.0
"""Which flavor's CPU build is installed, for the benchmark smoke tests that run the real
engine: read from vLLM's metadata, because importing vllm at collection time would import
triton before tests/kernels/conftest.py sets TRITON_INTERPRET."""

import importlib.metadata

import pytest


def installed_vllm() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def series_side_or_skip() -> str:
    """The side that runs the series' MSA path on this install: C on the v0.23.0 flavor,
    B on v0.26.0 (VLLM_MINIMAX_M3_MSA=series); skips the module elsewhere."""
    version = installed_vllm()
    side = {"0.23.": "C", "0.26.": "B"}.get((version or "")[:5])
    if side is None:
        pytest.skip(f"needs a flavor's CPU build, vLLM 0.23.x or 0.26.x (make install-cpu); "
                    f"found vllm {version}", allow_module_level=True)
    return side
