#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the MiniMax-M3 MSA Triton kernels (GPU only; not a test).

Shapes: one TP4 rank of MiniMax-M3 -- 16 query heads, 1 KV head, head_dim 128,
1 index head of dim 128, top-16 of 128-token sparse blocks.

1. Correctness first, at those real shapes in bf16 and fp8 KV (scalar and
   per-token-head scales), decode and chunked prefill, against a plain torch
   reference (float32/64).  Pass/fail is recorded in the results.
2. Decode: batch 1 and 32 x context 8k/32k/128k x KV bf16/fp8 (scalar scales):
   index+top-k, attention, total -- each a CUDA graph, replayed; median of
   many replays, L2 flushed before each (a warm-L2 median is kept in the JSON);
   the HBM floor (index-key bytes + selected K/V bytes over the device-to-device
   copy bandwidth measured in this run) and dense SDPA over the whole context.
   Plus the one-launch variants (fused top-k select in the index kernel,
   split merge fused into the attention kernel: ``fused_select`` /
   ``fused_merge``) with their own timings and a check of equal results.
   Plus the optional fp8 index-key cache, laid out as the engine does (packed
   pages: keys, then their float32 scales): its index+top-k time, the whole
   step with it (``total fp8-idx``, each KV cache) and the overlap of its
   selection with the bf16 one.
3. Prefill: one request, a chunk of 8192 new tokens at the end of an 8k / 32k /
   128k context, bf16 / fp8 KV: index+top-k, attention, total, and dense causal
   SDPA (lower-right causal mask) on the same chunk.

Inputs are fresh random tensors every run.  Writes ``bench_msa.md`` and
``bench_msa.json`` under ``$OUT`` (default ``./out``).

