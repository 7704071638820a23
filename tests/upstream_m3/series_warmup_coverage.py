"""Whether the v0.26.0 flavor's start-up warm-up (``series_msa_warmup``) leaves a kernel
variant of the series' MSA path for a request to compile, on CPU: every launch the
series' indexer and attention make for a random batch must be one the warm-up's plan
made. Run by test_upstream_m3_series_warmup_coverage.py in a process without
TRITON_INTERPRET:

    python tests/upstream_m3/series_warmup_coverage.py KV_DTYPE BUDGET SEQS MAX_MODEL_LEN

prints a JSON object: the plan's size, the variants it made, the launches checked and
the missing variants (kernel, first batch that launched it: decode contexts, prefill
(context before, new tokens)).

Each launch is bound by Triton's own binder for an sm_90 target (the signature,
constexprs, alignment and integer keys, and options a real launch compiles), nothing
runs; the launchers see an H100 (``triton_ops._utils.device_arch``). The batches are
upstream's metadata as ``benchmarks/engine_ab/cpu_sparse_layer.make_batch`` builds it,
at block tables of the engine's width, one TP4 rank's shapes.
"""

import json
import os
import random
import sys
import types
from pathlib import Path

assert not os.environ.get("TRITON_INTERPRET"), "run without TRITON_INTERPRET"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.engine_ab.cpu_sparse_layer import (BLOCK, SparseLayer,  # noqa: E402
                                                   make_batch)

SHAPES = dict(kv_heads=1, gqa=16, head_dim=128, index_dim=128)   # one TP4 rank
TOPK, PAGES = 16, 4


class Recorder:
    """Inside: every Triton launch is bound for sm_90 and its key kept, nothing runs."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.backend = make_backend(GPUTarget("cuda", 90, 32))
        self.binders, self.keys = {}, []

    def __enter__(self):
        from triton.runtime.jit import JITFunction, create_function_from_signature

        from vllm.models.minimax_m3.common.triton_ops import _utils

        def run(fn, *args, grid, warmup, **kwargs):
            if fn not in self.binders:
                self.binders[fn] = create_function_from_signature(fn.signature, fn.params,
                                                                  self.backend)
            _, spec, options = self.binders[fn](*args, **kwargs)
            self.keys.append((fn.fn.__name__, json.dumps([spec, options], default=str)))

        self.saved = (_utils.device_arch, JITFunction.run)
        _utils.device_arch = lambda device: _utils.GpuArch("sm_90", 132)
        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        from triton.runtime.jit import JITFunction

        from vllm.models.minimax_m3.common.triton_ops import _utils

        _utils.device_arch, JITFunction.run = self.saved


def _layer(batch, kv_fp8: bool, buffer_rows: int) -> SparseLayer:
    from vllm.models.minimax_m3.common.msa_ops import TritonSparseOps

    kv, *rest = batch
    if kv_fp8:
        kv = kv.to(torch.float8_e4m3fn)
    layer = SparseLayer("series", (kv, *rest), topk=TOPK, ops=TritonSparseOps(), **SHAPES)
    layer.attn.use_fp8_kv = kv_fp8
    layer.layer._k_scale = layer.layer._v_scale = torch.ones(())
    # the NVIDIA model's shared top-k buffer holds the engine's largest batch
    layer.buffer = torch.zeros((buffer_rows, SHAPES["kv_heads"], TOPK), dtype=torch.int32)
    layer.index.topk_indices_buffer = layer.layer.topk_indices_buffer = layer.buffer
    return layer


def _batch(decode_ctx, prefill, width):
    return make_batch(decode_ctx, prefill, dtype=torch.bfloat16, table_width=width,
                      pages=PAGES, **SHAPES)


def _random_batches(rng: random.Random, n: int, budget: int, seqs: int, max_model_len: int):
    """(decode contexts, [(context before, new tokens)]) within the engine's limits."""
    for _ in range(n):
        decode = rng.randint(0, seqs - 1)
        reqs = rng.randint(0 if decode else 1, min(3, seqs - decode))
        decode_ctx = [rng.randint(2, max_model_len) for _ in range(decode)]
        prefill, left = [], min(budget - decode, max_model_len)
        for i in range(reqs):
            tokens = rng.randint(1, max(1, left - (reqs - i - 1)))
            left -= tokens
            before = 0 if rng.random() < 0.4 else rng.randint(0, max_model_len - tokens)
            prefill.append((before, tokens))
        yield decode_ctx, prefill


def check(kv_dtype: str, budget: int, seqs: int, max_model_len: int,
          batches: int = 300) -> dict:
    from vllm.models.minimax_m3.common import series_msa_warmup as warm

    kv_fp8 = kv_dtype == "fp8"
    width = -(-max_model_len // BLOCK)
    rows = min(budget, max_model_len) + seqs
    proto = _layer(_batch([2], [], width), kv_fp8, rows)
    layer = types.SimpleNamespace(impl=proto.attn, indexer=types.SimpleNamespace(impl=proto.index),
                                  kv_cache=proto.kv, _k_scale=torch.ones(()),
                                  _v_scale=torch.ones(()))
    launches = warm._Launches(layer, proto.attn._series_ops, torch.bfloat16, rows, max_model_len)
    plan = warm.compile_plan(budget, seqs, max_model_len, launches.layout)
    with Recorder() as rec:
        for p in plan:
            launches.run(*p)
    warmed = set(rec.keys)
    missing, checked = {}, 0
    rng = random.Random(f"{kv_dtype}-{budget}-{seqs}-{max_model_len}")
    for decode_ctx, prefill in _random_batches(rng, batches, budget, seqs, max_model_len):
        with Recorder() as rec:
            _layer(_batch(decode_ctx, prefill, width), kv_fp8, rows).forward()
        checked += len(rec.keys)
        for key in rec.keys:
            if key not in warmed:
                missing.setdefault(key, f"{key[0]}: {len(decode_ctx)} decodes, "
                                        f"prefills (context before, tokens) {prefill}")
    return {"plan": len(plan), "variants": len(warmed), "checked": checked,
            "missing": sorted(set(missing.values()))}


if __name__ == "__main__":
    kv, *limits = sys.argv[1:]
    print(json.dumps(check(kv, *map(int, limits))))
