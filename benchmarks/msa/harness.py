# SPDX-License-Identifier: Apache-2.0
"""Shared harness of the MSA benchmark: shapes, kernel loading, CUDA-graph timing
(``Timer``), paired rounds, per-kernel profiler times and the dense SDPA baselines."""

import functools
import importlib
import importlib.util
import os
import statistics
import sys
import traceback
from pathlib import Path

import torch



REPO = Path(__file__).resolve().parents[2]


HQ, HKV, D, HIDX, DIDX, B, TOPK = 16, 1, 128, 1, 128, 128, 16


# command's --block-size 128 (one sparse block per page)
PAGE = int(os.environ.get("MSA_BENCH_PAGE", "64"))


FP8 = torch.float8_e4m3fn


# per-token-head scales (stored beside the cache)
KV_KINDS = (("bf16", 0), ("fp8", 1), ("fp8-pth", 2))


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


def tuned(op: str, fn):
    """``fn`` (a kernel wrapper of the package that ``op`` names for
    ``launch_overrides``) taking a benchmark-only ``_tune`` dict: the call runs
    inside ``launch_overrides(op, **_tune)``, which is how the product's
    launch choices are overridden (the wrappers themselves take no ``_tune``)."""
    launch_overrides = importlib.import_module(
        fn.__module__.rsplit(".", 1)[0]).launch_overrides

    @functools.wraps(fn)
    def call(*args, _tune=None, **kwargs):
        with launch_overrides(op, **(_tune or {})):
            return fn(*args, **kwargs)

    return call


def load_kernels():
    """(index_block_topk, block_sparse_attention, where from): the installed
    vllm's kernels, else the overlay's files; both take ``_tune`` (``tuned``)."""
    try:
        from vllm.models.minimax_m3.common.triton_ops import (block_sparse_attention,
                                                              index_block_topk)
        return (tuned("index", index_block_topk),
                tuned("attention", block_sparse_attention), "installed vllm")
    except Exception as e:  # noqa: BLE001
        err = repr(e)
    # the overlay's ``common`` package (the kernels import its ``envs``)
    common = REPO / "vllm_overlay/vllm/models/minimax_m3/common"
    spec = importlib.util.spec_from_file_location(
        "msa_common", common / "__init__.py", submodule_search_locations=[str(common)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["msa_common"] = mod
    spec.loader.exec_module(mod)
    mod = importlib.import_module("msa_common.triton_ops")
    return (tuned("index", mod.index_block_topk), tuned("attention", mod.block_sparse_attention),
            f"{common / 'triton_ops'} (vllm import failed: {err})")


def score_attend_fn(block_sparse_attention, name="score_attend_decode"):
    """``score_attend_decode`` (taking ``_tune``, see ``tuned``; or ``name``:
    ``score_attend_fits``) from the package ``block_sparse_attention`` came from."""
    pkg = block_sparse_attention.__module__.rsplit(".", 1)[0]
    got = getattr(importlib.import_module(f"{pkg}.short_decode"), name)
    return tuned("score_attend", got) if name == "score_attend_decode" else got


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


def sdpa_dense_decode(bt):
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


def distinct_per_tile(sel, tm):
    """Mean number of distinct selected blocks (first index head) per tile of
    ``tm`` consecutive tokens: what the token-tiled attention reads per tile
    (``tm * topk`` if no two tokens share a block)."""
    n = sel.shape[0] // tm * tm
    s = sel[:n, 0].reshape(-1, tm * sel.shape[2]).sort(dim=1).values
    new = (s[:, 1:] != s[:, :-1]) & (s[:, 1:] >= 0)
    return float((new.sum(1) + (s[:, 0] >= 0)).float().mean())


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

