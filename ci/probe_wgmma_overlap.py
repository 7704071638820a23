# SPDX-License-Identifier: Apache-2.0
"""Probe (no GPU): does Triton overlap a step's score MMA with the previous
step's softmax when the loop is rotated?

The block-major prefill kernel walks steps of 64 query rows against one held
128-key block: QK^T (8 wgmma), row max, exponentials, row sum, PV (8 wgmma),
store.  Each dot is waited for right after it is issued, so within a program
the tensor cores and the exponentials take turns (run 40: fewer instructions
per step did not make the kernel faster).  Rotated, each iteration issues the
*next* step's QK^T before the current step's softmax.  This compiles a
minimal step loop both ways for sm_90 (Triton front end, ptxas from the
triton wheel) and reports, from the SASS, how many exponentials (MUFU.EX2)
issue between the loop's first QK wgmma and the wait that ends it, and the
registers ptxas needs.  Results on stdout and in $OUT/probe_wgmma_overlap.json.
It borrows ``tests/kernels/sm90_compile.py``'s helpers, which import the
kernels: run it with the CPU test venv (``make install-cpu``).

  .venv/bin/python ci/probe_wgmma_overlap.py
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from sm90_compile import TARGET, resource_usage  # noqa: E402


@triton.jit
def step_loop(q_ptr, k_ptr, v_ptr, o_ptr, N, ROTATE: tl.constexpr):
    """Steps of 64 query rows (q [N * 64, 128]) against one block of 128
    keys (k, v [128, 128], loaded once); o [N * 64, 128] (the first step's
    rows are not stored).  ROTATE: step i + 1's scores are issued before step
    i's softmax."""
    offs_m = tl.arange(0, 64)
    offs_n = tl.arange(0, 128)
    offs_d = tl.arange(0, 128)
    kt = tl.trans(tl.load(k_ptr + offs_n[:, None] * 128 + offs_d[None, :]))
    v = tl.load(v_ptr + offs_n[:, None] * 128 + offs_d[None, :])
    s = tl.dot(tl.load(q_ptr + offs_m[:, None] * 128 + offs_d[None, :]), kt)
    for i in range(1, N):
        rows = i * 64 + offs_m
        if ROTATE:
            s_next = tl.dot(tl.load(q_ptr + rows[:, None] * 128 + offs_d[None, :]), kt)
        m = tl.max(s, axis=1)
        p = tl.exp2(s - m[:, None])
        o = tl.dot(p.to(tl.bfloat16), v) * (1.0 / tl.sum(p, axis=1))[:, None]
        tl.store(o_ptr + (rows[:, None] - 64) * 128 + offs_d[None, :], o.to(tl.bfloat16))
        if ROTATE:
            s = s_next
        else:
            s = tl.dot(tl.load(q_ptr + rows[:, None] * 128 + offs_d[None, :]), kt)


def sass_lines(cubin: bytes) -> list[str]:
    """The cubin's SASS instructions (opcode and operands), via the triton
    wheel's cuobjdump."""
    from triton.backends.nvidia.compiler import get_ptxas
    cuobjdump = Path(get_ptxas(90).path).with_name("cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        Path(path).write_bytes(cubin)
        out = subprocess.run([str(cuobjdump), "-sass", path], capture_output=True,
                             text=True, check=True).stdout
    return [ln.split("*/", 1)[1].split(";")[0].strip() for ln in out.splitlines()
            if ln.strip().startswith("/*") and "*/" in ln and ";" in ln]


def overlap(sass: list[str]) -> dict:
    """In the loop body (after the first wait): the exponentials issued while a
    group of wgmma is in flight (between its first HGMMA and the next
    WARPGROUP.DEPBAR), and in all."""
    first_wait = next(i for i, ln in enumerate(sass) if "WARPGROUP.DEPBAR" in ln)
    body = sass[first_wait + 1:]
    in_flight, exps, pending = 0, 0, False
    for ln in body:
        if ln.startswith("HGMMA") or " HGMMA" in ln:
            pending = True
        elif "WARPGROUP.DEPBAR" in ln:
            pending = False
        elif "MUFU.EX2" in ln:
            exps += 1
            in_flight += pending
    return dict(ex2_in_loop=exps, ex2_under_wgmma=in_flight)


def main():
    sig = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", o_ptr="*bf16", N="i32",
               ROTATE="constexpr")
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    results = []
    for rotate in (False, True):
        c = triton.compile(ASTSource(fn=step_loop, signature=sig,
                                     constexprs=dict(ROTATE=rotate), attrs=attrs),
                           target=TARGET, options=dict(num_warps=4, num_stages=1))
        row = dict(rotate=rotate, **overlap(sass_lines(c.asm["cubin"])),
                   ptxas=resource_usage(c.asm["ptx"]))
        results.append(row)
        print(row, flush=True)
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_wgmma_overlap.json").write_text(
        json.dumps(dict(triton=triton.__version__, target="sm_90", results=results), indent=1))


if __name__ == "__main__":
    main()
