# SPDX-License-Identifier: Apache-2.0
"""Host time of the sparse layers' dispatch in one decode step: upstream's MSA path
(side A) against the series' (side B), on any CPU.

v0.26.0 runs MiniMax-M3's sparse layers outside CUDA graphs, so at batch-1 decode
the Python each layer runs before its kernels are queued sits on the critical path
of every step. This measures that Python, with each Triton launch replaced by a
no-op that records the kernel: the layers' own code (metadata reads, validation,
token maps, launch-parameter choices, the small PyTorch ops they issue), without
the GPU and without Triton's own launch path, which costs about the same per launch
on both sides and is counted instead (``launches``).

Method: the config-only model's 3 sparse layers per step (released shapes: 4 KV
heads, 64 query heads, head dim 128, 4 index heads of 128, top-16 blocks), bf16,
decode batches of 1 / 8 / 32 over 8k contexts, and prefill steps of one request
(1k new tokens, 1k after 7k, an 8k chunk: there the small PyTorch ops also compute
on the CPU, so their times are inflated; the counts are not); new metadata objects every step (as
vLLM builds them), shared by the step's layers; the series' Triton ops with the
launchers' hardware queries answered as on an H100 (132 SMs, sm_90). Per side and
batch: 30 warm steps, then ``--steps`` timed steps, median and p90; the PyTorch ops
a step issues are counted with a dispatch mode in one extra step.

    python -m benchmarks.engine_ab.host_dispatch [--steps 400] [--out FILE.json]

CPU-side numbers: the absolute microseconds depend on the CPU (and a CUDA build's
per-op dispatch costs more than a CPU op on small tensors); compare the sides and
the op and launch counts.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported

import argparse  # noqa: E402
import copy  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from .cpu_sparse_layer import SparseLayer, make_batch, use_real_triton  # noqa: E402

SHAPES = dict(kv_heads=4, gqa=16, head_dim=128, index_dim=128)
# PyTorch ops that only make a view or allocate: no kernel on a GPU
NO_KERNEL_OPS = frozenset({"aten.slice", "aten.view", "aten.transpose", "aten.as_strided",
                           "aten.alias", "aten.empty", "aten.t", "aten.select",
                           "aten.unsqueeze", "aten.expand", "aten._reshape_alias",
                           "aten.reshape", "aten.permute", "aten.detach"})
TOPK, CONTEXT, SPARSE_LAYERS = 16, 8192, 3


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def stub_launches() -> Counter:
    """Every Triton launch (the interpreter's entry point) records its kernel's name
    and returns without running; returns the counter."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launched = Counter()

    def record(self, *args, grid, warmup, **kwargs):
        launched[self.fn.__name__] += 1

    # the interpreter's kernels, and Gluon ones (compiled JIT functions even under it)
    InterpretedFunction.run = JITFunction.run = record
    return launched


def answer_as_h100() -> None:
    """The series' launchers ask ``device_arch`` for the GPU: answer an H100's."""
    from vllm.models.minimax_m3.common.triton_ops import _utils

    _utils.device_arch = lambda device: _utils.GpuArch("sm_90", 132)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_series_msa(path: str) -> None:
    """Import ``path`` as ``vllm.models.minimax_m3.common.series_msa``."""
    import importlib.util
    import sys

    name = "vllm.models.minimax_m3.common.series_msa"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    import vllm.models.minimax_m3.common as package
    package.series_msa = module


def _tokens(n: int) -> str:
    """1024 -> "1k", 1023 -> "1023" (a length just under a threshold keeps its count)."""
    return f"{n // 1024}k" if n and n % 1024 == 0 else str(n)


def row_label(row: tuple) -> str:
    kind, a, b = row
    return f"decode b{a} at {_tokens(b)}" if kind == "decode" else \
        f"prefill {_tokens(b)} after {_tokens(a)}" if a else f"prefill {_tokens(b)}"


def parse_rows(decode_batches: str, prefills: str) -> list[tuple]:
    """("decode", batch, context) and ("prefill", context before, new tokens) rows."""
    rows = [("decode", int(b), CONTEXT) for b in decode_batches.split(",") if b]
    for p in prefills.split(","):
        if p:
            ctx, _, new = p.partition("+")
            rows.append(("prefill", int(ctx), int(new)))
    return rows


def measure(path: str, row: tuple, steps: int, launched: Counter) -> dict:
    from vllm.models.minimax_m3.common.msa_ops import TritonSparseOps

    kind, a, b = row
    if kind == "decode":
        data = make_batch([b] * a, [], dtype=torch.bfloat16, **SHAPES)
    else:  # prefill work is real CPU compute here: fewer steps
        data = make_batch([], [(a, b)], dtype=torch.bfloat16, **SHAPES)
        steps = max(10, steps // 10)
    layer = SparseLayer(path, data, topk=TOPK, ops=TritonSparseOps(), **SHAPES)
    metadata = dict(layer._context.attn_metadata)

    def step():
        # vLLM builds new metadata objects every step; the step's layers share them
        layer._context.attn_metadata = {k: copy.copy(v) for k, v in metadata.items()}
        for _ in range(SPARSE_LAYERS):
            layer.forward()

    for _ in range(30 if kind == "decode" else 3):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    launched.clear()
    with _CountOps() as counter:
        step()
    times.sort()
    return {"path": path, "row": row_label(row), "batch": a if kind == "decode" else 1,
            "kind": kind, "median_us": 1e6 * statistics.median(times),
            "p90_us": 1e6 * times[int(0.9 * (len(times) - 1))],
            "launches": sum(launched.values()), "kernels": dict(launched),
            "torch_ops": sum(counter.ops.values()), "ops": dict(counter.ops),
            "kernel_ops": sum(n for op, n in counter.ops.items() if op not in NO_KERNEL_OPS)}


def report(rows: list[dict], meta: dict) -> str:
    lines = [f"Host time of the {SPARSE_LAYERS} sparse layers of one engine step "
             f"(launches stubbed), {meta['cpu']}, torch {meta['torch']}, "
             f"vllm {meta['vllm']}, commit {meta['commit']}, {meta['date']}; side B's "
             f"series_msa: {meta['series_msa']}.", "",
             "| row | side | host us / step (median) | p90 | Triton launches / step "
             "| PyTorch ops / step | of them launching a kernel on a GPU |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        side = "A (upstream)" if r["path"] == "upstream" else "B (series)"
        times = (f"{r['median_us']:.1f} | {r['p90_us']:.1f}" if r["kind"] == "decode"
                 else "- | -")   # prefill: the small ops' CPU compute, not host time
        lines.append(f"| {r['row']} | {side} | {times} "
                     f"| {r['launches']} | {r['torch_ops']} | {r['kernel_ops']} |")
    lines += ["", "| row | B / A host time | B - A Triton launches | B - A kernel-launching "
              "PyTorch ops |", "|---|---|---|---|"]
    by = {(r["path"], r["row"]): r for r in rows}
    for label in dict.fromkeys(r["row"] for r in rows):
        a, s = by[("upstream", label)], by[("series", label)]
        ratio = f"{s['median_us'] / a['median_us']:.2f}" if s["kind"] == "decode" else "-"
        lines.append(f"| {label} | {ratio} | "
                     f"{s['launches'] - a['launches']:+d} | "
                     f"{s['kernel_ops'] - a['kernel_ops']:+d} |")
    lines += ["", "Prefill rows: no times (their PyTorch ops compute on the CPU here, over "
              "thousands of tokens, which a GPU does in its kernels); the counts hold.", "",
              "PyTorch ops per step, by op:", ""]
    for r in rows:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(r["ops"].items(), key=lambda x: -x[1]))
        kern = ", ".join(f"{k} {v}" for k, v in sorted(r["kernels"].items()))
        lines.append(f"- {r['path']}, {r['row']}: {ops or 'none'}; kernels: {kern}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batches", default="1,8,32", help="decode batches over 8k contexts")
    p.add_argument("--prefills", default="0+1024,7168+1024,0+8192",
                   help="prefill rows CONTEXT+NEW (one request each; '' for none)")
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--series-msa", metavar="FILE",
                   help="run side B with this series_msa.py instead of the installed one "
                        "(an earlier version, for a before/after row)")
    args = p.parse_args()
    use_real_triton()   # before any of vLLM's kernel modules is imported
    if args.series_msa:
        load_series_msa(args.series_msa)
    launched = stub_launches()
    answer_as_h100()
    torch.set_num_threads(1)
    rows = [measure(path, row, args.steps, launched)
            for row in parse_rows(args.batches, args.prefills)
            for path in ("upstream", "series")]
    import vllm
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu": cpu_name(), "torch": torch.__version__,
            "vllm": vllm.__version__, "commit": commit, "steps": args.steps,
            "series_msa": args.series_msa or "installed"}
    text = report(rows, meta)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows, "report": text}, f, indent=1)


if __name__ == "__main__":
    main()
