# SPDX-License-Identifier: Apache-2.0
"""Small host-side helpers shared by the MSA kernel wrappers (no device syncs)."""

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import torch

from .. import envs
from ._triton import HAS_GDC, HAS_TRITON


_COUNTERS: dict[tuple[torch.device, str], torch.Tensor] = {}


# Launch-shape overrides (benchmarks only): the op whose launches they change ->
# its overrides. Each kernel wrapper reads its own op's (``launch_tune``); the
# keys each op takes are listed in its wrapper's docstring ("Launch overrides").
LAUNCH_OVERRIDE_OPS = ("index", "attention", "score_attend")
_NO_OVERRIDES: Mapping[str, Any] = MappingProxyType({})
_LAUNCH_OVERRIDES: contextvars.ContextVar[Mapping[str, Mapping[str, Any]]] = (
    contextvars.ContextVar("minimax_m3_msa_launch_overrides", default=_NO_OVERRIDES))


@contextlib.contextmanager
def launch_overrides(op: str, **overrides: Any) -> Iterator[None]:
    """Benchmark-only hook: inside the block, ``op``'s kernel wrapper
    (``"index"``: ``index_block_topk``, ``"attention"``: ``block_sparse_attention``,
    ``"score_attend"``: ``score_attend_decode``) launches with ``overrides``
    in place of its measured defaults (e.g. ``launch_overrides("attention",
    sm90=False)``). Nested blocks add to the enclosing ones' overrides; the
    product never sets any."""
    if op not in LAUNCH_OVERRIDE_OPS:
        raise ValueError(f"launch_overrides: op must be one of {LAUNCH_OVERRIDE_OPS}, "
                         f"got {op!r}")
    current = _LAUNCH_OVERRIDES.get()
    merged = {**current, op: MappingProxyType({**current.get(op, {}), **overrides})}
    token = _LAUNCH_OVERRIDES.set(MappingProxyType(merged))
    try:
        yield
    finally:
        _LAUNCH_OVERRIDES.reset(token)


def launch_tune(op: str) -> Mapping[str, Any]:
    """``op``'s launch overrides (``launch_overrides``); empty outside benchmarks."""
    return _LAUNCH_OVERRIDES.get().get(op, _NO_OVERRIDES)


def arrival_counters(device: torch.device, purpose: str, n: int) -> torch.Tensor:
    """A persistent zeroed int32 buffer of >= n arrival counters for a
    "last program finishes the job" kernel (fused top-k select, fused split
    merge); those kernels leave it zeroed, so it stays valid across launches
    and CUDA-graph replays.  One buffer per device and purpose, shared by all
    layers: launches that use it must not run concurrently on two streams.  Grown only
    outside CUDA-graph capture: a buffer made during capture would live in the
    graph's memory pool."""
    key = (torch.device(device), purpose)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if key[0].type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"MSA {purpose}: {n} arrival counters needed during CUDA-graph "
                f"capture, {0 if buf is None else buf.numel()} allocated before it; "
                "run one eager step of the largest batch first (vLLM's profile run does)."
            )
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


# the longest row of block scores that the decode attention ranks itself
# (``block_sparse_attention(..., select_topk=k)`` over ``index_block_topk(...,
# return_scores=True)``); the select kernel ranks rows up to 64 blocks too (8k
# context at 128-token blocks); longer rows go through the top-k ids
SELECT_MAX_BLOCKS = 64


