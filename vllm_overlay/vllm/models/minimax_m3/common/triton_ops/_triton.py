# SPDX-License-Identifier: Apache-2.0
"""Real ``triton`` import for the MiniMax-M3 MSA kernels.

``vllm.triton_utils`` hands out a placeholder module on platforms where vLLM
thinks Triton is unusable (e.g. the CPU build), which would make these kernels
unusable under ``TRITON_INTERPRET=1``.  The kernels therefore import the real
package themselves and only fall back to vLLM's placeholder when Triton is not
installed at all (then every launch raises a clear error).
"""

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    from vllm.triton_utils import tl, triton  # placeholder module

    HAS_TRITON = False

__all__ = ["triton", "tl", "HAS_TRITON"]
