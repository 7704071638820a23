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

# grid dependency control (programmatic dependent launch, sm90+): the kernels
# reach it as ``tl_cuda.gdc_wait()`` / ``tl_cuda.gdc_launch_dependents()``
# inside ``if PDL:`` (a constexpr, False off CUDA and in the interpreter)
try:
    from triton.language.extra import cuda as tl_cuda

    HAS_GDC = hasattr(tl_cuda, "gdc_wait") and hasattr(tl_cuda, "gdc_launch_dependents")
except Exception:  # pragma: no cover - depends on the install
    tl_cuda = None
    HAS_GDC = False

__all__ = ["triton", "tl", "tl_cuda", "HAS_TRITON", "HAS_GDC"]

# Launch arguments that place a launch's tokens in the batch: its first and end
# token (``tok_base`` / ``tok_end``), its token or pair count (``T`` / ``P``) and
# the token -> request / position maps it reads from (``req_ptr`` / ``pos_ptr``,
# int32, sliced at the part's first token). A batch's mix of decode, prefill and
# dense-prefix parts gives them any value, and Triton keys a compiled variant on
# each (an integer of 1 or a multiple of 16, a 16-byte-aligned pointer): on the
# H100 (2026-12-08) a tiny model's mixed batches still compiled variants inside
# requests that the start-up warm-up's plan had not made. Unspecialised, one
# variant serves every placement; they are bounds and row loads, not tile shapes.
BATCH_PLACEMENT = dict(do_not_specialize=("tok_base", "tok_end", "T", "P"),
                       do_not_specialize_on_alignment=("req_ptr", "pos_ptr"))
