# SPDX-License-Identifier: Apache-2.0
"""Kernel tests: run Triton kernels in the interpreter when there is no GPU.

TRITON_INTERPRET must be set before the kernel modules are imported (Triton
decides between compiled and interpreted kernels when ``@triton.jit`` runs),
so it is set here, at collection time.  With a GPU the kernels are compiled.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

    import sys

    _tl = sys.modules.get("triton.language")
    if _tl is not None and type(_tl.standard.max).__name__ != "InterpretedFunction":
        # triton.language's own @jit helpers (tl.max, tl.sum, ...) were made
        # before TRITON_INTERPRET was set, so every interpreted kernel would
        # fail with "Cannot call @triton.jit'd outside of the scope of a kernel"
        raise RuntimeError(
            "triton was imported before tests/kernels/conftest.py set "
            "TRITON_INTERPRET=1: a test module collected earlier imports triton "
            "(directly, or through transformers / vllm) at module level; import "
            "them inside its tests instead."
        )
