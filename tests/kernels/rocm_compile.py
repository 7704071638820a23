# SPDX-License-Identifier: Apache-2.0
"""Compile every MSA Triton kernel variant the engine dispatches on an AMD
Instinct GPU, for gfx942 (MI300X / MI325X) and gfx950 (MI355X), on a machine
without a GPU, and check each against the target's limits.

The variants are not listed by hand: they are recorded from the dispatcher.
``record(arch)`` stands a GPU of that arch in for the CPU (the wrappers' one
hardware query, ``triton_ops._utils.device_arch``), replaces
``JITFunction.run`` by a recorder, and drives the sparse layer's Impl
(``MiniMaxM3SparseImpl.forward``: cache write, index + top-k, attention, the
two-launch short decode, the dense prefix) over the batches the engine
builds at production shapes -- one TP4 rank: 16 query heads per KV head,
head_dim 128, index dim 128, sparse block 128, top-16, page (``--block-size``)
128 -- for every KV cache dtype and scale mode, both index-key dtypes and the
engine's ``VLLM_MINIMAX_M3_*`` layout settings.  Each launch is bound by
Triton's own binder for the target (the signature, constexprs, alignment
attributes and options a real launch would compile), nothing runs, and the
distinct launches are compiled with ``triton.compile`` for the target.  A
launch option the HIP backend does not know (``launch_pdl``) fails the
recording.

Prints one line per compiled variant (LDS, registers, spills); ``--json
FILE`` writes the records; ``--record-only`` records the launches of
``--arch`` and writes them without compiling (``sm_90``, the H200
stand-in, is always recorded only: it proves the recording sees the Gluon
kernels and PDL where the engine takes them).  Exit status 1 when a variant exceeds the target's LDS or a
launch fails to compile.  Run by ``test_minimax_m3_rocm_compile.py`` /
``test_minimax_m3_rocm_dispatch.py`` without ``TRITON_INTERPRET``.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

assert not os.environ.get("TRITON_INTERPRET"), "run without TRITON_INTERPRET"

import torch  # noqa: E402

# stand-in GPUs: (arch, compute units, FP8 KV dtype the platform picks)
PROFILES = {
    "gfx942": (304, "float8_e4m3fnuz"),  # MI300X (MI325X: 304 CUs too)
    "gfx950": (256, "float8_e4m3fn"),  # MI355X: OCP e4m3
    "sm_90": (132, "float8_e4m3fn"),  # H200
}

HQ, HKV, D, DI, SPARSE_BLOCK, TOPK, LOCAL, INIT = 16, 1, 128, 128, 128, 16, 1, 0
PAGE = 128  # the seeds' --block-size

# KV cache configurations: (kv_cache_dtype, msa_kv_cache_scales, fp8 index keys)
KV_CONFIGS = [("auto", "scalar", False), ("auto", "scalar", True),
              ("fp8", "scalar", False), ("fp8", "scalar", True),
              ("fp8", "per_token_head", False), ("fp8", "per_token_head", True)]
# batches: decode tokens (one per request) and prefill chunks (tokens, context
# after the chunk), at block tables as wide as max_model_len (8k: the short
# decode; the seeds' 32k and 256k)
BATCHES = ([("decode", b, 0) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
           + [("prefill", n, ctx) for n, ctx in ((16, 16), (200, 4096), (512, 8192),
                                                  (1024, 8192), (2048, 2048), (4096, 32768),
                                                  (8192, 8192), (32768, 32768))]
           + [("mixed", 8, 4096), ("mixed", 4, 32768)])
TABLE_WIDTHS = (8192, 32768, 262144)
# the engine's layout settings: the defaults, then each documented setting
# with the batches it changes ("decode": decode-only batches; "prefill": the
# others; "fp8": scalar-scaled fp8 KV only)
SETTINGS = [({}, "all"),
            ({"VLLM_MINIMAX_M3_SCORE_ATTEND_DECODE": "0"}, "decode"),
            ({"VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE": "1"}, "decode"),
            ({"VLLM_MINIMAX_M3_FOLD_KV_SCALE": "0"}, "fp8"),
            ({"VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR": "0"}, "prefill"),
            ({"VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR": "8"}, "prefill"),
            ({"VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE": "8"}, "prefill"),
            ({"VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE": "1"}, "prefill"),
            ({"VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS": "0"}, "prefill")]


def _applies(scope: str, kind: str, kv_dtype: str, scales: str) -> bool:
    if scope == "decode":
        return kind == "decode"
    if scope == "prefill":
        return kind != "decode"
    if scope == "fp8":
        return kv_dtype == "fp8" and scales == "scalar"
    return True


@contextlib.contextmanager
def stand_in(arch_name: str, record: list):
    """The wrappers see a GPU ``arch_name``; every kernel launch is bound for
    its target and appended to ``record`` instead of running."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from vllm.models.minimax_m3.common.triton_ops import _utils

    units, _ = PROFILES[arch_name]
    arch = _utils.GpuArch(arch_name, units)
    target = (GPUTarget("cuda", int(arch_name[3:]), 32) if arch_name.startswith("sm_")
              else GPUTarget("hip", arch_name, 64))
    backend = make_backend(target)
    binders = {}

    def run(self, *args, grid, warmup, **kwargs):
        if self not in binders:
            binders[self] = create_function_from_signature(self.signature, self.params,
                                                           backend)
        bound, spec, _ = binders[self](*args, **kwargs)
        launch = {k: v for k, v in kwargs.items() if k not in bound}
        options, signature, constexprs, attrs = self._pack_args(
            backend, dict(launch), bound, spec, None)
        record.append(dict(
            kernel=f"{self.fn.__module__}:{self.fn.__name__}", gluon=self.is_gluon(),
            signature=signature, constexprs=[[list(k), v] for k, v in constexprs.items()],
            attrs=[[list(k), v] for k, v in attrs.items()], options=launch))

    def dense(q, kv_cache, block_table, spans, *args):  # torch only: no launches
        return [q.new_empty((s.num_tokens,) + q.shape[1:]) for s in spans]

    from vllm.models.minimax_m3.common import dense_prefix
    saved = (_utils.device_arch, JITFunction.run, dense_prefix.dense_prefix_attention)
    _utils.device_arch = lambda device: arch
    JITFunction.run = run
    dense_prefix.dense_prefix_attention = dense
    try:
        yield
    finally:
        _utils.device_arch, JITFunction.run, dense_prefix.dense_prefix_attention = saved


