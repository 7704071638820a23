# SPDX-License-Identifier: Apache-2.0
"""Decode sweeps: index blocks per program and pipelining, attention splits, per-kernel
profiles, one-launch variants, PDL, warps, bf16 against fp8 KV in paired rounds."""

import json
import os

import torch

from .checks import Batch, same_selection
from .harness import (B, D, HIDX, KV_KINDS, TOPK, checked_time, default_layout,
                      engine_takes_score_attend, env_shapes, kernel_times, paired_rounds,
                      score_attend_fn, score_attend_step)


def sweep_decode(timer, dev, index_block_topk, block_sparse_attention):
    """Decode index (blocks per program, pipelining, warps) and attention splits."""
    out = []
    # DECODE_SWEEP_SHAPES="32x8192" (batch x context) narrows the sweep
    for batch, ctx in env_shapes("DECODE_SWEEP_SHAPES", "1x8192,32x32768,32x131072"):
        bt = Batch([ctx] * batch, 1, 0, dev)
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        o = torch.empty_like(bt.q)
        for bpp in (1, 2, 4, 8, 16, 32):
            t = timer.time_fn(lambda: index_block_topk(
                bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                out=sel, num_decode_tokens=bt.T, blocks_per_prog=bpp))
            out.append(dict(kind="decode_index", batch=batch, context=ctx, blocks_per_prog=bpp, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        # software-pipelined block walk (decode_stages) and warps per program
        for bpp, tune in ((2, dict(decode_stages=2)), (4, dict(decode_stages=2)),
                          (4, dict(decode_stages=3)), (8, dict(decode_stages=3)),
                          (4, dict(decode_stages=3, decode_warps=8)),
                          (1, dict(decode_warps=8)), (2, dict(decode_warps=2))):
            _, t = checked_time(timer, lambda: index_block_topk(
                bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                out=sel, num_decode_tokens=bt.T, blocks_per_prog=bpp, _tune=tune))
            out.append(dict(kind="decode_index", batch=batch, context=ctx, blocks_per_prog=bpp,
                            tune=tune, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        for ns in (1, 2, 4, 8, 16):
            t = timer.time_fn(lambda: block_sparse_attention(
                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B, D ** -0.5,
                out=o, num_splits=ns))
            out.append(dict(kind="decode_attn", batch=batch, context=ctx, num_splits=ns, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        # the next key tile's slot and pages resolved one tile ahead, with and
        # without the split merge fused into the attention launch
        for ns, tune, fused in ((None, dict(prefetch_rows=True), False),
                                (None, dict(prefetch_rows=True), True),
                                (None, None, True),
                                (8, dict(prefetch_rows=True), False),
                                (16, dict(prefetch_rows=True), False),
                                (8, dict(prefetch_rows=True, BLOCK_N=64), False)):
            _, t = checked_time(timer, lambda: block_sparse_attention(
                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B, D ** -0.5,
                out=o, num_splits=ns, fused_merge=fused, _tune=tune))
            out.append(dict(kind="decode_attn", batch=batch, context=ctx, num_splits=ns,
                            tune=tune, fused_merge=fused, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_decode_profile(timer, dev, index_block_topk, block_sparse_attention):
    """Where a decode step's time goes: each kernel's device time (profiler,
    L2 flushed) next to the graph-replayed chain, by batch and context, bf16
    and fp8 KV, and the attention split counts around the default."""
    out = []
    for batch, ctx, kv_mode in ((1, 8192, 0), (32, 8192, 0), (32, 8192, 1), (32, 32768, 0)):
        bt = Batch([ctx] * batch, 1, kv_mode, dev)
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        o = torch.empty_like(bt.q)

        def index(sel=sel, bt=bt):
            return index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                    bt.token_pos, B, TOPK, out=sel, num_decode_tokens=bt.T)
        index()
        for ns in (None, 4, 8, 16):
            def attn(ns=ns, bt=bt, sel=sel, o=o, kv_mode=kv_mode):
                return block_sparse_attention(
                    bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                    D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, None, out=o, num_splits=ns)

            def chain(attn=attn):
                index()
                attn()
            try:
                kt = kernel_times(chain, timer)
                kt_clean = kernel_times(chain, timer, "read")
                t_attn = timer.time_fn(attn)
                t_chain = timer.time_fn(chain)
                t_chain_clean = timer.time_fn(chain, "read")
            except Exception as e:  # noqa: BLE001
                kt, kt_clean, t_attn, t_chain, t_chain_clean = repr(e)[:200], None, None, None, None
            out.append(dict(kind="decode_profile", batch=batch, context=ctx, kv_mode=kv_mode,
                            num_splits=ns, kernels=kt, kernels_clean=kt_clean,
                            attention_graph_us=t_attn, chain_graph_us=t_chain,
                            chain_graph_clean_us=t_chain_clean))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_decode_variants(timer, dev, index_block_topk, block_sparse_attention):
    """The decode chain (index + top-k + attention) with the top-k by rank or
    by arg-max rounds and the split merge fused into the attention, L2
    flushed by a write and by a read; each variant's selection
    (as sets) and output checked against the default's."""
    out = []
    # (run 11 also timed the fused merge reading its partials with L2 instead of
    # volatile loads: no faster, removed)
    # (name, index _tune, attention _tune, fused merge, select: "kernel" (a launch),
    # "fused" (the last scoring program), "attention" (every attention program
    # ranks its token's block scores; rows of <= 64 blocks))
    variants = (("default", {}, {}, False, "kernel"),
                ("rank", dict(rank_select=True), {}, False, "kernel"),
                ("argmax", dict(rank_select=False), {}, False, "kernel"),
                ("fused_merge", {}, {}, True, "kernel"),
                ("pdl", dict(pdl=True), dict(pdl=True), False, "kernel"),
                ("fused_select", {}, {}, False, "fused"),
                ("fused_select_argmax", dict(rank_select=False), {}, False, "fused"),
                ("fused_select_pdl", dict(pdl=True), dict(pdl=True), False, "fused"),
                ("select_in_attention", {}, {}, False, "attention"),
                ("select_in_attention_pdl", dict(pdl=True), dict(pdl=True), False, "attention"),
                ("key_split2", {}, dict(key_split=2), False, "kernel"),
                ("key_split4", {}, dict(key_split=4), False, "kernel"),
                ("key_split2_4warps", {}, dict(key_split=2, num_warps=4), False, "kernel"),
                ("key_split2_8warps", {}, dict(key_split=2, num_warps=8), False, "kernel"),
                ("key_split2_pdl", dict(pdl=True), dict(key_split=2, pdl=True), False, "kernel"),
                # every visible block scored and attended, the top-k merged: two
                # launches (score_attend_decode; rows of <= 64 blocks)
                ("score_attend", {}, {}, False, "score_attend"),
                ("score_attend_ks1", {}, dict(key_split=1), False, "score_attend"),
                ("score_attend_ks2", {}, dict(key_split=2), False, "score_attend"),
                ("score_attend_w8", {}, dict(num_warps=8), False, "score_attend"))
    if os.environ.get("DECODE_VARIANTS"):  # a comma-separated subset of the names
        keep = os.environ["DECODE_VARIANTS"].split(",")
        variants = tuple(v for v in variants if v[0] in keep or v[0] == "default")
    shapes = ((1, 8192, 0), (1, 32768, 0), (32, 8192, 0), (32, 8192, 1), (32, 32768, 0))
    if os.environ.get("DECODE_VARIANTS_SHAPES"):  # "BxC,..." (bf16 KV) or "BxCxM" (KV mode M)
        shapes = tuple((v[0], v[1], v[2] if len(v) > 2 else 0)
                       for v in env_shapes("DECODE_VARIANTS_SHAPES", ""))
    for batch, ctx, kv_mode in shapes:
        bt = Batch([ctx] * batch, 1, kv_mode, dev)
        ref_sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        ref_o = torch.empty_like(bt.q)
        for name, itune, atune, fused, select in variants:
            if select in ("attention", "score_attend") and ctx > 64 * B:
                continue  # rows of more than 64 blocks go through the top-k ids
            sel = torch.full_like(ref_sel, -7)
            o = torch.full_like(ref_o, float("nan"))

            def chain(sel=sel, o=o, itune=itune, atune=atune, fused=fused, select=select):
                if select == "score_attend":
                    score_attend_fn(block_sparse_attention)(
                        bt.idx_q, bt.idx_k, bt.q, bt.kv, bt.block_table, bt.token_req,
                        bt.token_pos, B, TOPK, 1, 0, D ** -0.5, kv_mode, bt.k_scale,
                        bt.v_scale, bt.kv_scales, out=o, _tune=atune)
                    return
                ids = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                       bt.token_pos, B, TOPK, out=sel, num_decode_tokens=bt.T,
                                       fused_select=select == "fused",
                                       return_scores=select == "attention", _tune=itune)
                block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos,
                                       ids, B, D ** -0.5, kv_mode, bt.k_scale, bt.v_scale,
                                       bt.kv_scales, out=o, fused_merge=fused,
                                       select_topk=TOPK if select == "attention" else 0,
                                       _tune=atune)
            try:
                chain()
                torch.cuda.synchronize()
                if name == "default":
                    ref_sel.copy_(sel)
                    ref_o.copy_(o)
                same_sel = (None if select in ("attention", "score_attend")  # (no ids)
                            else same_selection(sel, ref_sel))
                diff = float((o.float() - ref_o.float()).abs().max())
                g = timer.graph(chain)
                t_w, t_r = timer.time_graph(g, "write"), timer.time_graph(g, "read")
            except Exception as e:  # noqa: BLE001
                same_sel, diff, t_w, t_r = None, None, repr(e)[:200], None
            out.append(dict(kind="decode_variants", batch=batch, context=ctx, kv_mode=kv_mode,
                            variant=name, same_selection=same_sel, max_diff=diff,
                            us_write_flush=t_w, us_read_flush=t_r))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_kv_dtype_parity(timer, dev, index_block_topk, block_sparse_attention):
    """bf16 against fp8 KV (scalar and per-token-head scales), paired: the
    whole steps (index + top-k + attention) of one shape are captured, then
    timed in turns, ``PARITY_ROUNDS`` rounds of one median each (write flush),
    so that drift of the GPU's clocks between rows of the table does not
    decide which is faster.  Reports each round's medians, the per-round
    ratios to bf16 and how many rounds each was slower in.  Decode shapes
    ``PARITY_DECODE`` ("BxC", default batch 1), prefill ``PARITY_PREFILL``
    (chunk x context, default an 8192-token chunk at 8k and 32k context);
    ``PARITY_EXTRA``: more kinds, "name:kv_mode:json _tune" joined by ";"
    (e.g. 'fp8-ks2:1:{"key_split": 2}'), timed in the same turns: the
    chain's attention with that ``_tune``, or with ``"score_attend": true``
    in it the two launches (where the engine takes them) with the rest;
    decode shapes only, or prefill ones only with ``"phase": "prefill"``.
    ``PARITY_SHARED=1``: every kind of a shape stores one bf16 batch's K/V
    (``Batch.with_kv_mode``: same pages, queries, index and so selections);
    else each kind draws its own batch."""
    rounds = int(os.environ.get("PARITY_ROUNDS", "7"))
    kinds = [(name, mode, {}) for name, mode in KV_KINDS]
    phases = {}
    for spec in filter(None, os.environ.get("PARITY_EXTRA", "").split(";")):
        name, mode, tune = spec.split(":", 2)
        tune = json.loads(tune)
        phases[name] = tune.pop("phase", "decode")
        kinds.append((name, int(mode), tune))
    shapes = [("decode", b, c) for b, c in env_shapes("PARITY_DECODE",
                                                       "1x8192,1x32768,1x131072")]
    shapes += [("prefill", n, c) for n, c in env_shapes("PARITY_PREFILL",
                                                         "8192x8192,8192x32768")]
    shared = os.environ.get("PARITY_SHARED") == "1"
    out = []
    for phase, n, ctx in shapes:
        graphs, paths = {}, {}
        def new_batch(kv_mode, phase=phase, n=n, ctx=ctx):
            return (Batch([ctx] * n, 1, kv_mode, dev) if phase == "decode"
                    else Batch([ctx], n, kv_mode, dev))
        base = new_batch(0) if shared else None
        for kv_name, kv_mode, tune in kinds:
            if phases.get(kv_name, phase) != phase:
                continue
            if not shared:
                bt = new_batch(kv_mode)
            else:
                bt = base if kv_mode == 0 else base.with_kv_mode(kv_mode)
            sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
            o = torch.empty_like(bt.q)
            layout = ({} if phase == "decode"
                      else default_layout(block_sparse_attention, n, ctx, kv_mode != 0))

            # the engine's path (two launches for batch 1-2 over <= 64 blocks); the
            # PARITY_EXTRA variants tune the chain's attention
            sa_tune = dict(tune)
            on_sa = sa_tune.pop("score_attend", False)
            sa = (score_attend_step(block_sparse_attention, bt, kv_mode, o, sa_tune)
                  if phase == "decode" and (on_sa or not tune)
                  and engine_takes_score_attend(block_sparse_attention, bt, dev) else None)

            paths[kv_name] = "score_attend" if sa is not None else "chain"

            def step(bt=bt, sel=sel, o=o, kv_mode=kv_mode, layout=layout, tune=tune, sa=sa):
                if sa is not None:
                    return sa()
                index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                 bt.token_pos, B, TOPK, out=sel,
                                 num_decode_tokens=bt.T if phase == "decode" else 0)
                block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                       bt.token_pos, sel, B, D ** -0.5, kv_mode, bt.k_scale,
                                       bt.v_scale, bt.kv_scales, out=o, **layout,
                                       **({"_tune": tune} if tune else {}))
            # the step (its defaults: the batch and the buffers the graph
            # writes) lives as long as its graph
            graphs[kv_name] = (timer.graph(step), step)
        row = dict(kind="kv_dtype_parity", phase=phase, tokens=n, context=ctx, rounds=rounds,
                   shared_batch=shared,
                   tunes={k: t for k, _, t in kinds if k in graphs and t}, paths=paths,
                   **paired_rounds(timer, {k: g for k, (g, _) in graphs.items()}, rounds))
        out.append(row)
        print(f"[sweep] {row}", flush=True)
        del graphs
    return out


def sweep_prefill_attn_profile(timer, dev, index_block_topk, block_sparse_attention):
    """Where block-major prefill attention's time goes (an 8192-token chunk, the
    index's selections): each kernel's device time (profiler, L2 flushed) of
    the grouping, the block-major kernel and the merge.  bf16 KV: in one slice
    (the default), in slices of 64 MiB of partial outputs, and with the
    grouping's counters added once per pair (``aggregate_ranks`` off; the
    default adds once per group and program).  ``PROFILE_KV_MODES`` (default
    "0"): the KV modes profiled (0 bf16, 1 fp8 scalar, 2 fp8 per-token-head;
    the fp8 ones with the default launch only), each on the bf16 batch's
    selections, so that all modes do the same work; ``PROFILE_CONTEXTS``
    (default "8192,32768"); ``PROFILE_DEFAULT_ONLY=1``: of the fixed bf16
    variants the default only; ``PROFILE_TUNES``: more bf16 variants,
    "name:json _tune" joined by ";"; ``PROFILE_FP8_TUNES``: the same for the
    fp8 modes."""
    out = []
    extra = [(name, json.loads(tune)) for name, tune in
             (spec.split(":", 1) for spec in
              filter(None, os.environ.get("PROFILE_TUNES", "").split(";")))]
    extra_fp8 = [(name, json.loads(tune)) for name, tune in
                 (spec.split(":", 1) for spec in
                  filter(None, os.environ.get("PROFILE_FP8_TUNES", "").split(";")))]
    modes = [int(m) for m in os.environ.get("PROFILE_KV_MODES", "0").split(",")]
    ctxs = [int(c) for c in os.environ.get("PROFILE_CONTEXTS", "8192,32768").split(",")]
    for ctx in ctxs:
        bt = Batch([ctx], 8192, 0, dev)
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B,
                         TOPK, out=sel, num_decode_tokens=0)
        o = torch.empty_like(bt.q)
        for kv_mode in modes:
            kb = bt if kv_mode == 0 else bt.with_kv_mode(kv_mode)
            fixed = (() if os.environ.get("PROFILE_DEFAULT_ONLY") == "1" else
                     (("pb64", dict(partial_bytes=64 << 20)),
                      ("per_pair_ranks", dict(aggregate_ranks=False))))
            variants = ((("default", None), *fixed, *extra)
                        if kv_mode == 0 else (("default", None), *extra_fp8))
            first = None
            for name, tune in variants:
                def attn(tune=tune, kb=kb, kv_mode=kv_mode):
                    block_sparse_attention(kb.q, kb.kv, kb.block_table, kb.token_req,
                                           kb.token_pos, sel, B, D ** -0.5, kv_mode,
                                           kb.k_scale, kb.v_scale, kb.kv_scales,
                                           out=o, block_major=4, _tune=tune)
                diff = None
                try:
                    # each variant's output against the first's (the default's)
                    o.fill_(float("nan"))
                    attn()
                    if first is None:
                        first = o.clone()
                    diff = float((o.float() - first.float()).abs().max())
                    kt, t = kernel_times(attn, timer, reps=10), timer.time_fn(attn)
                except Exception as e:  # noqa: BLE001
                    kt, t = repr(e)[:200], None
                out.append(dict(kind="prefill_attn_profile", context=ctx, kv_mode=kv_mode,
                                variant=name, kernels=kt, graph_us=t, max_diff_first=diff))
                print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_decode_attn_warps(timer, dev, index_block_topk, block_sparse_attention):
    """The decode attention (and the whole chain) with 4 or 8 warps per
    program and with the next key tile's rows resolved one tile ahead, bf16
    and both fp8 scale modes: with an fp8 cache each program converts its
    keys and values to the MMA dtype, work that more warps split; outputs
    checked against the default's."""
    out = []
    variants = (("default", {}), ("warps4", dict(num_warps=4)), ("warps8", dict(num_warps=8)),
                ("prefetch", dict(prefetch_rows=True)),
                ("warps8_prefetch", dict(num_warps=8, prefetch_rows=True)),
                # shared memory per program against programs resident per SM: with
                # 128-key tiles and 2 stages a program holds 128 KiB of K/V tiles, so
                # one per SM, and batch 32's 256 programs run in two waves
                ("stages1", dict(num_stages=1)),
                ("stages1_warps8", dict(num_stages=1, num_warps=8)),
                ("bn64_stages2", dict(BLOCK_N=64, num_stages=2)),
                ("bn64_stages3", dict(BLOCK_N=64, num_stages=3)),
                ("bn64_stages4", dict(BLOCK_N=64, num_stages=4)),
                ("splits4_stages3", dict(num_splits=4, num_stages=3)),
                ("splits16", dict(num_splits=16)),
                ("splits16_stages1", dict(num_splits=16, num_stages=1)),
                ("splits16_bn64_stages3", dict(num_splits=16, BLOCK_N=64, num_stages=3)))
    # DECODE_ATTN_WARPS_SHAPES="2x8192,4x8192" (batch x context) and
    # DECODE_ATTN_WARPS_KV_MODES="1" narrow the sweep
    shapes = env_shapes("DECODE_ATTN_WARPS_SHAPES", "1x8192,1x32768,32x8192,32x32768")
    kv_modes = [int(m) for m in os.environ.get("DECODE_ATTN_WARPS_KV_MODES", "0,1,2").split(",")]
    names = os.environ.get("DECODE_ATTN_WARPS_VARIANTS")
    if names:
        variants = tuple(v for v in variants if v[0] == "default" or v[0] in names.split(","))
    for batch, ctx in shapes:
        for kv_mode in kv_modes:
            bt = Batch([ctx] * batch, 1, kv_mode, dev)
            sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
            index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B,
                             TOPK, out=sel, num_decode_tokens=bt.T)
            ref = torch.empty_like(bt.q)
            for name, tune in variants:
                o = torch.full_like(bt.q, float("nan"))

                def attn(o=o, tune=tune):
                    tune = dict(tune)  # the split count is an argument, not a _tune key
                    block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                           bt.token_pos, sel, B, D ** -0.5, kv_mode, bt.k_scale,
                                           bt.v_scale, bt.kv_scales, out=o,
                                           num_splits=tune.pop("num_splits", None), _tune=tune)

                def chain(attn=attn):
                    index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                     bt.token_pos, B, TOPK, out=sel, num_decode_tokens=bt.T)
                    attn()
                try:
                    attn()
                    torch.cuda.synchronize()
                    if name == "default":
                        ref.copy_(o)
                    diff = float((o.float() - ref.float()).abs().max())
                    ga, gc = timer.graph(attn), timer.graph(chain)
                    res = dict(attn_us=timer.time_graph(ga), attn_clean_us=timer.time_graph(ga, "read"),
                               chain_us=timer.time_graph(gc), chain_clean_us=timer.time_graph(gc, "read"))
                except Exception as e:  # noqa: BLE001
                    diff, res = None, dict(error=repr(e)[:200])
                out.append(dict(kind="decode_attn_warps", batch=batch, context=ctx, kv_mode=kv_mode,
                                variant=name, max_diff=diff, **res))
                print(f"[sweep] {out[-1]}", flush=True)
            del bt
    return out


