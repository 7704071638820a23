# SPDX-License-Identifier: Apache-2.0
"""One benchmark run: the correctness check, the floors, the decode and prefill tables
and (``--sweep``) the launch-shape sweeps, as one result dict."""

import datetime
import platform
import time

import torch

from .checks import correctness
from .decode import decode_rows
from .floors import flush_probe, launch_floor
from .harness import B, D, DIDX, HIDX, HKV, HQ, PAGE, TOPK, Timer, copy_bandwidth, load_kernels
from .prefill import prefill_rows
from .report import _git_commit
from .sweeps import sweep


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
    kernels = (index_block_topk, block_sparse_attention)
    res["decode"] = [] if args.prefill_only else decode_rows(timer, dev, kernels, batches,
                                                            ctxs, bw)
    res["prefill"] = [] if args.decode_only else prefill_rows(timer, dev, kernels, ctxs)
    if args.sweep:
        res["sweep"] = sweep(timer, dev, args.sweep_kinds)
    return res
