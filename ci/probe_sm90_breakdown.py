# SPDX-License-Identifier: Apache-2.0
"""Probe: where the sm_90 block-major kernel's time goes (8192-token chunk,
the index's selections, bf16 KV), by taking one piece of each step away.

Timing probes, not kernels: the Gluon kernel's source is patched into a
temporary module of the same package
(``_probe_sparse_attn_block_major_sm90_*.py``; the repo's kernel is
unchanged), and the attention launch runs it in place of the real one.
Every variant but ``default`` computes wrong outputs on purpose:

  nostore    the partial outputs' global stores masked off by a runtime
             condition (``n < 0``): the math, the shared-memory round trip
             and the stores' address math stay, no bytes leave;
  nopartial  no partial output path at all (no round trip through shared
             memory, no barrier, no stores; the output kept alive through a
             zero-weighted term of the stored log-sum-exp);
  noexp      the probabilities are the scaled scores themselves (one FMA
             instead of ``exp2``: what the special-function unit costs);
  nopv       no second MMA (the output is the probabilities);
  mma_only   noexp and nopartial together: the two MMAs, the row reductions,
             the query-row copies and the pairs' index loads.

Partials kept in L2 (outputs wrong on purpose): ``ring`` stores each pair's
partial rows at row ``% RING_ROWS`` of the partial buffer (4 MiB: the stores'
count and addresses' shape stay, their bytes never need to reach HBM);
``merge_l2`` has the merge read its partials from that same 4 MiB region (the
full merge grid reading L2-resident partials); ``ring_merge_l2`` both: what a
design whose partials never leave L2 could reach at best.

And L2 policies for the partials' stores (same outputs as the default):
``o_evict_first`` (``st.global.L1::evict_first.L2::cache_hint``, an
evict-first policy) and ``o_streaming`` (``st.global.cs``), so that the
512 MiB of partials streaming through L2 leave the query rows and blocks the
steps re-read there.  ``PROBE_VARIANTS``: a comma-separated subset.

Each variant: the block-major kernel's device time (profiler, L2 flushed by a
256 MiB write before each call) and the CUDA-graph replay of the whole prefill
attention, timed in ``ROUNDS`` paired rounds.  Results:
$OUT/probe_sm90_breakdown.json.  ``PROBE_CONTEXTS`` (default "8192").

  PYTHONPATH=<stub vllm> python ci/probe_sm90_breakdown.py
"""

import json
import os
import sys

import torch

from bench_msa import (B, D, TOPK, Batch, kernel_times, load_kernels, paired_rounds,
                       probe_setup)
from probe_prefill_ceiling import patched_kernel

O_PATH = """        o_smem = q_smem.index(i % NUM_BUF)._reinterpret(gl.float16, [R, D], o_sl)
        o_smem.store(o.to(gl.float16))
        gl.thread_barrier()
        o = o_smem.load(tile)
        ph_t = (tok_t.to(gl.int64) * HQ + g * G + head_c) * TOPK + slot_t
        gl.store(part_o_ptr + ph_t[:, None] * D + offs_dc[None, :], o,
                 mask=((s0 + pair_c < n) & (head_c < G))[:, None])
"""
LSE_STORE = "        gl.store(part_lse_ptr + ph, lse,"
KEEP_O = "        lse = lse + gl.sum(o, axis=1) * 0.0\n"
EXP = "        p = gl.exp2(s * qk_scale - m[:, None])\n"
PV = """        o_tok = warpgroup_mma(p_op, v_smem, gl.zeros([R, D], gl.float32, mma), use_acc=False,
                              is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, ))
"""
NOPARTIAL = [(O_PATH, ""), (LSE_STORE, KEEP_O + LSE_STORE)]
NOEXP = [(EXP, "        p = s * qk_scale - m[:, None]\n")]
O_STORE = """        gl.store(part_o_ptr + ph_t[:, None] * D + offs_dc[None, :], o,
                 mask=((s0 + pair_c < n) & (head_c < G))[:, None])
"""
RING_ROWS = 16384  # rows of D fp16: 4 MiB
PH_T = "        ph_t = (tok_t.to(gl.int64) * HQ + g * G + head_c) * TOPK + slot_t\n"
RING = [(PH_T, PH_T + f"        ph_t = ph_t % {RING_ROWS}\n")]
MERGE_ROWS = "(row * S + offs_s[:, None]) * D_PAD"
MERGE_PATCHES = {"merge_l2": [
    (MERGE_ROWS, f"((row * S + offs_s[:, None]) % {RING_ROWS}) * D_PAD")]}
