"""Whether the v0.23.0 start-up warm-up leaves a kernel variant for a request to
compile, on CPU: every launch a random batch makes must be one the warm-up's plan made.
Run by test_minimax_m3_warmup_coverage.py in a process without TRITON_INTERPRET:

    python tests/models/warmup_coverage.py KV_DTYPE BUDGET SEQS MAX_MODEL_LEN

prints a JSON object: the plan's size, the launches checked and the missing variants
(kernel, first batch that launched it).

A Triton variant is keyed on the launch's constexprs, on which integer arguments are
1 or a multiple of 16, and on which pointers are 16-byte aligned. On the H100
(2026-12-08, ``test_requests_compile_no_kernel_after_start``) a tiny model's
requests still compiled ``index_topk_prefill_kernel``: mixed batches whose token
count is a multiple of 16, and dense-prefix remainders whose token maps start off
a 16-byte boundary, were keys the plan never made. Here both walks run through
the Impl's forward with every launch bound by Triton's own binder for an sm_90
target (``tests/kernels/rocm_compile.stand_in``, nothing runs), at one TP4 rank's
production shapes, and the request batches are drawn at random within the
engine's limits (decode requests, then up to three prefill requests, any context).
"""

import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

from rocm_compile import (D, DI, HKV, HQ, INIT, LOCAL, PAGE, SPARSE_BLOCK,  # noqa: E402
                          TOPK, stand_in)

from vllm.models.minimax_m3.common import sparse_impl_warmup as warmup  # noqa: E402
from vllm.models.minimax_m3.common.backend import MiniMaxM3SparseImpl  # noqa: E402
from vllm.models.minimax_m3.common.kv_scale import KVScaleMode  # noqa: E402
from vllm.models.minimax_m3.common.msa_ops import TritonSparseOps  # noqa: E402


def _layer(kv_dtype: str):
    impl = MiniMaxM3SparseImpl(HQ, D, D ** -0.5, HKV, kv_cache_dtype=kv_dtype,
                               sparse_block=SPARSE_BLOCK, topk_blocks=TOPK,
                               local_blocks=LOCAL, init_blocks=INIT,
                               kv_scales=KVScaleMode.from_config("scalar"))
    impl._ops = TritonSparseOps()
    pages = 4  # nothing runs: only shapes, dtypes and strides matter
    kv_type = torch.float8_e4m3fn if kv_dtype == "fp8" else torch.bfloat16
    return SimpleNamespace(
        impl=impl, kv_cache=torch.empty((pages, 2, PAGE, HKV, D), dtype=kv_type),
        index_cache=SimpleNamespace(kv_cache=torch.empty((pages, PAGE, DI),
                                                         dtype=torch.bfloat16), index_dim=DI),
        _k_scale=torch.ones(()), _v_scale=torch.ones(()))


def _key(launch: dict) -> str:
    return json.dumps([launch[k] for k in ("kernel", "signature", "constexprs", "attrs",
                                           "options")], default=str)


def _random_batches(rng: random.Random, n: int, budget: int, seqs: int, max_model_len: int):
    """(decode tokens, prefill tokens, context, prefill requests) within the limits:
    the scheduler's shapes as ``warm_metadata`` lays them out."""
    for _ in range(n):
        decode = rng.randint(0, seqs - 1)
        reqs = rng.randint(0 if decode else 1, min(3, seqs - decode))
        if reqs == 0:
            yield decode, 0, rng.randint(1, max_model_len), 0
            continue
        tokens = rng.randint(reqs, min(budget - decode, max_model_len))
        # fresh prompts or a chunk late in a long one
        context = tokens if rng.random() < 0.4 else rng.randint(tokens, max_model_len)
        yield decode, tokens, context, reqs


def check(kv_dtype: str, budget: int, seqs: int, max_model_len: int,
          batches: int = 300) -> dict:
    """The plan's launches against those of ``batches`` random request batches."""
    layer = _layer(kv_dtype)
    forward = warmup._Forward(layer, torch.bfloat16, budget + seqs, max_model_len)
    plan = warmup.compile_plan(budget, seqs, max_model_len, forward.layout)
    launches: list[dict] = []
    with stand_in("sm_90", launches):
        for p in plan:
            forward.run(*p)
    warmed = {_key(launch) for launch in launches}
    missing: dict[str, tuple] = {}
    checked = 0
    rng = random.Random(f"{kv_dtype}-{budget}-{seqs}-{max_model_len}")
    for batch in _random_batches(rng, batches, budget, seqs, max_model_len):
        launches.clear()
        with stand_in("sm_90", launches):
            forward.run(*batch)
        checked += len(launches)
        for launch in launches:
            key = _key(launch)
            if key not in warmed:
                missing.setdefault(key, (launch["kernel"].split(":")[1], batch))
    return {"plan": len(plan), "variants": len(warmed), "checked": checked,
            "missing": sorted(set(missing.values()))}


if __name__ == "__main__":
    kv, *limits = sys.argv[1:]
    print(json.dumps(check(kv, *map(int, limits))))
