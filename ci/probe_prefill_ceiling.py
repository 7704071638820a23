# SPDX-License-Identifier: Apache-2.0
"""Probe: what bounds the block-major prefill attention (8192-token chunk at
8k context, the table's "prefill 8k no slower than dense" row), and what a
dense causal attention written in Triton reaches on this GPU.

Timing probes, not kernels: the block-major kernel's source is patched into a
temporary module of the same package (``_probe_sparse_attn_block_major_*.py``;
the repo's kernel is unchanged) so that its partial outputs, or its query rows,
stay in L2:

  ring<N>   partial outputs of token t stored at row ``t % N`` (N tokens of
            partials, L2-sized): the outputs are wrong, the math and the
            store count are the same -- what the kernel costs when its 512 MiB
            of partial writes never reach HBM;
  nostore   no partial stores at all (masked off by a runtime condition, so
            the math stays): the kernel's math and its reads;
  ring_q    ring<384> and the query rows of token t read at row ``t % 384``.

Each variant: device time of every kernel of the prefill attention launch
(profiler, L2 flushed by a 256 MiB write before each call) and the
CUDA-graph replay of the whole launch.  Also: the merge kernel over 384
tokens' partials (24 MiB) warm in L2, scaled to 8192 tokens; dense causal
attention by torch SDPA (the table's dense) and by a plain Triton flash
attention written here (128 query rows of one head per program, 16 heads
sharing one KV head), with TFLOP/s.  Results: $OUT/probe_prefill_ceiling.json.

  PYTHONPATH=<stub vllm> python ci/probe_prefill_ceiling.py
"""

import importlib
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench_msa import (B, D, HQ, TOPK, Batch, kernel_times, load_kernels, probe_setup,
                       sdpa_dense_prefill)

CTX = CHUNK = 8192


@triton.jit
def dense_tile(q, k_ptr, v_ptr, kn, offs_m, offs_d, stride_kt, m_i, l_i, acc, qk_scale,
               CAUSAL: tl.constexpr):
    """Fold keys ``kn`` into the running softmax of rows ``offs_m`` (base 2);
    CAUSAL masks keys after each row's position (the diagonal tiles only)."""
    k = tl.load(k_ptr + kn[:, None].to(tl.int64) * stride_kt + offs_d[None, :])
    v = tl.load(v_ptr + kn[:, None].to(tl.int64) * stride_kt + offs_d[None, :])
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if CAUSAL:
        s = tl.where(kn[None, :] <= offs_m[:, None], s, float("-inf"))
    return softmax_fold(s, v, m_i, l_i, acc)


@triton.jit
def softmax_fold(s, v, m_i, l_i, acc):
    """Fold scores ``s`` [M, N] (base 2, masked keys -inf; every row sees a key)
    and their values ``v`` [N, D] into the running max ``m_i``, mass ``l_i``
    [M] and output ``acc`` [M, D] (float32); returns them updated."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def dense_causal_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T, sm_scale,
                        stride_qt, stride_qh, stride_kt, stride_ot, stride_oh,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Dense causal attention, chunk == context: q [T, HQ, D], k / v [T, D]
    (one KV head), o [T, HQ, D].  Program (m-tile, head): rows
    ``m0 .. m0 + BLOCK_M`` of that head against keys ``0 .. m0 + BLOCK_M``;
    online softmax in base 2; only the diagonal tiles are masked."""
    mt = tl.program_id(0)
    h = tl.program_id(1)
    m0 = mt * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + offs_m[:, None].to(tl.int64) * stride_qt + h * stride_qh
                + offs_d[None, :])
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(0, m0, BLOCK_N):  # full tiles: no mask
        m_i, l_i, acc = dense_tile(q, k_ptr, v_ptr, n0 + offs_n, offs_m, offs_d, stride_kt,
                                   m_i, l_i, acc, qk_scale, False)
    for n0 in range(m0, m0 + BLOCK_M, BLOCK_N):  # the diagonal tiles
        m_i, l_i, acc = dense_tile(q, k_ptr, v_ptr, n0 + offs_n, offs_m, offs_d, stride_kt,
                                   m_i, l_i, acc, qk_scale, True)
    o = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None].to(tl.int64) * stride_ot + h * stride_oh
             + offs_d[None, :], o.to(o_ptr.dtype.element_ty))


