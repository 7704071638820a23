# SPDX-License-Identifier: Apache-2.0
"""Compile the MSA kernels for a GPU target on a machine without a GPU: the
machinery shared by ``sm90_compile.py`` (NVIDIA sm_90, with the triton
wheel's ptxas) and ``rocm_compile.py`` (AMD gfx942 / gfx950, with the triton
wheel's LLVM AMDGPU backend and LLD).  Both run in a process without
``TRITON_INTERPRET`` (the kernels must be ``JITFunction``s, not interpreted).
"""

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

# what a launch specializes on real tensors: 16-byte aligned pointers, and the cache
# strides (multiples of head_dim, itself a multiple of 16) divisible by 16 -- without
# it Triton can neither vectorize the paged K/V loads nor make them cp.async copies
ALIGNED_INTS = ("stride_qt", "stride_qh", "stride_cp", "stride_ckv", "stride_cs", "stride_ch",
                "stride_kp", "stride_ks")

SM90 = GPUTarget("cuda", 90, 32)
# the AMD Instinct targets of the seeds: gfx942 (MI300X, MI325X; CDNA3) and gfx950
# (MI355X; CDNA4), wavefronts of 64
ROCM_TARGETS = {"gfx942": GPUTarget("hip", "gfx942", 64),
                "gfx950": GPUTarget("hip", "gfx950", 64)}
# LDS (shared memory) per workgroup: 64 KiB on CDNA3, 160 KiB on CDNA4
LDS_LIMITS = {"gfx942": 64 << 10, "gfx950": 160 << 10}


def kernel_source(kernel, pointers: dict, constexprs: dict):
    """The compile source of ``kernel`` as a launch would specialize it:
    ``pointers`` maps pointer parameters to their Triton types ("*bf16"),
    other non-constexpr parameters are i32 (``sm_scale`` fp32); constexprs
    left out take their defaults, as at a launch."""
    constexprs = dict({p.name: p.default for p in kernel.params
                       if p.is_constexpr and p.has_default}, **constexprs)
    sig = {n: ("constexpr" if n in constexprs
               else pointers.get(n, "fp32" if n == "sm_scale" else "i32"))
           for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n not in constexprs and (n in pointers or n in ALIGNED_INTS)}
    source = GluonASTSource if kernel.is_gluon() else ASTSource
    return source(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)


def compile_source(source, target: GPUTarget, options: dict):
    return triton.compile(source, target=target, options=options)


_AMD_META = ("vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count",
             "private_segment_fixed_size")


def amd_resource_usage(compiled) -> dict:
    """Registers, spills and memory of an AMD code object, from the kernel
    descriptor metadata in the AMDGCN assembly (what ``amdgpu-objdump`` and
    the ROCm runtime read): VGPRs (arch + accumulation AGPRs), SGPRs, spilled
    VGPRs / SGPRs (``*_spill_count``: VGPRs spill to scratch memory, SGPRs to
    VGPR lanes), scratch bytes per lane, and LDS bytes per workgroup (Triton's
    ``shared``)."""
    asm = compiled.asm["amdgcn"]
    usage = {}
    for key in _AMD_META:
        m = re.search(r"\." + key + r":\s+(\d+)", asm)
        if m is None:
            raise RuntimeError(f"no .{key} in the AMDGCN metadata of {compiled.metadata.name}")
        usage[key] = int(m.group(1))
    usage["lds"] = int(compiled.metadata.shared)
    return usage


def describe_amd(usage: dict) -> str:
    return (f"LDS {usage['lds']} B, {usage['vgpr_count']} VGPRs ({usage['agpr_count']} AGPRs), "
            f"{usage['sgpr_count']} SGPRs, spills {usage['vgpr_spill_count']} VGPRs "
            f"{usage['sgpr_spill_count']} SGPRs, scratch {usage['private_segment_fixed_size']} B")

