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