def dense_triton(T, dev, block_m, block_n, warps, stages):
    q = torch.randn(T, HQ, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(T, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    o = torch.empty_like(q)

    def run():
        dense_causal_kernel[(T // block_m, HQ)](
            q, k, v, o, T, D ** -0.5, q.stride(0), q.stride(1), k.stride(0),
            o.stride(0), o.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, D=D,
            num_warps=warps, num_stages=stages)

    run()
    return run, first_rows_error(q, k, v, o)


def first_rows_error(q, k, v, o, n=512):
    """Max |error| of dense causal attention output ``o`` [T, HQ, D] against
    SDPA on its first ``n`` rows (causal: they see only the first n keys of
    the one KV head ``k`` / ``v`` [T, D])."""
    n = min(n, q.shape[0])
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:n].transpose(0, 1).float(), k[:n].float().expand(HQ, n, D),
        v[:n].float().expand(HQ, n, D), is_causal=True).transpose(0, 1)
    return float((o[:n].float() - ref).abs().max())


PATCHES = {
    "ring8": [("ph = (tok64 * HQ + heads) * TOPK + slot",
               "ph = ((tok64 % 128) * HQ + heads) * TOPK + slot")],
    "ring24": [("ph = (tok64 * HQ + heads) * TOPK + slot",
                "ph = ((tok64 % 384) * HQ + heads) * TOPK + slot")],
    "nostore": [("o.to(part_o_ptr.dtype.element_ty), mask=rvalid[:, None] & dmask[None, :])",
                 "o.to(part_o_ptr.dtype.element_ty), "
                 "mask=rvalid[:, None] & dmask[None, :] & (sm_scale < 0.0))"),
                ("tl.store(part_lse_ptr + ph, lse, mask=rvalid)",
                 "tl.store(part_lse_ptr + ph, lse, mask=rvalid & (sm_scale < 0.0))")],
    "ring_q": [("ph = (tok64 * HQ + heads) * TOPK + slot",
                "ph = ((tok64 % 384) * HQ + heads) * TOPK + slot"),
               ("return tl.load(q_ptr + tok.to(tl.int64)[:, None] * stride_qt",
                "return tl.load(q_ptr + (tok % 384).to(tl.int64)[:, None] * stride_qt")],
}


def patched_kernel(attn_mod, name, patches=PATCHES, module="sparse_attn_block_major",
                   kernel="sparse_attn_block_major_kernel"):
    """The kernel ``kernel`` of ``module`` (default: the block-major ``tl``
    kernel) with ``patches[name]`` ((old, new) source replacements, each old
    found once) applied, from a temporary module beside the real one (same
    package, same helpers)."""
    pkg_dir = Path(attn_mod.__file__).parent
    src = (pkg_dir / f"{module}.py").read_text()
    for old, new in patches[name]:
        if src.count(old) != 1:
            raise RuntimeError(f"probe patch {name!r}: {old!r} found {src.count(old)} times")
        src = src.replace(old, new)
    mod_name = f"_probe_{module}_{name}"
    (pkg_dir / f"{mod_name}.py").write_text(src)
    pkg = attn_mod.__name__.rsplit(".", 1)[0]
    return getattr(importlib.import_module(f"{pkg}.{mod_name}"), kernel)


def main():
    out_dir, dev, timer = probe_setup()
    index_block_topk, block_sparse_attention, src = load_kernels()
    attn_mod = sys.modules[block_sparse_attention.__module__]
    res = dict(kernels_from=src, gpu=torch.cuda.get_device_name(0),
               commit=os.environ.get("GIT_COMMIT", "?"), rows=[])

    def add(**r):
        res["rows"].append(r)
        print(json.dumps(r), flush=True)

    bt = Batch([CTX], CHUNK, 0, dev)
    sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                           B, TOPK, num_decode_tokens=0)
    # FLOPs the sparse attention needs: visible (query, key) pairs of the
    # selected blocks x heads x 4 D
    pos = bt.token_pos.long()[:, None]
    blk = sel[:, 0].long()
    keys = torch.where(blk < 0, 0, torch.clamp(pos - blk * B + 1, 0, B)).sum()
    res["sparse_gflop"] = float(keys) * HQ * 4 * D / 1e9
    res["dense_gflop"] = CHUNK * (CHUNK + 1) / 2 * HQ * 4 * D / 1e9
    o = torch.empty_like(bt.q)

    def attn():
        return block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos,
                                      sel, B, D ** -0.5, 0, None, None, None, out=o,
                                      block_major=4)
    real = attn_mod.sparse_attn_block_major_kernel
    attn()
    ref = o.clone()
    for name in ("default", *PATCHES):
        attn_mod.sparse_attn_block_major_kernel = (
            real if name == "default" else patched_kernel(attn_mod, name))
        try:
            o.fill_(float("nan"))
            attn()
            torch.cuda.synchronize()
            same = bool(torch.equal(o, ref))
            kern = kernel_times(attn, timer)
            bm_us = kern.get("sparse_attn_block_major_kernel", {}).get("median_us")
            add(kind="block_major", variant=name, output_equals_default=same,
                graph_us=timer.time_fn(attn), kernels=kern,
                kernel_tflops=res["sparse_gflop"] / bm_us * 1e3 if bm_us else None)
        finally:
            attn_mod.sparse_attn_block_major_kernel = real

    # the merge over L2-resident partials: 384 tokens (24 MiB fp16), warm, and
    # all 8192 tokens' partials (512 MiB) after a flush, as in the launch
    from vllm.models.minimax_m3.common.triton_ops.sparse_attn_merge import (
        sparse_attn_merge_kernel)
    for n, flush in ((384, False), (384, "write"), (CHUNK, "write")):
        part_o = torch.randn((n, HQ, TOPK, D), dtype=torch.float16, device=dev)
        part_lse = torch.randn((n, HQ, TOPK), dtype=torch.float32, device=dev)
        mo = torch.empty((n, HQ, D), dtype=torch.bfloat16, device=dev)
        t = timer.time_fn(lambda: sparse_attn_merge_kernel[(n, HQ)](
            part_o, part_lse, mo, part_lse, mo.stride(0), mo.stride(1), HQ=HQ, S=TOPK,
            S_PAD=TOPK, D=D, D_PAD=D, num_warps=1), flush)
        add(kind="merge", tokens=n, flush=flush, us=t, us_per_8192=t * CHUNK / n,
            gb_s=part_o.numel() * 2 / t / 1e3)
        del part_o, part_lse, mo

    # dense causal attention: torch SDPA (the table's dense) and plain Triton
    t = timer.time_fn(sdpa_dense_prefill(CHUNK, CTX, dev))
    add(kind="dense", impl="sdpa lower-right mask", us=t,
        tflops=res["dense_gflop"] / t * 1e3)
    for bm, bn, warps, stages in ((128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3),
                                  (64, 64, 4, 3), (128, 32, 8, 4)):
        try:
            run, err = dense_triton(CHUNK, dev, bm, bn, warps, stages)
            t = timer.time_fn(run)
            add(kind="dense", impl="triton", block_m=bm, block_n=bn, warps=warps,
                stages=stages, max_err_first_512=err, us=t,
                tflops=res["dense_gflop"] / t * 1e3)
        except Exception as e:  # noqa: BLE001
            add(kind="dense", impl="triton", block_m=bm, block_n=bn, warps=warps,
                stages=stages, error=repr(e)[:300])
    (out_dir / "probe_prefill_ceiling.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