Usage: python ci/bench_msa.py [--quick] [--prefill-only | --decode-only] [--reps N] [--check-only] [--sweep | --sweep-only]
(--sweep times the launch-shape knobs: decode blocks per program and splits,
prefill tile shapes; it wrote the numbers the wrappers' defaults cite.)
Exit status 1 when the correctness check failed.
The kernels are imported from the installed (patched) vLLM; when that fails
they are loaded straight from this repository's ``vllm_overlay`` tree.
"""

import argparse
import copy
import datetime
import functools
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
HQ, HKV, D, HIDX, DIDX, B, TOPK = 16, 1, 128, 1, 128, 128, 16
# KV page (vLLM block) size in tokens; MSA_BENCH_PAGE=128 times the serving
# command's --block-size 128 (one sparse block per page)
PAGE = int(os.environ.get("MSA_BENCH_PAGE", "64"))
FP8 = torch.float8_e4m3fn
# the KV caches timed: bf16, fp8 e4m3 with scalar per-layer scales, and fp8 with
# per-token-head scales (stored beside the cache)
KV_KINDS = (("bf16", 0), ("fp8", 1), ("fp8-pth", 2))


# ----------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _load_sparse_ops():
    """The reference ops module (torch only): installed, else the overlay's file."""
    try:
        from vllm.models.minimax_m3.common import sparse_ops
        return sparse_ops
    except Exception:  # noqa: BLE001
        path = REPO / "vllm_overlay/vllm/models/minimax_m3/common/sparse_ops.py"
        spec = importlib.util.spec_from_file_location("msa_sparse_ops", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def load_kernels():
    try:
        from vllm.models.minimax_m3.common.triton_ops import (block_sparse_attention,
                                                              index_block_topk)
        return index_block_topk, block_sparse_attention, "installed vllm"
    except Exception as e:  # noqa: BLE001
        err = repr(e)
    pkg = REPO / "vllm_overlay/vllm/models/minimax_m3/common/triton_ops"
    spec = importlib.util.spec_from_file_location(
        "msa_triton_ops", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["msa_triton_ops"] = mod
    spec.loader.exec_module(mod)
    return mod.index_block_topk, mod.block_sparse_attention, f"{pkg} (vllm import failed: {err})"


def score_attend_fn(block_sparse_attention, name="score_attend_decode"):
    """``score_attend_decode`` (or ``name``: ``score_attend_fits``) from the
    package ``block_sparse_attention`` came from."""
    pkg = sys.modules[block_sparse_attention.__module__].__name__.rsplit(".", 1)[0]
    return getattr(importlib.import_module(f"{pkg}.short_decode"), name)


def engine_takes_score_attend(block_sparse_attention, bt, dev):
    """The engine's decode path for this decode batch (``MiniMaxM3SparseImpl.
    _takes_score_attend`` with the block table's width): two launches when
    ``score_attend_fits``, else the four-launch chain."""
    from torch.cuda import get_device_properties
    sms = get_device_properties(dev).multi_processor_count
    max_blocks = -(-bt.block_table.shape[1] * PAGE // B)
    return score_attend_fn(block_sparse_attention, "score_attend_fits")(bt.T, HKV, max_blocks,
                                                                        sms)


def score_attend_step(block_sparse_attention, bt, kv_mode, out, tune=None):
    """A callable running ``score_attend_decode`` on the decode batch ``bt``
    (with ``_tune=tune``)."""
    fn = score_attend_fn(block_sparse_attention)
    return lambda: fn(bt.idx_q, bt.idx_k, bt.q, bt.kv, bt.block_table, bt.token_req,
                      bt.token_pos, B, TOPK, 1, 0, D ** -0.5, kv_mode, bt.k_scale, bt.v_scale,
                      bt.kv_scales, out=out, _tune=tune)


# ----------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------
def quantize_kv(kv, kv_mode):
    """(cache, k_scale, v_scale, kv_scales) of bf16 K/V ``kv`` [num_pages, 2,
    PAGE, HKV, D] stored in ``kv_mode``: 0 as is; 1 fp8 e4m3 with scalar
    scales (amax / 448 of all K, of all V); 2 fp8 with one scale per token and
    KV head (kv_scales [num_pages, 2, PAGE, HKV]; ``PTH_POW2_SCALES=1``: rounded up to
    powers of two, a diagnostic of whether timings depend on the operands' mantissas)."""
    if kv_mode == 0:
        return kv, None, None, None
    if kv_mode == 1:
        amax = kv.float().abs().amax(dim=(0, 2, 3, 4))
        k_scale = (amax[0] / 448.0).reshape(1).contiguous()
        v_scale = (amax[1] / 448.0).reshape(1).contiguous()
        sc = torch.stack([k_scale, v_scale]).view(1, 2, 1, 1, 1)
        return (kv.float() / sc).to(FP8), k_scale, v_scale, None
    kv_scales = (kv.float().abs().amax(-1) / 448.0).clamp_min(1e-8)
    if os.environ.get("PTH_POW2_SCALES") == "1":
        # diagnostic: scales rounded up to powers of two, so the dequantized
        # values keep fp8's 3 mantissa bits (as with scalar scales folded out)
        kv_scales = torch.exp2(torch.ceil(torch.log2(kv_scales)))
    kv_scales = kv_scales.contiguous()
    return (kv.float() / kv_scales[..., None]).to(FP8), None, None, kv_scales


class Batch:
    """Requests laid out in a paged cache (random page order)."""

    def __init__(self, ctxs, new_tokens, kv_mode, dev, idx_fp8=False):
        self.ctxs = ctxs  # total tokens per request (incl. new)
        R = len(ctxs)
        pages = [-(-c // PAGE) for c in ctxs]
        self.max_pages = max(pages)
        num_pages = sum(pages)
        perm = torch.randperm(num_pages, device=dev).to(torch.int32)
        bt = torch.zeros(R, self.max_pages, dtype=torch.int32, device=dev)
        k = 0
        for r, p in enumerate(pages):
            bt[r, :p] = perm[k:k + p]
            k += p
        self.block_table = bt
        req, pos = [], []
        for r, c in enumerate(ctxs):
            req += [r] * new_tokens
            pos += list(range(c - new_tokens, c))
        self.token_req = torch.tensor(req, dtype=torch.int32, device=dev)
        self.token_pos = torch.tensor(pos, dtype=torch.int32, device=dev)
        T = len(pos)
        self.T = T
        self.idx_q = torch.randn(T, HIDX, DIDX, device=dev, dtype=torch.bfloat16)
        self.idx_k = torch.randn(num_pages, PAGE, DIDX, device=dev, dtype=torch.bfloat16)
        self.idx_k8 = self.idx_s = None
        if idx_fp8:
            # the engine's fp8 index cache: packed pages [keys | float32 scales]
            # (DIDX + 4 bytes per token), keys and scales as views of them
            s = self.idx_k.float().abs().amax(-1) / 448.0
            pages = torch.zeros(num_pages, PAGE, DIDX + 4, dtype=FP8, device=dev)
            self.idx_k8, self.idx_s = _load_sparse_ops().fp8_index_cache_views(pages, DIDX)
            self.idx_k8.copy_((self.idx_k.float() / s[..., None]).to(FP8))
            self.idx_s.copy_(s)
        self.q = torch.randn(T, HQ, D, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(num_pages, 2, PAGE, HKV, D, device=dev, dtype=torch.bfloat16)
        self.kv_mode = kv_mode
        self.kv, self.k_scale, self.v_scale, self.kv_scales = quantize_kv(kv, kv_mode)
        del kv

    def with_kv_mode(self, kv_mode):
        """This batch (same pages, queries and index) with its bf16 K/V stored
        in ``kv_mode`` instead (1 fp8 scalar, 2 fp8 per-token-head scales)."""
        assert self.kv_mode == 0 and kv_mode in (1, 2)
        other = copy.copy(self)
        other.kv_mode = kv_mode
        other.kv, other.k_scale, other.v_scale, other.kv_scales = quantize_kv(self.kv, kv_mode)
        return other

    def dequant_kv(self):
        """Float32 [num_pages, 2, PAGE, HKV, D] of what the kernel should see."""
        if self.kv_mode == 0:
            return self.kv.float()
        if self.kv_mode == 1:
            sc = torch.stack([self.k_scale, self.v_scale]).view(1, 2, 1, 1, 1)
            return self.kv.float() * sc
        return self.kv.float() * self.kv_scales[..., None]

    def contiguous_rows(self, cache, r, n=None):
        """[n, ...] rows (default: all ctx) of request r from a paged
        [num_pages, PAGE, ...] cache."""
        n = self.ctxs[r] if n is None else n
        return cache[self.block_table[r, : -(-n // PAGE)].long()].flatten(0, 1)[:n]


# ----------------------------------------------------------------------------
# torch reference (correctness check)
# ----------------------------------------------------------------------------
def ref_block_scores(bt: Batch, idx_k=None, idx_s=None):
    """[T, HIDX, nblocks_max] float32 block scores (+inf forced, -inf invisible)."""
    idx_k = bt.idx_k if idx_k is None else idx_k
    nbm = -(-max(bt.ctxs) // B)
    out = torch.full((bt.T, HIDX, nbm), float("-inf"), device=bt.q.device)
    for r in range(len(bt.ctxs)):
        tok = (bt.token_req == r).nonzero().flatten()
        if tok.numel() == 0:
            continue
        keys = bt.contiguous_rows(idx_k, r).float()
        if idx_s is not None:
            keys = keys * bt.contiguous_rows(idx_s, r).float()[:, None]
        n = keys.shape[0]
        pos = bt.token_pos[tok].long()
        for c0 in range(0, tok.numel(), 1024):
            tk, ps = tok[c0:c0 + 1024], pos[c0:c0 + 1024]
            s = torch.einsum("thd,nd->thn", bt.idx_q[tk].double(), keys.double()).float()
            s = s.masked_fill(torch.arange(n, device=s.device)[None, None, :] > ps[:, None, None],
                              float("-inf"))
            nb = -(-n // B)
            s = torch.nn.functional.pad(s, (0, nb * B - n), value=float("-inf"))
            bs = s.view(len(tk), HIDX, nb, B).amax(-1)
            own = ps // B
            bs[torch.arange(len(tk)), :, own] = float("inf")
            out[tk, :, :nb] = bs
    return out


def check_selection(sel, scores):
    """Fraction of (token, head) rows whose selection is a valid top-k (set equal
    to the reference up to score ties) plus the first failure message."""
    T, H, _ = sel.shape
    sel = sel.long()
    nvis = torch.isfinite(scores).sum(-1) + (scores == float("inf")).sum(-1)
    nvalid = nvis.clamp(max=TOPK)
    ar = torch.arange(TOPK, device=sel.device)
    ok_pack = ((sel >= 0) == (ar[None, None, :] < nvalid[..., None])).all(-1)
    safe = sel.clamp(min=0)
    chosen = torch.gather(scores, 2, safe).masked_fill(sel < 0, float("inf"))
    dup = torch.zeros_like(scores, dtype=torch.int32).scatter_add_(
        2, safe, (sel >= 0).to(torch.int32))
    ok_dup = (dup <= 1).all(-1)
    rest = scores.clone()
    rest.scatter_(2, safe, float("-inf"))
    kth = rest.amax(-1)
    fin = torch.where(torch.isfinite(scores), scores.abs(), torch.zeros_like(scores)).amax(-1)
    ok_thr = chosen.amin(-1) >= kth - 1e-3 * (1 + fin)
    ok = ok_pack & ok_dup & ok_thr
    msg = ""
    if not bool(ok.all()):
        t, h = (~ok).nonzero()[0].tolist()
        msg = (f"token {t} head {h}: got {sel[t, h].tolist()} pack={bool(ok_pack[t, h])} "
               f"dup={bool(ok_dup[t, h])} thr={bool(ok_thr[t, h])}")
    return float(ok.float().mean()), msg


def ref_attention(bt: Batch, sel):
    """[T, HQ, D] float32 reference over the dequantised cache."""
    deq = bt.dequant_kv()
    out = torch.zeros(bt.T, HQ, D, device=bt.q.device)
    G = HQ // HKV
    for r in range(len(bt.ctxs)):
        tok = (bt.token_req == r).nonzero().flatten()
        if tok.numel() == 0:
            continue
        K = bt.contiguous_rows(deq[:, 0], r)  # [n, HKV, D]
        V = bt.contiguous_rows(deq[:, 1], r)
        n = K.shape[0]
        for c0 in range(0, tok.numel(), 256):
            tk = tok[c0:c0 + 256]
            pos = bt.token_pos[tk].long()
            for g in range(HKV):
                s_blk = sel[tk, g].long()  # [t, TOPK]
                kpos = s_blk[:, :, None] * B + torch.arange(B, device=s_blk.device)  # [t,K,B]
                valid = (s_blk[:, :, None] >= 0) & (kpos <= pos[:, None, None]) & (kpos < n)
                kpos = kpos.clamp(0, n - 1).flatten(1)
                valid = valid.flatten(1)
                k = K[kpos, g]  # [t, K*B, D]
                v = V[kpos, g]
                q = bt.q[tk, g * G:(g + 1) * G].float()  # [t, G, D]
                s = torch.einsum("tgd,tnd->tgn", q, k) * D ** -0.5
                s = s.masked_fill(~valid[:, None, :], float("-inf"))
                out[tk, g * G:(g + 1) * G] = torch.einsum("tgn,tnd->tgd", torch.softmax(s, -1), v)
    return out


def correctness(index_block_topk, block_sparse_attention, dev):
    results = []
    cases = [
        ("decode", [100, 127, 128, 5000, 40000, 131072], 1),
        ("prefill", [20000], 1024),
        ("prefill_short", [700], 700),
    ]
    for name, ctxs, new in cases:
        for kv_mode in (0, 1, 2):
            tag = f"{name} kv={['bf16', 'fp8-scalar', 'fp8-per-token-head'][kv_mode]}"
            try:
                bt = Batch(ctxs, new, kv_mode, dev, idx_fp8=(kv_mode == 0))
                nd = bt.T if new == 1 else 0
                sel = torch.full((bt.T, HIDX, TOPK), 999, dtype=torch.int32, device=dev)
                index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                                 B, TOPK, out=sel, num_decode_tokens=nd)
                scores = ref_block_scores(bt)
                frac, msg = check_selection(sel, scores)
                entry = dict(case=tag, topk_valid_fraction=frac, topk_msg=msg)
                if kv_mode == 0:
                    sel8 = index_block_topk(bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req,
                                            bt.token_pos, B, TOPK, idx_k_scales=bt.idx_s,
                                            num_decode_tokens=nd)
                    f8, m8 = check_selection(sel8, ref_block_scores(bt, bt.idx_k8, bt.idx_s))
                    entry.update(fp8_index_valid_fraction=f8, fp8_index_msg=m8,
                                 fp8_index_overlap_with_bf16=overlap(sel8, sel))
                outs = {}
                variants = [dict(num_splits=n) for n in (None, 1, 4)]
                if nd == 0:  # prefill: also the engine's layout (block-major from 1024 tokens)
                    variants.append(default_layout(block_sparse_attention, bt.T, max(ctxs),
                                                   kv_mode != 0))
                    entry["layout"] = variants[-1]
                for i, kw in enumerate(variants):
                    o = torch.full_like(bt.q, float("nan"))
                    block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                           bt.token_pos, sel, B, D ** -0.5, kv_mode, bt.k_scale,
                                           bt.v_scale, bt.kv_scales, out=o, **kw)
                    outs[i] = o
                ref = ref_attention(bt, sel)
                err = max(float((o.float() - ref).abs().max()) for o in outs.values())
                nan = any(bool(o.isnan().any()) for o in outs.values())
                entry.update(attn_max_abs_err=err, attn_ref_max=float(ref.abs().max()))
                entry["passed"] = bool(frac == 1.0 and not nan and err < 2e-2 + 1e-2 * entry["attn_ref_max"]
                                       and entry.get("fp8_index_valid_fraction", 1.0) == 1.0)
            except Exception:  # noqa: BLE001
                entry = dict(case=tag, passed=False, error=traceback.format_exc())
            print(f"[check] {tag}: {'PASS' if entry['passed'] else 'FAIL'} "
                  f"{ {k: v for k, v in entry.items() if k not in ('case', 'error')} }", flush=True)
            if "error" in entry:
                print(entry["error"], flush=True)
            results.append(entry)
            torch.cuda.empty_cache()
    return results


def same_selection(a, b):
    """The same block ids in every row of two selections (the order of the ids
    inside a row is unspecified: arg-max rounds write them by score, the
    threshold search by block id)."""
    return bool(torch.equal(a.sort(dim=-1).values, b.sort(dim=-1).values))


def overlap(a, b):
    """Mean |A & B| / |B| over rows of two selections."""
    a, b = a.long(), b.long()
    m = (a[..., :, None] == b[..., None, :]) & (b[..., None, :] >= 0)
    inter = m.any(-2).sum(-1).float()
    return float((inter / (b >= 0).sum(-1).clamp(min=1)).mean())


# ----------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------

def probe_setup(default_reps=30):
    """What a probe script's main starts with: (its output folder ``$OUT``
    (default ./out, created), the CUDA device, a ``Timer`` of ``$REPS``
    replays); the torch seed fixed at 0."""
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    return out_dir, dev, Timer(dev, int(os.environ.get("REPS", str(default_reps))))


def paired_rounds(timer, graphs, rounds, base="bf16"):
    """Times the CUDA graphs ``graphs`` (name -> graph) in turns, ``rounds``
    rounds of one median each (``Timer.time_graph``), so that drift of the
    GPU's clocks does not decide which is faster.  Returns {"us": per-round
    medians, "median_us": their medians, "<name>_over_<base>": median, min and
    max of the per-round ratios to ``base`` and how many rounds were slower}."""
    per_round = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            per_round[k].append(timer.time_graph(g))
    res = dict(us=per_round, median_us={k: statistics.median(v) for k, v in per_round.items()})
    for k in per_round:
        if k != base:
            ratios = [a / b for a, b in zip(per_round[k], per_round[base])]
            res[f"{k}_over_{base}"] = dict(median=statistics.median(ratios), min=min(ratios),
                                           max=max(ratios),
                                           rounds_slower=sum(r > 1.0 for r in ratios))
    return res


class Timer:
    """CUDA-graph replay timing.  ``flush`` picks the L2 state before each
    timed replay: ``True`` / ``"write"`` zeroes a 256 MiB buffer (the method
    of every run before run 11: it leaves the L2 full of *dirty* lines, so a
    kernel that reads evicts them and pays their write-back to HBM, up to the
    L2's size of foreign writes inside the timed region); ``"read"`` reads a
    256 MiB buffer instead (the L2 holds clean lines of no use to the kernel:
    cold, with nothing to write back); ``False`` leaves it warm (and keeps the
    GPU busy with a ~25 us spin before the replay, as a flush does, so the
    host's enqueue of the replay is not timed: before run 11 warm medians of
    small graphs included it)."""

    def __init__(self, dev, reps):
        self.reps = reps
        self.flush_buf = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=dev)
        self.flush_src = torch.ones(64 * 1024 * 1024, dtype=torch.float32, device=dev)

    def flush(self, mode):
        if mode is True or mode == "write":
            self.flush_buf.zero_()
        elif mode == "read":
            self.flush_src.sum()
        elif mode:
            raise ValueError(f"unknown flush mode {mode!r}")
        else:
            torch.cuda._sleep(50_000)

    def graph(self, fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return g

    def time_graph(self, g, flush=True):
        """Median microseconds of single replays."""
        ts = []
        for _ in range(5):
            g.replay()
        for _ in range(self.reps):
            self.flush(flush)
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            ts.append((e0, e1))
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ts)

    def time_fn(self, fn, flush=True):
        try:
            return self.time_graph(self.graph(fn), flush)
        except Exception:  # noqa: BLE001 - e.g. not capturable: time eagerly
            print("[warn] graph capture failed, timing eagerly:\n" + traceback.format_exc())
            ts = []
            for _ in range(3):
                fn()
            for _ in range(self.reps):
                self.flush(flush)
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                ts.append((e0, e1))
            torch.cuda.synchronize()
            return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ts)


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


def copy_bandwidth(dev):
    n = 2 * 1024 ** 3
    src = torch.empty(n, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        ts.append((e0, e1))
    torch.cuda.synchronize()
    t = statistics.median(a.elapsed_time(b) for a, b in ts) * 1e-3
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / t  # bytes read + written per second


def sdpa_dense_decode(bt: Batch):
    """Dense decode attention over the whole context (contiguous bf16 K/V)."""
    R = len(bt.ctxs)
    n = bt.ctxs[0]
    k = torch.randn(R, HKV, n, D, device=bt.q.device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = bt.q.view(R, 1, HQ, D).transpose(1, 2).contiguous()
    F = torch.nn.functional.scaled_dot_product_attention
    return lambda: F(q, k, v, enable_gqa=True)


def sdpa_dense_prefill(chunk, ctx, dev, flash=False):
    """Dense causal prefill of ``chunk`` new tokens at the end of ``ctx``
    (lower-right causal mask, K/V expanded to the query heads).  ``flash``
    (chunk == ctx only): ``is_causal=True`` on the flash backend, the fastest
    dense kernel torch has for this shape."""
    from torch.nn.attention.bias import causal_lower_right
    q = torch.randn(1, HQ, chunk, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, HKV, ctx, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    F = torch.nn.functional.scaled_dot_product_attention
    k16 = k.expand(1, HQ, ctx, D).contiguous()
    v16 = v.expand(1, HQ, ctx, D).contiguous()
    if flash:
        assert chunk == ctx

        def run():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return F(q, k16, v16, is_causal=True)
        return run
    mask = causal_lower_right(chunk, ctx)
    return lambda: F(q, k16, v16, attn_mask=mask)


def default_layout(block_sparse_attention, tokens, ctx, kv_fp8):
    """The engine's prefill layout for ``tokens`` prefill tokens at ``ctx``
    tokens of context (``default_prefill_layout`` of the kernels' own package;
    the token-tile rule alone for kernels that predate it)."""
    rule = getattr(sys.modules[block_sparse_attention.__module__],
                   "default_prefill_layout", None)
    if rule:
        return rule(tokens, ctx, B, TOPK, kv_fp8)
    return dict(token_tile=default_token_tile(block_sparse_attention, ctx, kv_fp8))


def default_token_tile(block_sparse_attention, ctx, kv_fp8):
    """The engine's token tile for a prefill at ``ctx`` tokens of context
    (``default_prefill_token_tile`` of the kernels' own package; 0 for
    kernels that predate it)."""
    rule = getattr(sys.modules[block_sparse_attention.__module__],
                   "default_prefill_token_tile", None)
    return rule(ctx, B, TOPK, kv_fp8) if rule else 0


# ----------------------------------------------------------------------------
def bench(args):
    dev = torch.device("cuda")
    index_block_topk, block_sparse_attention, src = load_kernels()
    print(f"[info] kernels from {src}", flush=True)
    # importing vLLM (vllm/platforms/cuda.py) turns cuDNN's SDPA off; the dense
    # baseline is SDPA's best backend (with it off, run 11 measured 0.96 instead
    # of 0.49 ms for the 8k prefill chunk)
    torch.backends.cuda.enable_cudnn_sdp(True)
    info = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name(), torch=torch.__version__,
        triton=__import__("triton").__version__, python=platform.python_version(),
        kernels_from=src, reps=args.reps,
        cudnn_sdp=torch.backends.cuda.cudnn_sdp_enabled(),
        commit=_git_commit(), shapes=dict(q_heads=HQ, kv_heads=HKV, head_dim=D,
                                          index_heads=HIDX, index_dim=DIDX, block=B, topk=TOPK,
                                          page_size=PAGE),
        timing="CUDA-graph replay, median of single replays, L2 flushed (256 MiB write) "
               "before each timed replay; *_clean_us: flushed by a 256 MiB read instead "
               "(no dirty lines to write back); *_warm_us without a flush")
    torch.manual_seed(int(time.time_ns() % (1 << 31)))
    res = dict(info=info)
    res["correctness"] = correctness(index_block_topk, block_sparse_attention, dev)
    res["correctness_passed"] = all(e["passed"] for e in res["correctness"])
    bw = copy_bandwidth(dev)
    res["copy_bandwidth_GBps"] = bw / 1e9
    print(f"[info] copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    timer = Timer(dev, args.reps)
    res["launch_floor_us"] = launch_floor(timer, dev)
    print(f"[info] launch floor {res['launch_floor_us']}", flush=True)
    res["flush_probe"] = flush_probe(timer, dev, bw)

    ctxs = [8192, 32768, 131072] if not args.quick else [8192]
    batches = [1, 32] if not args.quick else [1]
    if args.prefill_only:
        batches = []
    dec = []
    for batch in batches:
        for ctx in ctxs:
            for kv_name, kv_mode in KV_KINDS:
                row = dict(batch=batch, context=ctx, kv=kv_name)
                try:
                    bt = Batch([ctx] * batch, 1, kv_mode, dev, idx_fp8=True)
                    sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
                    o = torch.empty_like(bt.q)

                    def idx():
                        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                         bt.token_pos, B, TOPK, out=sel,
                                         num_decode_tokens=bt.T)

                    def attn():
                        block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                               bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                               bt.k_scale, bt.v_scale, bt.kv_scales, out=o)

                    def total():
                        idx()
                        attn()

                    idx()
                    torch.cuda.synchronize()
                    g_idx, g_attn, g_tot = timer.graph(idx), timer.graph(attn), timer.graph(total)
                    row["index_topk_us"] = timer.time_graph(g_idx)
                    row["attention_us"] = timer.time_graph(g_attn)
                    row["total_us"] = timer.time_graph(g_tot)
                    row["total_warm_us"] = timer.time_graph(g_tot, flush=False)
                    row["index_topk_clean_us"] = timer.time_graph(g_idx, "read")
                    row["attention_clean_us"] = timer.time_graph(g_attn, "read")
                    row["total_clean_us"] = timer.time_graph(g_tot, "read")
                    # the engine's path: the chain above, or for batch 1-2 over at most
                    # 64 blocks the two launches of score_attend_decode ("total" is the
                    # engine's; "total chain" the four launches)
                    row["total_chain_us"] = row["total_us"]
                    row["total_chain_clean_us"] = row["total_clean_us"]
                    row["path"] = "chain"
                    if engine_takes_score_attend(block_sparse_attention, bt, dev):
                        o_sa = torch.full_like(o, float("nan"))
                        sa = score_attend_step(block_sparse_attention, bt, kv_mode, o_sa)
                        sa()
                        attn()
                        torch.cuda.synchronize()
                        row["score_attend_max_diff"] = float((o_sa.float() - o.float())
                                                             .abs().max())
                        g_sa = timer.graph(sa)
                        row["path"] = "score_attend"
                        row["total_us"] = timer.time_graph(g_sa)
                        row["total_warm_us"] = timer.time_graph(g_sa, flush=False)
                        row["total_clean_us"] = timer.time_graph(g_sa, "read")
                    # the one-launch decode index (fused select): same ids, own timing
                    sel_f = torch.full_like(sel, -7)

                    def idx_fused():
                        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                         bt.token_pos, B, TOPK, out=sel_f,
                                         num_decode_tokens=bt.T, fused_select=True)

                    o_f = torch.empty_like(o)

                    def attn_fused():
                        block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                               bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                               bt.k_scale, bt.v_scale, bt.kv_scales, out=o_f,
                                               fused_merge=True)

                    def total_fused():
                        idx_fused()
                        attn_fused()
                    idx_fused()
                    torch.cuda.synchronize()
                    row["fused_select_equal"] = same_selection(sel_f, sel)
                    attn()
                    attn_fused()
                    torch.cuda.synchronize()
                    row["fused_merge_max_diff"] = float((o_f.float() - o.float()).abs().max())
                    row["attention_fused_us"] = timer.time_graph(timer.graph(attn_fused))
                    row["index_topk_fused_us"] = timer.time_graph(timer.graph(idx_fused))
                    row["total_fused_us"] = timer.time_graph(timer.graph(total_fused))
                    # programmatic dependent launch through the decode chain (each
                    # kernel starts while the one before it finishes): same ids and
                    # output, own timing
                    sel_p = torch.full_like(sel, -7)
                    o_p = torch.empty_like(o)

                    def idx_pdl():
                        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                         bt.token_pos, B, TOPK, out=sel_p,
                                         num_decode_tokens=bt.T, _tune=dict(pdl=True))

                    def attn_pdl():
                        block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                               bt.token_pos, sel_p, B, D ** -0.5, kv_mode,
                                               bt.k_scale, bt.v_scale, bt.kv_scales, out=o_p,
                                               _tune=dict(pdl=True))

                    def total_pdl():
                        idx_pdl()
                        attn_pdl()
                    total_pdl()
                    torch.cuda.synchronize()
                    row["pdl_select_equal"] = same_selection(sel_p, sel)
                    row["pdl_max_diff"] = float((o_p.float() - o.float()).abs().max())
                    row["index_topk_pdl_us"] = timer.time_graph(timer.graph(idx_pdl))
                    row["attention_pdl_us"] = timer.time_graph(timer.graph(attn_pdl))
                    g_pdl = timer.graph(total_pdl)
                    row["total_pdl_us"] = timer.time_graph(g_pdl)
                    row["total_pdl_warm_us"] = timer.time_graph(g_pdl, flush=False)
                    row["total_pdl_clean_us"] = timer.time_graph(g_pdl, "read")
                    if kv_mode == 1:  # seed 002's A/B at kernel level: scalar scales unfolded
                        row["attention_unfolded_us"] = timer.time_graph(timer.graph(
                            lambda: block_sparse_attention(
                                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                                D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales,
                                out=o_f, fold_scalar_scales=False)))
                    # K and V rows (and with per-token-head scales their fp32 scales)
                    row_bytes = 2 * D * (2 if kv_mode == 0 else 1) + (8 if kv_mode == 2 else 0)
                    kv_bytes = B * row_bytes * HKV * min(TOPK, ctx // B)
                    byt = batch * (ctx * DIDX * 2 + kv_bytes)
                    row["floor_us"] = byt / bw * 1e6
                    if bt.idx_k8 is not None:  # the fp8 index cache, with this KV cache
                        sel8 = torch.empty_like(sel)

                        def idx8():
                            index_block_topk(bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req,
                                             bt.token_pos, B, TOPK, idx_k_scales=bt.idx_s,
                                             out=sel8, num_decode_tokens=bt.T)
                        g8 = timer.graph(idx8)
                        row["index_topk_fp8idx_us"] = timer.time_graph(g8)
                        row["index_topk_fp8idx_clean_us"] = timer.time_graph(g8, "read")
                        row["floor_fp8idx_us"] = batch * (ctx * (DIDX + 4) + kv_bytes) / bw * 1e6
                        # the whole step with the fp8 index (the issue's "decode batch 32
                        # at 128k at most 160 us" is this total, not the index alone)
                        o8 = torch.empty_like(o)

                        def total8():
                            idx8()
                            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                                   bt.token_pos, sel8, B, D ** -0.5, kv_mode,
                                                   bt.k_scale, bt.v_scale, bt.kv_scales,
                                                   out=o8)
                        g8t = timer.graph(total8)
                        row["total_fp8idx_us"] = timer.time_graph(g8t)
                        row["total_fp8idx_clean_us"] = timer.time_graph(g8t, "read")
                    if kv_mode == 0:
                        idx()
                        idx8()
                        row["fp8idx_topk_overlap"] = overlap(sel8, sel)
                        row["dense_us"] = timer.time_fn(sdpa_dense_decode(bt))
                    del bt
                except Exception:  # noqa: BLE001
                    row["error"] = traceback.format_exc()
                    print(row["error"], flush=True)
                torch.cuda.empty_cache()
                print(f"[decode] {row}", flush=True)
                dec.append(row)
    res["decode"] = dec

    pre = []
    chunk = 8192
    for ctx in ([] if args.decode_only else ctxs):
        for kv_name, kv_mode in KV_KINDS:
            row = dict(chunk=chunk, context=ctx, kv=kv_name)
            try:
                bt = Batch([ctx], chunk, kv_mode, dev)
                sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
                o = torch.empty_like(bt.q)

                def idx():
                    index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                     bt.token_pos, B, TOPK, out=sel, num_decode_tokens=0)

                # the engine's launch shape: block-major for long chunks, else
                # token tiles by the context-length rule
                layout = default_layout(block_sparse_attention, chunk, ctx, kv_mode != 0)
                row["layout"] = layout

                def attn(tm=None):
                    kw = layout if tm is None else dict(token_tile=tm)
                    block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                           bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                           bt.k_scale, bt.v_scale, bt.kv_scales, out=o, **kw)

                def total():
                    idx()
                    attn()

                idx()
                row["index_topk_ms"] = timer.time_fn(idx) / 1e3
                row["attention_ms"] = timer.time_fn(attn) / 1e3
                row["attention_per_token_ms"] = timer.time_fn(lambda: attn(0)) / 1e3
                row["total_ms"] = timer.time_fn(total) / 1e3
                flops = 4 * HQ * D * (sel >= 0).sum().item() * B  # upper bound (full blocks)
                row["attention_TFLOPs"] = flops / (row["attention_ms"] * 1e-3) / 1e12
                if kv_mode == 0:
                    row["dense_ms"] = timer.time_fn(sdpa_dense_prefill(chunk, ctx, dev)) / 1e3
                    if ctx == chunk:  # the whole context: plain causal, flash kernels
                        row["dense_flash_ms"] = timer.time_fn(
                            sdpa_dense_prefill(chunk, ctx, dev, flash=True)) / 1e3
                try:  # variants: a failure here keeps the row's main numbers
                    # token tiles: one program per TM consecutive tokens, each distinct
                    # selected block of the tile read once (sparse_attn_tiled)
                    for tm in (2, 4, 8):
                        o_t = torch.full_like(o, float("nan"))

                        def attn_tiled(tm=tm, o_t=o_t):
                            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                                   bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                                   bt.k_scale, bt.v_scale, bt.kv_scales, out=o_t,
                                                   token_tile=tm)
                        attn_tiled()
                        attn()
                        torch.cuda.synchronize()
                        row[f"tiled{tm}_max_diff"] = float((o_t.float() - o.float()).abs().max())
                        row[f"attention_tiled{tm}_ms"] = timer.time_fn(attn_tiled) / 1e3
                    row["tile4_distinct_blocks"] = distinct_per_tile(sel, 4)
                    # block-major: pairs grouped by block on the device, up to BM
                    # (token, slot) pairs of one block per program, merged per token
                    for bm in (4, 8):
                        o_b = torch.full_like(o, float("nan"))

                        def attn_bm(bm=bm, o_b=o_b):
                            block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                                   bt.token_pos, sel, B, D ** -0.5, kv_mode,
                                                   bt.k_scale, bt.v_scale, bt.kv_scales,
                                                   out=o_b, block_major=bm)
                        try:
                            attn_bm()
                            attn(0)
                            torch.cuda.synchronize()
                            row[f"block_major{bm}_max_diff"] = float(
                                (o_b.float() - o.float()).abs().max())
                            row[f"attention_block_major{bm}_ms"] = timer.time_fn(attn_bm) / 1e3
                        except Exception:  # noqa: BLE001 -- kernels that predate it
                            row[f"block_major{bm}_error"] = traceback.format_exc()[-400:]
                    # prefill-like selections: index queries shared by 256-token windows
                    # (plus noise), so neighbouring tokens choose mostly the same blocks,
                    # as real text does; random index queries (above) are the worst case
                    win = 256
                    base = torch.randn(-(-bt.T // win), HIDX, DIDX, device=dev)
                    qc = (base.repeat_interleave(win, 0)[:bt.T]
                          + 0.3 * torch.randn(bt.T, HIDX, DIDX, device=dev)).to(bt.idx_q.dtype)
                    selc = index_block_topk(qc, bt.idx_k, bt.block_table, bt.token_req,
                                            bt.token_pos, B, TOPK, num_decode_tokens=0)
                    row["corr_tile4_distinct_blocks"] = distinct_per_tile(selc, 4)
                    row["attention_corr_ms"] = timer.time_fn(lambda: block_sparse_attention(
                        bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, selc, B,
                        D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o)) / 1e3
                    for tm in (4, 8):
                        row[f"attention_corr_tiled{tm}_ms"] = timer.time_fn(
                            lambda tm=tm: block_sparse_attention(
                                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, selc, B,
                                D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o,
                                token_tile=tm)) / 1e3
                    if kv_mode == 1:  # scalar scales unfolded (seed 002's A/B)
                        row["attention_unfolded_ms"] = timer.time_fn(lambda: block_sparse_attention(
                            bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                            D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o,
                            fold_scalar_scales=False)) / 1e3
                except Exception:  # noqa: BLE001
                    row["variant_error"] = traceback.format_exc()
                    print(row["variant_error"], flush=True)
                del bt
            except Exception:  # noqa: BLE001
                row["error"] = traceback.format_exc()
                print(row["error"], flush=True)
            torch.cuda.empty_cache()
            print(f"[prefill] {row}", flush=True)
            pre.append(row)
    res["prefill"] = pre
    if args.sweep:
        res["sweep"] = sweep(timer, dev, args.sweep_kinds)
    return res


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


def distinct_per_tile(sel, tm):
    """Mean number of distinct selected blocks (first index head) per tile of
    ``tm`` consecutive tokens: what the token-tiled attention reads per tile
    (``tm * topk`` if no two tokens share a block)."""
    n = sel.shape[0] // tm * tm
    s = sel[:n, 0].reshape(-1, tm * sel.shape[2]).sort(dim=1).values
    new = (s[:, 1:] != s[:, :-1]) & (s[:, 1:] >= 0)
    return float((new.sum(1) + (s[:, 0] >= 0)).float().mean())


SWEEP_KINDS = ("decode", "prefill_index", "prefill_tiles", "prefill_attn", "fp8_index",
               "prefill_index_shapes", "pdl", "l2", "prefill_index_wide", "pdl_fused",
               "block_major", "decode_profile", "decode_variants", "decode_attn_warps",
               "prefill_attn_profile", "index_tiles", "read_ceiling", "kv_dtype_parity",
               "latency_floor", "prefill_index_split")


def env_shapes(name, default):
    """(batch, context) pairs from the environment variable ``name``, written
    "BxC,BxC" (e.g. "32x8192,1x32768"), else from ``default``; set but empty:
    none."""
    return [tuple(int(v) for v in s.split("x"))
            for s in os.environ.get(name, default).split(",") if s]


def checked_time(timer, run, check=lambda: None):
    """(check(), median microseconds of ``run``), or (None, the error's repr)
    when either raises: one failing sweep variant does not end the sweep."""
    try:
        return check(), timer.time_fn(run)
    except Exception as e:  # noqa: BLE001
        return None, repr(e)[:200]


def sweep(timer, dev, kinds=SWEEP_KINDS):
    """Tuning sweep of the launch-shape knobs (not part of the table); ``kinds``
    picks the sweeps and their order (decode index + attention, prefill index,
    prefill attention, decode index over the fp8 index-key cache)."""
    index_block_topk, block_sparse_attention, _ = load_kernels()
    runners = dict(decode=sweep_decode, prefill_index=sweep_prefill_index,
                   prefill_tiles=sweep_prefill_tiles, prefill_attn=sweep_prefill_attn,
                   fp8_index=sweep_fp8_index, prefill_index_shapes=sweep_prefill_index_shapes,
                   pdl=sweep_pdl, l2=sweep_l2, prefill_index_wide=sweep_prefill_index_wide,
                   pdl_fused=sweep_pdl_fused, block_major=sweep_block_major,
                   decode_profile=sweep_decode_profile, decode_variants=sweep_decode_variants,
                   decode_attn_warps=sweep_decode_attn_warps,
                   prefill_attn_profile=sweep_prefill_attn_profile,
                   index_tiles=sweep_index_tiles, read_ceiling=sweep_read_ceiling,
                   kv_dtype_parity=sweep_kv_dtype_parity, latency_floor=sweep_latency_floor,
                   prefill_index_split=sweep_prefill_index_split)
    out = []
    for kind in kinds:
        out += runners[kind](timer, dev, index_block_topk, block_sparse_attention)
    return out


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


def kernel_times(fn, timer, flush="write", reps=30):
    """Median device time (us) of every kernel ``fn`` launches, by kernel name,
    from the profiler's kernel records: ``reps`` eager calls, the L2 flushed
    before each (``Timer.flush``; the flush's own kernel is left out)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            timer.flush(flush)
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if any(w in e.name.lower() for w in ("elementwise", "fill", "reduce", "memset",
                                             "sleep", "spin")):
            continue  # the flush
        times.setdefault(e.name.split("(")[0][:60], []).append(e.time_range.elapsed_us())
    return {k: dict(median_us=statistics.median(v), n=len(v)) for k, v in times.items()}


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


def sweep_prefill_index(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index tile shapes and prefetch_rows."""
    out = []
    # prefill index: an 8192-token chunk at the end of 32k and 128k contexts;
    # the default launch, then the causal mask skipped on fully visible
    # blocks, more stages, and more context splits (programs per SM)
    for ctx in (131072, 32768):
        bt = Batch([ctx], 8192, 0, dev)
        ref = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                               B, TOPK, num_decode_tokens=0)
        for splits, tune in ((None, None), (None, dict(skip_full_mask=True)),
                             (None, dict(num_stages=3)),
                             (None, dict(skip_full_mask=True, num_stages=3)),
                             (2, None), (4, None), (8, None),
                             (4, dict(skip_full_mask=True)), (8, dict(skip_full_mask=True)),
                             (4, dict(skip_full_mask=True, num_stages=3))):
            def run():
                return index_block_topk(
                    bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                    num_decode_tokens=0, context_splits=splits, _tune=tune)
            same, t = checked_time(
                timer, run,
                lambda: same_selection(run(), ref))
            out.append(dict(kind="prefill_index", context=ctx, context_splits=splits,
                            tune=tune, ids_equal_default=same, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_index_split(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index, 8192-token chunk at the end of 8k / 32k / 128k contexts:
    each tile's splits dividing the blocks its rows see (the default) against fixed
    context ranges (``split_visible=False``), with the block table as wide as
    the context and as wide as a 128k-token engine's (``table`` 131072: the
    fixed ranges are then sized by the table, not the context)."""
    out = []
    for ctx in (8192, 32768, 131072):
        bt = Batch([ctx], 8192, 0, dev)
        tables = {ctx: bt.block_table}
        if ctx < 131072:
            wide = torch.zeros(1, 131072 // PAGE, dtype=torch.int32, device=dev)
            wide[:, :bt.block_table.shape[1]] = bt.block_table
            tables[131072] = wide
        ref = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                               B, TOPK, num_decode_tokens=0, _tune=dict(split_visible=False))
        variants = [("visible", None), ("fixed", dict(split_visible=False))]
        # INDEX_SPLIT_TUNES: more variants, "name:json _tune" joined by ";"
        variants += [(name, json.loads(tune)) for name, tune in
                     (spec.split(":", 1) for spec in
                      filter(None, os.environ.get("INDEX_SPLIT_TUNES", "").split(";")))]
        for width, table in tables.items():
            for name, tune in variants[:2] if width != ctx else variants:
                def run():
                    return index_block_topk(bt.idx_q, bt.idx_k, table, bt.token_req,
                                            bt.token_pos, B, TOPK, num_decode_tokens=0,
                                            _tune=tune)
                same, t = checked_time(
                    timer, run,
                    lambda: bool(torch.equal(run().sort(-1).values, ref.sort(-1).values)))
                try:  # each kernel's device time (profiler), the table as wide as the context
                    kt = kernel_times(run, timer, reps=10) if width == ctx else None
                except Exception as e:  # noqa: BLE001
                    kt = repr(e)[:200]
                out.append(dict(kind="prefill_index_split", context=ctx, table=width,
                                splits=name, tune=tune, ids_equal_fixed=same, us=t, kernels=kt))
                print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_index_wide(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index with 256 query rows per program (each key tile feeds
    twice the rows) against the default 128, 8192-token chunk at 128k / 32k."""
    out = []
    for ctx in (131072, 32768):
        bt = Batch([ctx], 8192, 0, dev)
        ref = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                               B, TOPK, num_decode_tokens=0)
        for tune in (None, dict(BLOCK_M=256, num_warps=8), dict(BLOCK_M=256, num_warps=4),
                     dict(BLOCK_M=128, num_warps=8), dict(BLOCK_M=128, num_warps=4, num_stages=1)):
            def run():
                return index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                        bt.token_pos, B, TOPK, num_decode_tokens=0, _tune=tune)
            same, t = checked_time(
                timer, run,
                lambda: same_selection(run(), ref))
            out.append(dict(kind="prefill_index_wide", context=ctx, tune=tune,
                            ids_equal_default=same, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_index_shapes(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill index tile shapes and prefetch_rows (run 7's sweep)."""
    out = []
    for ctx in (32768, 131072):
        bt = Batch([ctx], 8192, 0, dev)
        for tune in (dict(BLOCK_M=64, num_warps=4), dict(BLOCK_M=64, num_warps=8),
                     dict(BLOCK_M=128, num_warps=4), dict(BLOCK_M=128, num_warps=8),
                     dict(BLOCK_M=128, num_warps=8, num_stages=2),
                     dict(BLOCK_M=64, num_warps=4, num_stages=2),
                     dict(BLOCK_M=128, num_warps=4, prefetch_rows=True),
                     dict(BLOCK_M=64, num_warps=4, prefetch_rows=True)):
            _, t = checked_time(timer, lambda: index_block_topk(
                bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                num_decode_tokens=0, _tune=tune))
            out.append(dict(kind="prefill_index", context=ctx, tune=tune, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_prefill_tiles(timer, dev, index_block_topk, block_sparse_attention):
    """Token tiles of the prefill attention by context length (the rule's
    threshold): an 8192-token chunk at the end of 8k-64k contexts, the
    index's own selections, bf16 and fp8 KV, TM 0 (one token per program),
    2, 4, 8."""
    out = []
    for ctx in (8192, 16384, 32768, 65536):
        for kv_mode in (0, 1):
            bt = Batch([ctx], 8192, kv_mode, dev)
            sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                   bt.token_pos, B, TOPK, num_decode_tokens=0)
            o = torch.empty_like(bt.q)
            for tm in (0, 2, 4, 8):
                t = timer.time_fn(lambda tm=tm: block_sparse_attention(
                    bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B, D ** -0.5,
                    kv_mode, bt.k_scale, bt.v_scale, None, out=o, token_tile=tm))
                out.append(dict(kind="prefill_tiles", kv_mode=kv_mode, context=ctx,
                                token_tile=tm, rule=default_token_tile(
                                    block_sparse_attention, ctx, kv_mode != 0),
                                distinct_per_4=distinct_per_tile(sel, 4), us=t))
                print(f"[sweep] {out[-1]}", flush=True)
            del bt
    return out


def sweep_block_major(timer, dev, index_block_topk, block_sparse_attention):
    """Block-major prefill attention (``block_major`` pairs per program, warps)
    against one token per program and the context-length rule, an 8192-token
    chunk at the end of 8k-128k contexts, the index's own selections, bf16 and
    fp8 KV; each variant's output is compared with one token per program's.
    ``BLOCK_MAJOR_VARIANTS`` (comma-separated names) times only those
    variants, without the side launches and the short chunks;
    ``BLOCK_MAJOR_KV_MODES`` picks the KV scale modes (default ``0,1``; 2 = fp8
    with per-token-head scales)."""
    out = []
    only = {v for v in os.environ.get("BLOCK_MAJOR_VARIANTS", "").split(",") if v}
    kv_modes = [int(m) for m in os.environ.get("BLOCK_MAJOR_KV_MODES", "0,1").split(",")]
    for ctx in (8192, 32768, 131072):
        for kv_mode in kv_modes:
            bt = Batch([ctx], 8192, kv_mode, dev)
            sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                   bt.token_pos, B, TOPK, num_decode_tokens=0)
            ref = torch.empty_like(bt.q)
            o = torch.empty_like(bt.q)
            rule = default_token_tile(block_sparse_attention, ctx, kv_mode != 0)
            for name, kw in (("per_token", dict(token_tile=0)),
                             ("rule", dict(token_tile=rule)),
                             ("bm4", dict(block_major=4)), ("bm8", dict(block_major=8)),
                             ("bm4_c128", dict(block_major=4,
                                               _tune=dict(pairs_per_program=128))),
                             ("bm4_mw2", dict(block_major=4, _tune=dict(merge_warps=2))),
                             # the default is one stage since run 10
                             ("bm4_s2", dict(block_major=4, _tune=dict(num_stages=2))),
                             ("bm4_c32", dict(block_major=4,
                                              _tune=dict(pairs_per_program=32))),
                             ("bm4_w8", dict(block_major=4, _tune=dict(num_warps=8))),
                             ("bm2", dict(block_major=2)),
                             ("bm8_w4", dict(block_major=8, _tune=dict(num_warps=4))),
                             # each step's rows loaded during the step before (the
                             # default unless the cache is fp8), forced on and off
                             ("bm4_pf", dict(block_major=4, _tune=dict(prefetch_pairs=True))),
                             ("bm4_nopf", dict(block_major=4,
                                               _tune=dict(prefetch_pairs=False))),
                             # fp8 cache: the held block in bf16, the MMA in bf16 (with
                             # and without the prefetch); the same as bm4 for bf16
                             ("bm4_qmma", dict(block_major=4, _tune=dict(
                                 query_mma=True, prefetch_query=True))),
                             # prefetch without the query rows (loaded at the step's top)
                             ("bm4_pfnoq", dict(block_major=4, _tune=dict(
                                 prefetch_pairs=True, prefetch_query=False))),
                             ("bm4_qmma_pfnoq", dict(block_major=4, _tune=dict(
                                 query_mma=True, prefetch_pairs=True, prefetch_query=False))),
                             # the fp8 default before run 11 (fp16 MMA, no prefetch)
                             ("bm4_fp16_nopf", dict(block_major=4, _tune=dict(
                                 query_mma=False, prefetch_pairs=False))),
                             ("bm4_qmma_nopf", dict(block_major=4, _tune=dict(
                                 query_mma=True, prefetch_pairs=False))),
                             # scalar fp8 scales: v_scale in the kernel's partials (and
                             # then, to avoid spills, no query prefetch: the default
                             # before run 17), or in the merge without the query prefetch
                             ("bm4_vkern", dict(block_major=4, _tune=dict(
                                 v_scale_in_merge=False))),
                             ("bm4_vmerge_noq", dict(block_major=4, _tune=dict(
                                 prefetch_query=False))),
                             # per-token-head scales (BLOCK_MAJOR_KV_MODES=2) multiplied
                             # into the held block once, both prefetches (the default
                             # since run 19), or at each step in an fp16 MMA without
                             # prefetch (the default before)
                             ("bm4_m2held", dict(block_major=4, _tune=dict(
                                 scale_held_kv=True))),
                             ("bm4_m2step", dict(block_major=4, _tune=dict(
                                 scale_held_kv=False))),
                             # the chunk in slices of at most this many MiB of partial
                             # outputs (default 512: one slice for 8192 tokens x 16
                             # heads x top-16 in fp16), so each slice's partials may
                             # still be in L2 (60 MiB) when its merge reads them
                             *((f"bm4_pb{mib}", dict(block_major=4, _tune=dict(
                                 partial_bytes=mib << 20))) for mib in (32, 64, 128, 256)),
                             # the grouping's counters added once per pair instead
                             # of once per group and program (the default, whose
                             # programs sort their pairs by group)
                             ("bm4_per_pair_ranks", dict(block_major=4, _tune=dict(
                                 aggregate_ranks=False)))):
                if only and name not in only and name != "per_token":
                    continue

                def run(o=o, kw=kw):
                    return block_sparse_attention(
                        bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                        D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales, out=o, **kw)
                try:
                    if name == "per_token":
                        run(o=ref)
                    o.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    diff = float((o.float() - ref.float()).abs().max())
                    t = timer.time_fn(run)
                except Exception as e:  # noqa: BLE001
                    diff, t = None, repr(e)[:200]
                out.append(dict(kind="block_major", context=ctx, kv_mode=kv_mode, variant=name,
                                max_diff=diff, us=t))
                print(f"[sweep] {out[-1]}", flush=True)
            if not only:
                out.extend(block_major_parts(timer, bt, sel, ctx, kv_mode))
            del bt
    if only:
        return out
    # short chunks: where the grouping's fixed cost stops paying
    for n in (256, 512, 1024, 2048, 4096):
        for kv_mode in (0, 1):
            bt = Batch([32768], n, kv_mode, dev)
            sel = index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req,
                                   bt.token_pos, B, TOPK, num_decode_tokens=0)
            o = torch.empty_like(bt.q)
            for name, kw in (("per_token", dict(token_tile=0)), ("bm4", dict(block_major=4))):
                t = timer.time_fn(lambda kw=kw: block_sparse_attention(
                    bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B,
                    D ** -0.5, kv_mode, bt.k_scale, bt.v_scale, None, out=o, **kw))
                out.append(dict(kind="block_major", context=32768, tokens=n, kv_mode=kv_mode,
                                variant=name, us=t))
                print(f"[sweep] {out[-1]}", flush=True)
            del bt
    return out


def block_major_parts(timer, bt, sel, ctx, kv_mode):
    """The block-major path's two side launches alone: the device-side
    grouping of the pairs (64 per program) and the per-token merge of the
    TOPK per-block partials (fp16, as for a bf16 model) by warps, with its
    read bandwidth."""
    from vllm.models.minimax_m3.common.triton_ops.attention import block_major_tiles
    from vllm.models.minimax_m3.common.triton_ops.sparse_attn_merge import (
        sparse_attn_merge_kernel)
    T = bt.q.shape[0]
    max_blocks = bt.block_table.shape[1] * bt.kv.shape[2] // B
    res = []
    t = timer.time_fn(lambda: block_major_tiles(bt.token_req, sel, bt.block_table.shape[0],
                                                max_blocks, 64))
    res.append(dict(kind="block_major", context=ctx, kv_mode=kv_mode, variant="grouping_only",
                    us=t))
    part_o = torch.randn((T, HQ, TOPK, D), dtype=torch.float16, device=bt.q.device)
    part_lse = torch.randn((T, HQ, TOPK), dtype=torch.float32, device=bt.q.device)
    o = torch.empty_like(bt.q)
    for warps in (1, 2):
        t = timer.time_fn(lambda: sparse_attn_merge_kernel[(T, HQ)](
            part_o, part_lse, o, part_lse, o.stride(0), o.stride(1), HQ=HQ, S=TOPK,
            S_PAD=TOPK, D=D, D_PAD=D, num_warps=warps))
        res.append(dict(kind="block_major", context=ctx, kv_mode=kv_mode,
                        variant=f"merge_only_w{warps}", us=t,
                        gb_s=(part_o.numel() * 2 + part_lse.numel() * 4) / t / 1e3))
    for r in res:
        print(f"[sweep] {r}", flush=True)
    return res


def sweep_prefill_attn(timer, dev, index_block_topk, block_sparse_attention):
    """Prefill attention key tiles, warps, stages and prefetch_rows."""
    out = []
    for kv_mode in (0, 1):
        bt = Batch([32768], 8192, kv_mode, dev)
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        o = torch.empty_like(bt.q)
        index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B,
                         TOPK, out=sel, num_decode_tokens=0)
        for tune in (dict(BLOCK_N=64, num_warps=4), dict(BLOCK_N=128, num_warps=4),
                     dict(BLOCK_N=128, num_warps=8), dict(BLOCK_N=32, num_warps=4),
                     dict(BLOCK_N=64, num_warps=4, num_stages=3),
                     dict(BLOCK_N=128, num_warps=8, num_stages=3),
                     dict(BLOCK_N=128, num_warps=4, prefetch_rows=True),
                     dict(BLOCK_N=64, num_warps=4, prefetch_rows=True)):
            _, t = checked_time(timer, lambda: block_sparse_attention(
                bt.q, bt.kv, bt.block_table, bt.token_req, bt.token_pos, sel, B, D ** -0.5,
                kv_mode, bt.k_scale, bt.v_scale, None, out=o, _tune=tune))
            out.append(dict(kind="prefill_attn", kv_mode=kv_mode, context=32768, tune=tune, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_fp8_index(timer, dev, index_block_topk, block_sparse_attention):
    """Decode index over the fp8 index-key cache: blocks per program, software
    pipelining and warps (half the bytes of bf16 per block, the same chain of
    dependent loads, so the best launch shape may differ); every variant's
    selection is checked against the default's."""
    out = []
    for batch, ctx in ((32, 131072), (32, 32768), (32, 8192), (4, 131072), (1, 8192)):
        bt = Batch([ctx] * batch, 1, 0, dev, idx_fp8=True)
        ref = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        sel = torch.empty_like(ref)
        index_block_topk(bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req, bt.token_pos, B,
                         TOPK, idx_k_scales=bt.idx_s, out=ref, num_decode_tokens=bt.T)
        for bpp, tune in ((None, None), (1, None), (2, None), (4, None), (8, None),
                          (2, dict(decode_stages=2)), (4, dict(decode_stages=2)),
                          (4, dict(decode_stages=3)), (8, dict(decode_stages=3)),
                          (8, dict(decode_stages=4)), (16, dict(decode_stages=4)),
                          (4, dict(decode_warps=2)), (4, dict(decode_stages=3, decode_warps=8))):
            def run():
                return index_block_topk(
                    bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                    idx_k_scales=bt.idx_s, out=sel, num_decode_tokens=bt.T,
                    blocks_per_prog=bpp, _tune=tune)
            def same_as_ref():
                run()
                return same_selection(sel, ref)
            same, t = checked_time(timer, run, same_as_ref)
            out.append(dict(kind="fp8_index_decode", batch=batch, context=ctx,
                            blocks_per_prog=bpp, tune=tune, ids_equal_default=same, us=t))
            print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def sweep_index_tiles(timer, dev, index_block_topk, block_sparse_attention):
    """Decode index scoring several sparse blocks per key load (``tile_blocks``),
    bf16 and fp8 index keys, against each kind's default launch; every variant's
    selection is checked against the default's.  INDEX_TILE_SHAPES narrows it."""
    variants = {
        False: ((None, None), (2, dict(tile_blocks=2)), (4, dict(tile_blocks=2)),
                (4, dict(tile_blocks=2, decode_stages=2)), (8, dict(tile_blocks=4))),
        True: ((None, None), (4, dict(tile_blocks=2)), (4, dict(tile_blocks=2, decode_stages=3)),
               (8, dict(tile_blocks=2, decode_stages=3)), (8, dict(tile_blocks=2, decode_stages=2)),
               (4, dict(tile_blocks=2, decode_stages=2, decode_warps=8)),
               (8, dict(tile_blocks=4, decode_stages=2)), (16, dict(tile_blocks=4, decode_stages=3)),
               (8, dict(tile_blocks=4)), (16, dict(tile_blocks=2, decode_stages=2)),
               (16, dict(tile_blocks=2, decode_stages=3)), (8, dict(tile_blocks=2, decode_stages=4)),
               (8, dict(tile_blocks=2, decode_stages=2, decode_warps=2))),
    }
    return _sweep_index_variants(timer, dev, index_block_topk, variants, "index_tiles")


def _sweep_index_variants(timer, dev, index_block_topk, variants, kind):
    """Times each (blocks_per_prog, _tune) of ``variants[fp8_index]`` at the
    INDEX_TILE_SHAPES; its ids against the default launch's (equal, overlap).
    (Run 50 timed two more decode dot forms here, the keys as the MMA's left
    operand and the dot in e4m3; neither was faster: 2026-12-02-gpu-h200-run50.md.)"""
    out = []
    for batch, ctx in env_shapes("INDEX_TILE_SHAPES", "32x131072,32x32768,32x8192,1x8192"):
        bt = Batch([ctx] * batch, 1, 0, dev, idx_fp8=True)
        for fp8 in (False, True):
            keys = dict(idx_k_scales=bt.idx_s) if fp8 else {}
            k = bt.idx_k8 if fp8 else bt.idx_k
            ref = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
            sel = torch.empty_like(ref)
            index_block_topk(bt.idx_q, k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                             out=ref, num_decode_tokens=bt.T, **keys)
            for bpp, tune in variants[fp8]:
                def run(bpp=bpp, tune=tune):
                    return index_block_topk(
                        bt.idx_q, k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK,
                        out=sel, num_decode_tokens=bt.T, blocks_per_prog=bpp, _tune=tune, **keys)
                ov = {}

                def same_as_ref(run=run, ov=ov):
                    run()
                    ov["overlap"] = overlap(sel, ref)
                    return same_selection(sel, ref)
                same, t = checked_time(timer, run, same_as_ref)
                out.append(dict(kind=kind, batch=batch, context=ctx, fp8_index=fp8,
                                blocks_per_prog=bpp, tune=tune, ids_equal_default=same,
                                overlap_default=ov.get("overlap"), us=t))
                print(f"[sweep] {out[-1]}", flush=True)
        del bt
    return out


def _git_commit():
    if os.environ.get("GIT_COMMIT"):  # the caller knows the commit (device copies may lack .git)
        return os.environ["GIT_COMMIT"]
    try:
        return subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def _f(x, nd=1):
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def to_markdown(res):
    i = res["info"]
    L = [f"# MiniMax-M3 MSA Triton kernels: benchmark",
         "",
         f"date {i['date']}, GPU {i['gpu']}, commit {i['commit']}, torch {i['torch']}, "
         f"triton {i['triton']}; shapes: {i['shapes']}.",
         f"Timing: {i['timing']}. Copy bandwidth (this run): "
         f"{res.get('copy_bandwidth_GBps', 0):.0f} GB/s.",
         "",
         f"Correctness at real shapes: **{'PASS' if res.get('correctness_passed') else 'FAIL'}**",
         ""]
    lf = res.get("launch_floor_us")
    if lf:
        L += ["Launch floor (graph of n one-program kernels, each a chain of 3 dependent "
              "loads; us, flushed / warm): "
              + ", ".join(f"{n} kernels {_f(lf.get(f'{n}_kernels'))} / "
                          f"{_f(lf.get(f'{n}_kernels_warm'))}" for n in (1, 2, 4)) + ".", ""]
    for e in res.get("correctness", []):
        L.append(f"- {e['case']}: {'pass' if e['passed'] else 'FAIL'}"
                 + (f" (top-k valid {e.get('topk_valid_fraction')}, attn max err "
                    f"{_f(e.get('attn_max_abs_err'), 4)}"
                    + (f", fp8-index valid {e.get('fp8_index_valid_fraction')}, overlap with bf16 "
                       f"{_f(e.get('fp8_index_overlap_with_bf16'), 3)}"
                       if 'fp8_index_valid_fraction' in e else "") + ")"
                    if 'error' not in e else " (exception, see JSON)"))
    L += ["", "KV: bf16; fp8 = e4m3 with scalar per-layer scales; fp8-pth = e4m3 with "
          "per-token-head scales (their bytes are in the floor).",
          "", "## Decode (microseconds)", "",
          "total = the engine's path: `chain` (index+top-k then attention: four "
          "launches) or `score_attend` (batch 1-2 over at most 64 blocks: every visible "
          "block scored and attended, the top-k merged; two launches); total chain = the "
          "four launches.", "",
          "| batch | context | KV | index+top-k | attention | total | path | total chain "
          "| floor | total/floor | dense "
          "| index+top-k fp8-idx | total fp8-idx | floor fp8-idx | fp8-idx overlap "
          "| index+top-k fused select | attention fused merge | total fused "
          "| attention fp8 unfolded | index+top-k PDL | attention PDL | total PDL "
          "| total PDL / floor |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("decode", []):
        ratio = (r["total_us"] / r["floor_us"]) if "total_us" in r and "floor_us" in r else None
        L.append(f"| {r['batch']} | {r['context'] // 1024}k | {r['kv']} | "
                 f"{_f(r.get('index_topk_us'))} | {_f(r.get('attention_us'))} | "
                 f"{_f(r.get('total_us'))}"
                 f"{'' if r.get('score_attend_max_diff', 0.0) < 1e-2 else ' (output DIFFERS)'} | "
                 f"{r.get('path', 'chain')} | {_f(r.get('total_chain_us'))} | "
                 f"{_f(r.get('floor_us'))} | {_f(ratio, 2)} | "
                 f"{_f(r.get('dense_us'))} | {_f(r.get('index_topk_fp8idx_us'))} | "
                 f"{_f(r.get('total_fp8idx_us'))} | "
                 f"{_f(r.get('floor_fp8idx_us'))} | {_f(r.get('fp8idx_topk_overlap'), 3)} | "
                 f"{_f(r.get('index_topk_fused_us'))}"
                 f"{'' if r.get('fused_select_equal', True) else ' (ids DIFFER)'} | "
                 f"{_f(r.get('attention_fused_us'))}"
                 f"{'' if r.get('fused_merge_max_diff', 0.0) < 1e-2 else ' (output DIFFERS)'} | "
                 f"{_f(r.get('total_fused_us'))} | {_f(r.get('attention_unfolded_us'))} | "
                 f"{_f(r.get('index_topk_pdl_us'))}"
                 f"{'' if r.get('pdl_select_equal', True) else ' (ids DIFFER)'} | "
                 f"{_f(r.get('attention_pdl_us'))}"
                 f"{'' if r.get('pdl_max_diff', 0.0) < 1e-2 else ' (output DIFFERS)'} | "
                 f"{_f(r.get('total_pdl_us'))} | "
                 f"{_f(r['total_pdl_us'] / r['floor_us'] if 'total_pdl_us' in r and 'floor_us' in r else None, 2)} |"
                 + (" ERROR |" if "error" in r else ""))
    fp = res.get("flush_probe")
    if fp:
        L += ["", "## What the L2 flush costs a read-only kernel (microseconds)", "",
              f"One read of a buffer (Triton, 16-byte loads); L2 {fp['l2_bytes'] >> 20} MiB. "
              "Write flush = 256 MiB zeroed before the replay (dirty L2), read flush = "
              "256 MiB read (clean L2).", "",
              "| buffer | floor | write flush | read flush | warm | write - read "
              "| read flush, 16 KiB per program |",
              "|---|---|---|---|---|---|---|"]
        for k, v in fp.items():
            if isinstance(v, dict):
                L.append(f"| {k} | {_f(v['floor_us'])} | {_f(v['write_flush_us'])} | "
                         f"{_f(v['read_flush_us'])} | {_f(v['warm_us'])} | "
                         f"{_f(v['write_flush_us'] - v['read_flush_us'])} | "
                         f"{_f(v.get('read_flush_16k_us'))} |")
    if any("total_clean_us" in r for r in res.get("decode", [])):
        L += ["", "## Decode with a clean L2 (flushed by a 256 MiB read; microseconds)", "",
              "| batch | context | KV | index+top-k | attention | total | path | total chain "
              "| total PDL | floor | total/floor | PDL/floor | index+top-k fp8-idx |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res.get("decode", []):
            fl = r.get("floor_us")
            tc, tp = r.get("total_clean_us"), r.get("total_pdl_clean_us")
            L.append(f"| {r['batch']} | {r['context'] // 1024}k | {r['kv']} | "
                     f"{_f(r.get('index_topk_clean_us'))} | {_f(r.get('attention_clean_us'))} | "
                     f"{_f(tc)} | {r.get('path', 'chain')} | {_f(r.get('total_chain_clean_us'))} | "
                     f"{_f(tp)} | {_f(fl)} | "
                     f"{_f(tc / fl if tc and fl else None, 2)} | "
                     f"{_f(tp / fl if tp and fl else None, 2)} | "
                     f"{_f(r.get('index_topk_fp8idx_clean_us'))} |")
    L += ["", "## Prefill: token-tiled attention (milliseconds; distinct blocks per 4-token "
          "tile, at most 4 x top-k)", "",
          "| context | KV | selection | distinct blocks / 4 tokens | attention | tiled 4 | tiled 8 |",
          "|---|---|---|---|---|---|---|"]
    for r in res.get("prefill", []):
        if "attention_corr_ms" not in r:
            continue
        L.append(f"| {r['context'] // 1024}k | {r['kv']} | random | "
                 f"{_f(r.get('tile4_distinct_blocks'))} | "
                 f"{_f(r.get('attention_per_token_ms', r.get('attention_ms')), 3)} | "
                 f"{_f(r.get('attention_tiled4_ms'), 3)} | {_f(r.get('attention_tiled8_ms'), 3)} |")
        L.append(f"| {r['context'] // 1024}k | {r['kv']} | prefill-like | "
                 f"{_f(r.get('corr_tile4_distinct_blocks'))} | "
                 f"{_f(r.get('attention_corr_ms'), 3)} | "
                 f"{_f(r.get('attention_corr_tiled4_ms'), 3)} | "
                 f"{_f(r.get('attention_corr_tiled8_ms'), 3)} |")
    L += ["", "## Prefill, chunk of 8192 at the end of the context (milliseconds)", "",
          "attention = the engine's launch (layout: BM4 = block-major, 4 pairs per step, "
          "for chunks of at least 1024 tokens; else TM = token tile by the context-length rule, "
          "TM0 = one token per program); dense = SDPA with a lower-right causal mask; "
          "dense FA2 = SDPA `is_causal` forced onto its flash (FlashAttention-2) backend (chunk = context only; the default backend choice is faster).", "",
          "| context | KV | index+top-k | layout | attention | total | dense | dense FA2 "
          "| attention per token | attention TFLOP/s "
          "| attention fp8 unfolded | attention tiled 2 | attention tiled 4 | attention tiled 8 "
          "| attention block-major 4 | attention block-major 8 |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("prefill", []):
        L.append(f"| {r['context'] // 1024}k | {r['kv']} | {_f(r.get('index_topk_ms'), 3)} | "
                 f"{_layout_name(r)} | "
                 f"{_f(r.get('attention_ms'), 3)} | {_f(r.get('total_ms'), 3)} | "
                 f"{_f(r.get('dense_ms'), 3)} | {_f(r.get('dense_flash_ms'), 3)} | "
                 f"{_f(r.get('attention_per_token_ms'), 3)} | "
                 f"{_f(r.get('attention_TFLOPs'), 0)} | "
                 f"{_f(r.get('attention_unfolded_ms'), 3)} | "
                 + " | ".join(_f(r.get(f"attention_tiled{tm}_ms"), 3)
                              + ("" if r.get(f"tiled{tm}_max_diff", 0.0) < 2e-2 else " (DIFFERS)")
                              for tm in (2, 4, 8)) + " | "
                 + " | ".join(_f(r.get(f"attention_block_major{bm}_ms"), 3)
                              + ("" if r.get(f"block_major{bm}_max_diff", 0.0) < 2e-2
                                 else " (DIFFERS)")
                              for bm in (4, 8)) + " |"
                 + (" ERROR |" if "error" in r else ""))
    return "\n".join(L) + "\n"


def _layout_name(row):
    lay = row.get("layout") or dict(token_tile=row.get("token_tile_rule", 0))
    if lay.get("block_major"):
        return f"BM{lay['block_major']}"
    return f"TM{lay.get('token_tile', 0)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=100, help="timed replays per measurement")
    ap.add_argument("--quick", action="store_true", help="8k context, batch 1 only")
    ap.add_argument("--prefill-only", action="store_true",
                    help="the correctness check and the prefill table, no decode table")
    ap.add_argument("--decode-only", action="store_true",
                    help="the correctness check and the decode table, no prefill table")
    ap.add_argument("--check-only", action="store_true", help="only the correctness check")
    ap.add_argument("--sweep", action="store_true", help="also sweep the launch-shape knobs")
    ap.add_argument("--sweep-only", action="store_true", help="only the launch-shape sweep")
    ap.add_argument("--sweep-kinds", default=",".join(SWEEP_KINDS),
                    help=f"comma-separated subset of {','.join(SWEEP_KINDS)}")
    args = ap.parse_args()
    kinds = tuple(k for k in args.sweep_kinds.split(",") if k)
    bad = [k for k in kinds if k not in SWEEP_KINDS]
    if bad:
        ap.error(f"unknown --sweep-kinds {bad}; choose from {', '.join(SWEEP_KINDS)}")
    args.sweep_kinds = kinds
    out = Path(os.environ.get("OUT", "./out"))
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("bench_msa.py needs a GPU (CUDA or ROCm); nothing to do.", file=sys.stderr)
        return 2
    if args.sweep_only:
        res = dict(sweep=sweep(Timer(torch.device("cuda"), args.reps), torch.device("cuda"),
                               kinds),
                   correctness_passed=True)
        (out / "bench_msa_sweep.json").write_text(json.dumps(res, indent=1))
        return 0
    if args.check_only:
        idx, attn, src = load_kernels()
        res = dict(info=dict(kernels_from=src), correctness=correctness(idx, attn,
                                                                        torch.device("cuda")))
        res["correctness_passed"] = all(e["passed"] for e in res["correctness"])
    else:
        res = bench(args)
    (out / "bench_msa.json").write_text(json.dumps(res, indent=1))
    if not args.check_only:
        md = to_markdown(res)
        (out / "bench_msa.md").write_text(md)
        print(md)
    print(f"[info] results in {out}/bench_msa.json", flush=True)
    return 0 if res["correctness_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