def _impl(kv_dtype: str, scales: str):
    from vllm.models.minimax_m3.common.backend import MiniMaxM3SparseImpl
    from vllm.models.minimax_m3.common.kv_scale import KVScaleMode
    return MiniMaxM3SparseImpl(HQ, D, D ** -0.5, HKV, kv_cache_dtype=kv_dtype,
                               sparse_block=SPARSE_BLOCK, topk_blocks=TOPK,
                               local_blocks=LOCAL, init_blocks=INIT,
                               kv_scales=KVScaleMode.from_config(scales))


def _metadata(kind: str, n: int, ctx: int, width: int, impl):
    """A batch as the metadata builder lays it out: decode tokens first, then
    one prefill chunk of ``n`` tokens ending at position ``ctx - 1``."""
    from vllm.models.minimax_m3.common import dense_prefix
    from vllm.models.minimax_m3.common.backend import MiniMaxM3SparseMetadata

    q_lens, seq_lens = [], []
    if kind in ("decode", "mixed"):
        q_lens += [1] * n
        seq_lens += [width] * n
    if kind in ("prefill", "mixed"):
        chunk = n if kind == "prefill" else 1024
        q_lens.append(chunk)
        seq_lens.append(min(max(ctx, chunk), width))
    R, T = len(q_lens), sum(q_lens)
    req = torch.repeat_interleave(torch.arange(R, dtype=torch.int32),
                                  torch.tensor(q_lens))
    starts = torch.tensor([0] + q_lens).cumsum(0)
    pos = torch.cat([torch.arange(s - q, s, dtype=torch.int32)
                     for q, s in zip(q_lens, seq_lens)])
    md = MiniMaxM3SparseMetadata(
        num_actual_tokens=T,
        block_table=torch.zeros((R, width // PAGE), dtype=torch.int32),
        token_req=req, token_pos=pos, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        slot_mapping=torch.arange(T, dtype=torch.int64) % PAGE,
        num_decode_tokens=sum(1 for q in q_lens if q == 1),
        max_seq_len=max(seq_lens))
    md.prefill_chunks = dense_prefix.long_prefill_chunks(
        starts.to(torch.int32), torch.tensor(seq_lens, dtype=torch.int32),
        impl.dense_prefix_min_tokens)
    return md


def _forward(impl, md, kv_dtype: str, scales: str, fp8_index: bool, fp8):
    from vllm.models.minimax_m3.common.msa_ops import TritonSparseOps
    impl._ops = TritonSparseOps()
    T = md.num_actual_tokens
    bf16 = torch.bfloat16
    pages = 4  # nothing runs: only shapes, dtypes and strides matter
    width = D + (16 if scales == "per_token_head" and kv_dtype == "fp8" else 0)
    kv = torch.empty((pages, 2, PAGE, HKV, width), dtype=fp8 if kv_dtype == "fp8" else bf16)
    idx = (torch.empty((pages, PAGE, DI + 4), dtype=fp8) if fp8_index
           else torch.empty((pages, PAGE, DI), dtype=bf16))
    layer = type("Layer", (), {"_k_scale": torch.ones((), dtype=torch.float32),
                               "_v_scale": torch.ones((), dtype=torch.float32)})()
    q = torch.empty((T, HQ, D), dtype=bf16)
    k = torch.empty((T, HKV, D), dtype=bf16)
    impl.forward(layer, q, k, k, torch.empty((T, HKV, DI), dtype=bf16),
                 torch.empty((T, DI), dtype=bf16), kv, idx, md, torch.empty_like(q))


def record(arch_name: str) -> list:
    """The launches of every (setting, KV configuration, batch, table width)
    on a stand-in ``arch_name`` GPU, in order (with repeats)."""
    fp8 = getattr(torch, PROFILES[arch_name][1])
    launches = []
    with stand_in(arch_name, launches):
        for setting, scope in SETTINGS:
            saved = {k: os.environ.get(k) for k in setting}
            os.environ.update(setting)
            try:
                for kv_dtype, scales, fp8_index in KV_CONFIGS:
                    impl = None
                    for kind, n, ctx in BATCHES:
                        if not _applies(scope, kind, kv_dtype, scales):
                            continue
                        impl = impl or _impl(kv_dtype, scales)
                        for width in TABLE_WIDTHS:
                            if kind != "decode" and ctx > width:
                                continue
                            md = _metadata(kind, n, ctx, width, impl)
                            _forward(impl, md, kv_dtype, scales, fp8_index, fp8)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
    return launches


def distinct(launches: list) -> list:
    """One launch per constexpr variant: kernel, constexpr parameters,
    pointer dtypes and launch options (the first launch's integer
    specializations -- values of 1, multiples of 16 -- stand for the rest)."""
    seen, out = set(), []
    for rec in launches:
        kernel = _kernel(rec["kernel"])
        names = [p.name for p in kernel.params]
        values = {names[k[0]]: v for k, v in rec["constexprs"]
                  if kernel.params[k[0]].is_constexpr}
        ptrs = {n: t for n, t in rec["signature"].items() if t.startswith("*")}
        key = json.dumps([rec["kernel"], values, ptrs, rec["options"]], sort_keys=True,
                         default=str)
        if key not in seen:
            seen.add(key)
            rec["variant"] = values
            out.append(rec)
    return out


def _kernel(name: str):
    import importlib
    module, fn = name.split(":")
    return getattr(importlib.import_module(module), fn)


def compile_one(arch_name: str, rec: dict) -> dict:
    """Compile one recorded launch for ``arch_name``; its resource use."""
    from triton.compiler import ASTSource

    from kernel_compile import LDS_LIMITS, ROCM_TARGETS, amd_resource_usage, compile_source
    t0 = time.monotonic()
    constexprs = {tuple(k): v for k, v in rec["constexprs"]}
    attrs = {tuple(k): v for k, v in rec["attrs"]}
    src = ASTSource(fn=_kernel(rec["kernel"]), signature=rec["signature"],
                    constexprs=constexprs, attrs=attrs)
    compiled = compile_source(src, ROCM_TARGETS[arch_name], dict(rec["options"]))
    usage = amd_resource_usage(compiled)
    usage["fits"] = usage["lds"] <= LDS_LIMITS[arch_name]
    usage["seconds"] = round(time.monotonic() - t0, 2)
    return usage


def describe(rec: dict) -> str:
    ptrs = {n: t for n, t in rec["signature"].items() if t.startswith("*fp8") or n == "kv_ptr"}
    return f"{rec['kernel'].split(':')[1]} {ptrs} {rec['variant']} {rec['options']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="gfx942,gfx950")
    ap.add_argument("--json", help="write the records (and resource use) here")
    ap.add_argument("--record-only", action="store_true")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("ROCM_COMPILE_JOBS", "2")))
    args = ap.parse_args(argv)
    from kernel_compile import LDS_LIMITS, describe_amd
    out, bad = {}, 0
    for arch_name in args.arch.split(","):
        t0 = time.monotonic()
        launches = record(arch_name)
        variants = distinct(launches)
        print(f"recorded {len(launches)} launches on {arch_name}, {len(variants)} distinct "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
        out[arch_name] = variants
        if args.record_only or arch_name not in LDS_LIMITS:  # sm_90: recorded only
            continue
        t0 = time.monotonic()
        with ProcessPoolExecutor(max(1, args.jobs)) as pool:
            futures = [pool.submit(compile_one, arch_name, rec) for rec in variants]
            for rec, fut in zip(variants, futures):
                try:
                    rec["usage"] = fut.result()
                except Exception as e:  # a compile failure is a finding, not a crash
                    rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
                    print(f"FAILED {arch_name} {describe(rec)}\n  {rec['error']}", flush=True)
                    bad += 1
                    continue
                u = rec["usage"]
                tag = "compiled" if u["fits"] else "OVER-LDS"
                bad += not u["fits"]
                print(f"{tag} {arch_name} {describe(rec)}: {describe_amd(u)} "
                      f"(limit {LDS_LIMITS[arch_name]} B; {u['seconds']} s)", flush=True)
        spilled = sum(1 for r in variants if r.get("usage", {}).get("vgpr_spill_count"))
        print(f"ok {len(variants)} variants {arch_name}: {spilled} spill VGPRs "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, default=str)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