def sweep_pdl(timer, dev, index_block_topk, block_sparse_attention):
    """The decode chain (index + top-k + attention) with and without
    programmatic dependent launch, by batch size (the default rule's
    threshold), bf16 and fp8 KV."""
    out = []
    for ctx in (8192, 32768):
        for batch in (1, 2, 4, 8, 16, 32):
            for kv_mode in (0, 1):
                bt = Batch([ctx] * batch, 1, kv_mode, dev)
                sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
                o = torch.empty_like(bt.q)
                for pdl in (False, True):
                    tune = dict(pdl=pdl)

                    def total(tune=tune):
                        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                         bt.token_pos, B, TOPK, out=sel,
                                         num_decode_tokens=bt.T, _tune=tune)
                        block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                               bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                               bt.k_scale, bt.v_scale, bt.kv_scales, out=o,
                                               _tune=tune)
                    t = timer.time_fn(total)
                    out.append(dict(kind="pdl", context=ctx, batch=batch, kv_mode=kv_mode,
                                    pdl=pdl, us=t))
                    print(f"[sweep] {out[-1]}", flush=True)
                del bt
    return out


def sweep_pdl_fused(timer, dev, index_block_topk, block_sparse_attention):
    """Small decode batches: the two-launch chain (four kernels) and the
    one-launch variants (fused select + fused merge: two kernels), each with
    and without programmatic dependent launch, bf16 KV; selections and
    outputs checked against the plain chain."""
    out = []
    for ctx in (8192, 32768, 131072):
        for batch in (1, 4, 8):
            bt = Batch([ctx] * batch, 1, 0, dev)
            ref_sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
            ref_o = torch.empty_like(bt.q)
            sel = torch.empty_like(ref_sel)
            o = torch.empty_like(ref_o)
            for fused, pdl in ((False, False), (False, True), (True, False), (True, True)):
                def chain(sel=sel, o=o, fused=fused, pdl=pdl):
                    index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                     bt.token_pos, B, TOPK, out=sel, num_decode_tokens=bt.T,
                                     fused_select=fused, _tune=dict(pdl=pdl))
                    block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                           bt.token_pos, sel, B, D ** -0.5, out=o,
                                           fused_merge=fused, _tune=dict(pdl=pdl))
                try:
                    if not fused and not pdl:
                        chain(sel=ref_sel, o=ref_o)
                    sel.fill_(-7)
                    o.fill_(float("nan"))
                    chain()
                    torch.cuda.synchronize()
                    same = same_selection(sel, ref_sel)
                    diff = float((o.float() - ref_o.float()).abs().max())
                    t = timer.time_fn(chain)
                except Exception as e:  # noqa: BLE001
                    same, diff, t = None, None, repr(e)[:200]
                out.append(dict(kind="pdl_fused", context=ctx, batch=batch, one_launch=fused,
                                pdl=pdl, ids_equal=same, max_diff=diff, us=t))
                print(f"[sweep] {out[-1]}", flush=True)
            del bt
    return out

