# SPDX-License-Identifier: Apache-2.0
"""Probe: the best dense causal attention rate Triton reaches on this GPU, the
ceiling that run 37's argument about the 8k prefill target rests on
(``probe_prefill_ceiling.py`` measured 440 TFLOP/s with a plain kernel).

The shape of the table's dense row: an 8192-token chunk at 8k context, 16
query heads sharing one KV head, head_dim 128, bf16.  Kernels, all written
here (a timing probe, not a shipped kernel):

  plain     ``probe_prefill_ceiling.dense_causal_kernel`` (pointer loads, m-tiles
            in launch order: the longest rows run last);
  tma       Hopper tensor-memory-accelerator loads of Q, K and V (host-built
            descriptors), the longest m-tiles first (``REVERSE``), optionally
            ``warp_specialize`` on the key loop (Triton's producer / consumer
            warp groups; a config Triton cannot compile is recorded as an
            error, not fatal).

Each config: CUDA-graph replay time (median, L2 flushed), TFLOP/s on the
causal FLOPs, and the max error of the first 512 rows against SDPA.  torch
SDPA (cuDNN) is timed the same way.  Results: $OUT/probe_triton_dense.json.

  PYTHONPATH=<stub vllm> python ci/probe_triton_dense.py
"""

import json
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from bench_msa import D, HQ, probe_setup, sdpa_dense_prefill
from probe_prefill_ceiling import dense_triton, first_rows_error, softmax_fold

T = 8192


@triton.jit
def tma_tile(q, k_desc, v_desc, n0, offs_m, offs_n, m_i, l_i, acc, qk_scale,
             CAUSAL: tl.constexpr):
    """Fold keys ``n0 .. n0 + BLOCK_N`` (TMA loads) into the running softmax of
    rows ``offs_m`` (base 2); CAUSAL masks keys after each row's position."""
    k = k_desc.load([n0, 0])
    v = v_desc.load([n0, 0])
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if CAUSAL:
        s = tl.where((n0 + offs_n)[None, :] <= offs_m[:, None], s, float("-inf"))
    return softmax_fold(s, v, m_i, l_i, acc)


@triton.jit
def dense_causal_tma_kernel(q_desc, k_desc, v_desc, o_ptr, sm_scale, stride_ot, stride_oh,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                            REVERSE: tl.constexpr, WS: tl.constexpr):
    """Dense causal attention, chunk == context, one KV head: q [T, HQ * D]
    (descriptor blocks [BLOCK_M, D] at column ``head * D``), k / v [T, D]
    (blocks [BLOCK_N, D]), o [T, HQ, D].  Program (m-tile, head); REVERSE:
    program 0 takes the last m-tile (the most keys), so the short rows fill
    the tail.  BLOCK_M must be a multiple of BLOCK_N."""
    mt = tl.program_id(0)
    if REVERSE:
        mt = tl.num_programs(0) - 1 - mt
    h = tl.program_id(1)
    m0 = mt * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = q_desc.load([m0, h * D])
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in tl.range(0, m0, BLOCK_N, warp_specialize=WS):  # full tiles: no mask
        m_i, l_i, acc = tma_tile(q, k_desc, v_desc, n0, offs_m, offs_n, m_i, l_i, acc,
                                 qk_scale, False)
    for n0 in range(m0, m0 + BLOCK_M, BLOCK_N):  # the diagonal tiles
        m_i, l_i, acc = tma_tile(q, k_desc, v_desc, n0, offs_m, offs_n, m_i, l_i, acc,
                                 qk_scale, True)
    o = acc / l_i[:, None]
    offs_d = tl.arange(0, D)
    tl.store(o_ptr + offs_m[:, None].to(tl.int64) * stride_ot + h * stride_oh
             + offs_d[None, :], o.to(o_ptr.dtype.element_ty))


def dense_tma(n, dev, block_m, block_n, warps, stages, reverse, ws, dtype=torch.bfloat16):
    """(run, max error of the first 512 rows against SDPA) for one config."""
    q = torch.randn(n, HQ, D, device=dev, dtype=dtype)
    k = torch.randn(n, D, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    o = torch.empty_like(q)
    q_desc = TensorDescriptor.from_tensor(q.view(n, HQ * D), [block_m, D])
    k_desc = TensorDescriptor.from_tensor(k, [block_n, D])
    v_desc = TensorDescriptor.from_tensor(v, [block_n, D])

    def run():
        dense_causal_tma_kernel[(n // block_m, HQ)](
            q_desc, k_desc, v_desc, o, D ** -0.5, o.stride(0), o.stride(1),
            BLOCK_M=block_m, BLOCK_N=block_n, D=D, REVERSE=reverse, WS=ws,
            num_warps=warps, num_stages=stages)

    run()
    return run, first_rows_error(q, k, v, o)


CONFIGS = [  # (block_m, block_n, warps, stages)
    (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3)]


def main():
    out_dir, dev, timer = probe_setup()
    dense_gflop = T * (T + 1) / 2 * HQ * 4 * D / 1e9
    res = dict(gpu=torch.cuda.get_device_name(0), commit=os.environ.get("GIT_COMMIT", "?"),
               triton=triton.__version__, tokens=T, dense_gflop=dense_gflop, rows=[])

    def add(**r):
        res["rows"].append(r)
        print(json.dumps(r), flush=True)

    t = timer.time_fn(sdpa_dense_prefill(T, T, dev))
    add(impl="sdpa", us=t, tflops=dense_gflop / t * 1e3)
    for bm, bn, warps, stages in CONFIGS[:3]:
        run, err = dense_triton(T, dev, bm, bn, warps, stages)
        t = timer.time_fn(run)
        add(impl="plain", block_m=bm, block_n=bn, warps=warps, stages=stages, err=err, us=t,
            tflops=dense_gflop / t * 1e3)
    for ws in (False, True):
        for reverse in ((False, True) if not ws else (True,)):
            for bm, bn, warps, stages in CONFIGS:
                cfg = dict(impl="tma", reverse=reverse, warp_specialize=ws, block_m=bm,
                           block_n=bn, warps=warps, stages=stages)
                try:
                    run, err = dense_tma(T, dev, bm, bn, warps, stages, reverse, ws)
                    t = timer.time_fn(run)
                    add(**cfg, err=err, us=t, tflops=dense_gflop / t * 1e3)
                except Exception as e:  # noqa: BLE001
                    add(**cfg, error=repr(e)[:300])
    (out_dir / "probe_triton_dense.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