MERGE_PATCHES["ring_merge_l2"] = MERGE_PATCHES["merge_l2"]
O_EVICT_FIRST = [(O_STORE, O_STORE[:-2] + ", eviction_policy=\"evict_first\")\n")]
PATCHES = {
    "nostore": [("mask=((s0 + pair_c < n) & (head_c < G))[:, None])",
                 "mask=((s0 + pair_c < n) & (head_c < G) & (n < 0))[:, None])")],
    "nopartial": NOPARTIAL,
    "noexp": NOEXP,
    "nopv": [(PV, "        o = p\n")],
    "mma_only": NOEXP + NOPARTIAL,
    "ring": RING,
    "merge_l2": [],
    "ring_merge_l2": RING,
    # L2 policies for the partials (outputs must equal the default's); the query
    # rows' and the block's cp.async copies take no L2 policy (Triton 3.6 drops
    # their eviction_policy: no createpolicy in the PTX)
    "o_evict_first": O_EVICT_FIRST,
    "o_streaming": [(O_STORE, O_STORE[:-2] + ", cache_modifier=\".cs\")\n")],
}


def main():
    out_dir, dev, timer = probe_setup()
    rounds = int(os.environ.get("ROUNDS", "7"))
    index_block_topk, block_sparse_attention, src = load_kernels()
    attn_mod = sys.modules[block_sparse_attention.__module__]
    real = attn_mod.sparse_attn_block_major_sm90_kernel
    real_merge = attn_mod.sparse_attn_merge_kernel
    if real is None:
        raise SystemExit("no sm_90 kernel here (Gluon missing or not an sm_90 device)")
    res = dict(kernels_from=src, gpu=torch.cuda.get_device_name(0),
               commit=os.environ.get("GIT_COMMIT", "?"), rounds=rounds, contexts={})
    for ctx in [int(c) for c in os.environ.get("PROBE_CONTEXTS", "8192").split(",")]:
        bt = Batch([ctx], 8192, 0, dev)
        sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                               bt.token_pos, B, TOPK, num_decode_tokens=0)
        graphs, kernels, outs = {}, {}, {}
        names = os.environ.get("PROBE_VARIANTS", ",".join(PATCHES)).split(",")
        for name in ("default", *[n for n in names if n != "default"]):
            o = torch.empty_like(bt.q)

            def attn(o=o):
                block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                       bt.token_pos, sel, B, D ** -0.5, 0, bt.k_scale, bt.v_scale,
                                       bt.kv_scales,
                                       out=o, block_major=4)
            attn_mod.sparse_attn_block_major_sm90_kernel = (
                real if not PATCHES.get(name) else patched_kernel(
                    attn_mod, name, PATCHES, "sparse_attn_block_major_sm90",
                    "sparse_attn_block_major_sm90_kernel"))
            if name in MERGE_PATCHES:
                attn_mod.sparse_attn_merge_kernel = patched_kernel(
                    attn_mod, name, MERGE_PATCHES, "sparse_attn_merge", "sparse_attn_merge_kernel")
            try:
                o.fill_(float("nan"))
                attn()
                outs[name] = o.clone()
                kt = kernel_times(attn, timer, reps=10)
                kernels[name] = {k: v["median_us"] for k, v in kt.items()
                                 if "block_major_sm90" in k or "merge" in k}
                graphs[name] = timer.graph(attn)
            finally:
                attn_mod.sparse_attn_block_major_sm90_kernel = real
                attn_mod.sparse_attn_merge_kernel = real_merge
            print(f"[probe] ctx {ctx} {name}: {kernels[name]}", flush=True)
        res["contexts"][ctx] = dict(
            kernels=kernels,
            default_finite=bool(torch.isfinite(outs["default"]).all()),
            equals_default={k: bool(torch.equal(v, outs["default"]))
                            for k, v in outs.items() if k != "default"},
            **paired_rounds(timer, graphs, rounds, base="default"))
        print(json.dumps({k: v for k, v in res["contexts"][ctx].items() if k != "us"},
                         indent=1), flush=True)
        del bt
    (out_dir / "probe_sm90_breakdown.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