def next_pow2(x: int) -> int:
    """Smallest power of two >= max(x, 1)."""
    x = max(int(x), 1)
    return 1 << (x - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def largest_pow2_divisor(x: int, cap: int) -> int:
    """Largest power of two that divides ``x`` and is <= ``cap``."""
    p = 1
    while p * 2 <= cap and x % (p * 2) == 0:
        p *= 2
    return p


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class GpuArch(NamedTuple):
    """What the dispatch needs to know of a GPU: ``name`` "sm_90" (CUDA, from
    the compute capability) or "gfx942" (ROCm, the gcnArchName without its
    feature flags), and its streaming multiprocessors (CUs on ROCm)."""

    name: str
    units: int

    @property
    def rocm(self) -> bool:
        return self.name.startswith("gfx")


@functools.lru_cache(maxsize=None)
def _cuda_device_arch(device_index: int) -> GpuArch:
    props = torch.cuda.get_device_properties(device_index)
    if torch.version.hip is not None:
        name = props.gcnArchName.split(":")[0]
    else:
        name = f"sm_{props.major}{props.minor}"
    return GpuArch(name, props.multi_processor_count)


def device_arch(device: torch.device) -> GpuArch | None:
    """The GPU behind ``device``; None off GPU (CPU, the interpreter).  THE
    one place the kernel wrappers learn the hardware (every arch-dependent
    choice goes through it: ``num_sms``, ``pdl_supported``, ``is_sm90``,
    ``is_rocm``), so tests can stand in a ROCm or H200 device here."""
    if device.type != "cuda":
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_device_arch(idx)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors (CUs on ROCm) of ``device``; 4 off-GPU."""
    arch = device_arch(device)
    return 4 if arch is None else arch.units


def is_sm90(device: torch.device) -> bool:
    """An H100/H200 (sm_90) CUDA device: the Gluon kernels' only target.
    (ROCm reports gfx942 as compute capability 9.4: never sm_90 here.)"""
    arch = device_arch(device)
    return arch is not None and arch.name == "sm_90"


def is_rocm(device: torch.device) -> bool:
    """An AMD GPU (ROCm/HIP): launches take the ROCm tile configs."""
    arch = device_arch(device)
    return arch is not None and arch.rocm


# H200 (docs/decisions/0003-decode-attention-launches.md): the decode chain with PDL
# takes 16.4 vs 19.0 us at batch 1 x 8k, 20.6 vs 23.3 at 1 x 32k, 26.6 vs 27.7
# at 8 x 8k; even at 16 and within +-2% at 32 (where the chain is bytes-bound)
PDL_MAX_TOKENS = 8


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch (``griddepcontrol``, NVIDIA-only inline
    PTX that the HIP backend cannot compile) needs a CUDA sm90+ device (never
    ROCm), compiled kernels (not the interpreter) and a Triton with grid
    dependency control; the kernels compile it in only under ``PDL=True``."""
    arch = device_arch(device)
    if arch is None or arch.rocm or interpreting() or not HAS_GDC:
        return False
    return int(arch.name[3:-1] or 0) >= 9


def use_pdl(device: torch.device, tune: Mapping[str, Any], tokens: int) -> bool:
    """PDL for a launch over ``tokens`` query tokens: ``tune["pdl"]`` (a
    launch override, benchmarks; ignored where unsupported) if given, else
    ``VLLM_MINIMAX_M3_PDL``, else ``tokens <= PDL_MAX_TOKENS``."""
    want = tune.get("pdl") if "pdl" in tune else envs.VLLM_MINIMAX_M3_PDL
    if want is None:
        want = tokens <= PDL_MAX_TOKENS
    return bool(want) and pdl_supported(device)


def check_triton(device: torch.device) -> None:
    if not HAS_TRITON:
        raise RuntimeError(
            "MiniMax-M3 MSA Triton kernels need the `triton` package; install it "
            "or use the PyTorch reference sparse backend."
        )
    if device_arch(device) is None and not interpreting():
        raise RuntimeError(
            f"MiniMax-M3 MSA Triton kernels got tensors on {device}; they run on "
            "CUDA/ROCm devices, or on CPU only with TRITON_INTERPRET=1 set before "
            "triton is imported. Use the PyTorch reference sparse backend otherwise."
        )


def check_int32_vector(name: str, t: torch.Tensor, n: int) -> None:
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must have shape [{n}] (one entry per query token), got {tuple(t.shape)}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}; convert it with .to(torch.int32)")


def check_block_table(block_table: torch.Tensor) -> None:
    if block_table.dim() != 2 or block_table.dtype != torch.int32:
        raise ValueError(
            f"block_table must be a 2-D int32 tensor [num_requests, max_pages], got "
            f"shape {tuple(block_table.shape)} dtype {block_table.dtype}"
        )
    if block_table.stride(1) != 1:
        raise ValueError("block_table must be contiguous in its last dim; pass block_table.contiguous()")
