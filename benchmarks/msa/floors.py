# SPDX-License-Identifier: Apache-2.0
"""Floors and ceilings: copy bandwidth, launch floor, what the L2 flush costs, the
read ceiling of a decode step's bytes, the latency floor and L2 read bandwidth."""

import functools
import os

import torch

from .checks import Batch
from .harness import B, D, DIDX, HIDX, HQ, PAGE, TOPK


@functools.lru_cache(maxsize=None)
def read_once_kernel():
    """A Triton kernel that reads its buffer once: each program sums STEPS
    loads of BLOCK elements (16-byte vectors) and writes the BLOCK sums (the
    flush probe's and the read-ceiling sweep's plain read)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _read_once(x_ptr, out_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        pid = tl.program_id(0)
        base = x_ptr + pid.to(tl.int64) * BLOCK * STEPS
        acc = tl.zeros([BLOCK], tl.float32)
        for i in tl.static_range(STEPS):
            acc += tl.load(base + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
        tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)

    return _read_once


def flush_probe(timer, dev, bw, sizes_mib=(8, 32, 64, 256)):
    """What the L2 flush itself costs a kernel that only reads: a Triton
    kernel reads a buffer of each size once (16-byte vector loads, one
    program per 64 KiB), timed after the write flush, after the read flush and
    warm.  With the write flush the time grows by the write-back of the dirty
    lines the reads evict (at most the L2's size); ``floor_us`` = size / copy
    bandwidth."""
    _read_once = read_once_kernel()

    res = dict(l2_bytes=torch.cuda.get_device_properties(dev).L2_cache_size)
    for mib in sizes_mib:
        row = dict(floor_us=(mib << 20) / bw * 1e6)
        # bf16: 64 KiB per program in 8 loads (8 warps), or 16 KiB in one (4 warps)
        for name, block, steps, warps in (("", 4096, 8, 8), ("_16k", 8192, 1, 4)):
            progs = (mib << 20) // (2 * block * steps)
            x = torch.randn(progs * block * steps, device=dev).to(torch.bfloat16)
            out = torch.empty(progs * block, device=dev)
            g = timer.graph(lambda: _read_once[(progs,)](x, out, BLOCK=block, STEPS=steps,
                                                          num_warps=warps))
            if not name:
                row["write_flush_us"] = timer.time_graph(g, "write")
                row["warm_us"] = timer.time_graph(g, False)
            row[f"read_flush{name}_us"] = timer.time_graph(g, "read")
            del x, out
        res[f"{mib}MiB"] = row
        print(f"[flush] {mib} MiB: {row}", flush=True)
    return res


def sweep_read_ceiling(timer, dev, index_block_topk, block_sparse_attention):
    """What reading a decode step's bytes costs at best, in the table's own
    timing (graph replay, L2 flushed before each replay): plain read kernels
    (Triton, 16-byte loads, several bytes per program and warps; torch's sum)
    over buffers of READ_CEILING_MIB sizes, both flushes, and the best ones
    chained as two dependent launches (index keys, then the selected K/V:
    b32 x 8k is 64 + 32 MiB, b32 x 32k 256 + 32 MiB; READ_CEILING_CHAINS, e.g.
    ``528+32`` for b32 x 128k with the fp8 index).  Any kernel that reads
    these bytes in that order takes at least about the chained minimum."""
    _read_once = read_once_kernel()

    # (name, bf16 elements per load, loads per program, warps)
    configs = (("16k_w4", 8192, 1, 4), ("32k_w4", 8192, 2, 4), ("32k_w8", 16384, 1, 8),
               ("64k_w4", 8192, 4, 4), ("64k_w8", 4096, 8, 8), ("64k_w8b", 16384, 2, 8),
               ("128k_w8", 16384, 4, 8), ("256k_w8", 16384, 8, 8))
    out, best = [], {}
    sizes = [int(v) for v in os.environ.get("READ_CEILING_MIB", "32,64,96,256").split(",")]
    for mib in sizes:
        x = torch.randn((mib << 20) // 2, device=dev).to(torch.bfloat16)
        runs = {"torch_sum": lambda x=x: torch.sum(x, dtype=torch.float32)}
        for name, block, steps, warps in configs:
            progs = x.numel() // (block * steps)
            part = torch.empty(progs * block, device=dev)
            runs[name] = (lambda x=x, part=part, progs=progs, block=block, steps=steps,
                          warps=warps: _read_once[(progs,)](x, part, BLOCK=block, STEPS=steps,
                                                            num_warps=warps))
        for name, fn in runs.items():
            g = timer.graph(fn)
            row = dict(kind="read_ceiling", mib=mib, config=name,
                       write_flush_us=timer.time_graph(g, "write"),
                       read_flush_us=timer.time_graph(g, "read"))
            out.append(row)
            for fl in ("write", "read"):
                key = (mib, fl)
                if key not in best or row[f"{fl}_flush_us"] < best[key][1]:
                    best[key] = (name, row[f"{fl}_flush_us"], fn)
            print(f"[sweep] {row}", flush=True)
    chains = os.environ.get("READ_CEILING_CHAINS", "64+32,256+32")
    for first, second in (tuple(int(x) for x in c.split("+")) for c in chains.split(",")):
        if (first, "write") not in best or (second, "write") not in best:
            continue
        row = dict(kind="read_ceiling_chain", first_mib=first, second_mib=second)
        for fl in ("write", "read"):
            f1, f2 = best[(first, fl)][2], best[(second, fl)][2]
            g = timer.graph(lambda f1=f1, f2=f2: (f1(), f2()))
            row[f"{fl}_flush_us"] = timer.time_graph(g, fl)
            row[f"{fl}_configs"] = (best[(first, fl)][0], best[(second, fl)][0])
        out.append(row)
        print(f"[sweep] {row}", flush=True)
    return out


@functools.lru_cache(maxsize=None)
def decode_skeleton_kernels():
    """A batch-1 decode step's memory dependencies without its math: four
    Triton kernels that read what the MSA kernels read, in the same dependent
    order, and reduce it with sums only.
      index:  program p reads the request, its block-table row entries of
              block p, then block p's index keys (PAGES pages x PAGE rows x
              DIM bf16), and writes one float (the block's "score").
      select: one program reads all the scores and writes TOPK block ids that
              depend on them (a reduction, no ranking).
      attend: program (slot, range) reads its slot's id, the block-table
              entries of that block, then its KEYS rows of K and of V, and
              writes a [G, DIM] float32 partial (the real partial's bytes).
      merge:  one program per query head reads the S partials of its row and
              writes the bf16 output row."""
    import triton
    import triton.language as tl

    @triton.jit
    def _index(k_ptr, bt_ptr, req_ptr, out_ptr, stride_kp, stride_bt,
               PAGES: tl.constexpr, PAGE: tl.constexpr, DIM: tl.constexpr):
        p = tl.program_id(0)
        req = tl.load(req_ptr)
        pages = tl.load(bt_ptr + req * stride_bt + p * PAGES + tl.arange(0, PAGES))
        rows = tl.arange(0, PAGE)
        cols = tl.arange(0, DIM)
        k = tl.load(k_ptr + pages.to(tl.int64)[:, None, None] * stride_kp
                    + rows[None, :, None] * DIM + cols[None, None, :])
        tl.store(out_ptr + p, tl.sum(tl.sum(tl.sum(k.to(tl.float32), axis=2), axis=1), axis=0))

    @triton.jit
    def _select(score_ptr, ids_ptr, NB: tl.constexpr, TOPK: tl.constexpr):
        sc = tl.load(score_ptr + tl.arange(0, NB))
        r = tl.sum((sc == sc).to(tl.int32), axis=0)  # NB, but only once the scores are in
        ids = (tl.arange(0, TOPK) * (NB // TOPK) + r) % NB
        tl.store(ids_ptr + tl.arange(0, TOPK), ids)

    @triton.jit
    def _attend(kv_ptr, bt_ptr, req_ptr, ids_ptr, part_ptr, stride_cp, stride_ckv,
                stride_cs, stride_bt, KS: tl.constexpr, KEYS: tl.constexpr,
                PAGE: tl.constexpr, BLOCK: tl.constexpr, G: tl.constexpr, DIM: tl.constexpr):
        pid = tl.program_id(0)
        slot = pid // KS
        key0 = (pid % KS) * KEYS
        req = tl.load(req_ptr)
        b = tl.load(ids_ptr + slot)
        kpos = b * BLOCK + key0 + tl.arange(0, KEYS)
        page = tl.load(bt_ptr + req * stride_bt + kpos // PAGE).to(tl.int64)
        row = page * stride_cp + (kpos % PAGE) * stride_cs
        cols = tl.arange(0, DIM)
        k = tl.load(kv_ptr + row[:, None] + cols[None, :]).to(tl.float32)
        v = tl.load(kv_ptr + stride_ckv + row[:, None] + cols[None, :]).to(tl.float32)
        acc = tl.sum(k, axis=0) + tl.sum(v, axis=0)
        part = tl.zeros([G, DIM], tl.float32) + acc[None, :]
        tl.store(part_ptr + pid * G * DIM + tl.arange(0, G)[:, None] * DIM + cols[None, :],
                 part)

    @triton.jit
    def _merge(part_ptr, out_ptr, S: tl.constexpr, G: tl.constexpr, DIM: tl.constexpr):
        h = tl.program_id(0)
        cols = tl.arange(0, DIM)
        o = tl.load(part_ptr + tl.arange(0, S)[:, None] * G * DIM + h * DIM + cols[None, :])
        tl.store(out_ptr + h * DIM + cols, tl.sum(o, axis=0).to(tl.bfloat16))

    return _index, _select, _attend, _merge


def sweep_latency_floor(timer, dev, index_block_topk, block_sparse_attention):
    """Batch-1 decode: the MSA chain (index + top-k + attention + merge, the
    defaults) against ``decode_skeleton_kernels``, the same reads in the same
    dependent order in four launches without the math, graph-replayed with
    each flush; the skeleton's attention with one program per block and with
    4 key ranges per block (the key-split default).  What the chain costs
    beyond the skeleton is its math and its launch shapes; the skeleton is
    what this four-launch decomposition costs with none.  Contexts
    ``LATENCY_FLOOR_CONTEXTS`` (default 8192,32768)."""
    _index, _select, _attend, _merge = decode_skeleton_kernels()
    out = []
    for ctx in [int(c) for c in os.environ.get("LATENCY_FLOOR_CONTEXTS", "8192,32768").split(",")]:
        bt = Batch([ctx], 1, 0, dev)
        nb = ctx // B
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        o = torch.empty_like(bt.q)
        scores = torch.empty(nb, device=dev)
        ids = torch.empty(TOPK, dtype=torch.int32, device=dev)
        so = torch.empty(HQ, D, dtype=torch.bfloat16, device=dev)

        def msa():
            index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                             B, TOPK, out=sel, num_decode_tokens=bt.T)
            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos,
                                   sel, B, D ** -0.5, out=o)
        runs = {"msa_default": msa}
        for ks in (1, 4):
            part = torch.empty(TOPK * ks, HQ, D, device=dev)

            def skeleton(ks=ks, part=part):
                _index[(nb,)](bt.idx_k, bt.block_table, bt.token_req, scores,
                              bt.idx_k.stride(0), bt.block_table.stride(0),
                              PAGES=B // PAGE, PAGE=PAGE, DIM=DIDX, num_warps=4)
                _select[(1,)](scores, ids, NB=nb, TOPK=TOPK, num_warps=1)
                _attend[(TOPK * ks,)](bt.kv, bt.block_table, bt.token_req, ids, part,
                                      bt.kv.stride(0), bt.kv.stride(1), bt.kv.stride(2),
                                      bt.block_table.stride(0), KS=ks, KEYS=B // ks,
                                      PAGE=PAGE, BLOCK=B, G=HQ, DIM=D, num_warps=4)
                _merge[(HQ,)](part, so, S=TOPK * ks, G=HQ, DIM=D, num_warps=1)
            runs[f"skeleton_ks{ks}"] = skeleton
        for name, fn in runs.items():
            g = timer.graph(fn)
            row = dict(kind="latency_floor", batch=1, context=ctx, chain=name,
                       write_flush_us=timer.time_graph(g, "write"),
                       read_flush_us=timer.time_graph(g, "read"),
                       warm_us=timer.time_graph(g, False))
            out.append(row)
            print(f"[sweep] {row}", flush=True)
        del bt
    return out


def launch_floor(timer, dev):
    """What a decode step's kernel chain costs with no work, timed like the
    kernels: a graph of n launches of a one-program Triton kernel that follows
    a chain of 3 dependent loads (selected id -> block table -> cache row, as
    the MSA kernels do), for n = 1, 2, 4; L2 flushed and warm."""
    import triton
    import triton.language as tl

    @triton.jit
    def _chase(a_ptr, out_ptr):
        i = tl.load(a_ptr)
        j = tl.load(a_ptr + i)
        k = tl.load(a_ptr + j)
        tl.store(out_ptr, k)

    a = torch.arange(1, 4097, dtype=torch.int32, device=dev)
    a[0], a[1] = 1024, 2048
    out = torch.empty(1, dtype=torch.int32, device=dev)
    res = {}
    for n in (1, 2, 4):
        def chain(n=n):
            for _ in range(n):
                _chase[(1,)](a, out)
        g = timer.graph(chain)
        res[f"{n}_kernels"] = timer.time_graph(g)
        res[f"{n}_kernels_warm"] = timer.time_graph(g, flush=False)
    return res


def l2_read_bandwidth(timer, dev, sizes_mib=(8, 16, 24, 32)):
    """Measured ceiling of reads served by L2: a Triton kernel whose programs
    each read their slice of a buffer that fits in L2 ``REPS`` times over
    (16-byte vector loads, summed so the loads stay), warm, CUDA-graph replay;
    GB/s of bytes read per buffer size.  The per-token prefill attention reads
    each selected block's K/V once per token, so this bounds it."""
    import triton
    import triton.language as tl

    @triton.jit
    def _reread(x_ptr, out_ptr, n_per_prog, REPS: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        base = x_ptr + pid.to(tl.int64) * n_per_prog
        acc = tl.zeros([BLOCK], tl.float32)
        for _ in range(REPS):
            for i in range(0, n_per_prog, BLOCK):
                acc += tl.load(base + i + tl.arange(0, BLOCK)).to(tl.float32)
        tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)

    progs = 4 * torch.cuda.get_device_properties(dev).multi_processor_count
    reps, block = 16, 2048
    res = {}
    for mib in sizes_mib:
        n_per_prog = (mib << 20) // 2 // progs // block * block
        x = torch.randn(progs * n_per_prog, device=dev).to(torch.bfloat16)
        out = torch.empty(progs * block, device=dev)
        g = timer.graph(lambda: _reread[(progs,)](x, out, n_per_prog, REPS=reps, BLOCK=block,
                                                  num_warps=8))
        t_us = timer.time_graph(g, flush=False)
        res[f"{mib}MiB_GBps"] = x.numel() * 2 * reps / (t_us * 1e-6) / 1e9
        print(f"[l2] {mib} MiB x {reps}: {t_us:.1f} us, {res[f'{mib}MiB_GBps']:.0f} GB/s",
              flush=True)
        del x, out
    return res


def sweep_l2(timer, dev, index_block_topk, block_sparse_attention):
    """The L2 read ceiling (``l2_read_bandwidth``) as a sweep entry."""
    return [dict(kind="l2_read", **l2_read_bandwidth(timer, dev))]

