# SPDX-License-Identifier: Apache-2.0
"""Where one engine decode step's time goes: per kernel, per kernel family, per
decoder layer, and the host's share. Run by ``python -m benchmarks.engine_ab
--profile`` once per side (the side is picked by VLLM_MINIMAX_M3_MSA, as for the
rows), in the side's own process with the engine in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the profiler sees the model's kernels.

Method (the decode step alone, without the prefill that precedes it):
  * kernels: torch.profiler (CPU + CUDA) around ``generate`` of ``steps + 1`` tokens
    and around ``generate`` of 1 token, on fresh prompts of the same shape; each
    kernel's device time in the second is subtracted from the first and divided by
    ``steps``: device time per decode step, per kernel name (CUDA-graph replays
    included: CUPTI reports the kernels of a replayed graph);
  * host share: the step's wall time (same difference of the two calls' wall times)
    minus its summed kernel time. Kernels of one stream do not overlap, so a
    positive remainder is time the GPU waited for the host;
  * layers (``--eager`` only: hooks do not run inside captured graphs): CUDA events
    around every decoder layer's forward, median over the decode calls.
``--prefill`` profiles one prefill instead: a fresh ``--ctx``-token prompt (default
32768, chunks of 8192) generating one token, after a warm prefill of the same length;
the step is the whole prefill (every chunk), its wall time the engine's TTFT without a
server, and (eager) each layer's time summed over the chunks. The first prefill at each
length is timed on its own (``first_wall_ms``: what a new length costs in the engine,
compilation included); then ``--repeats`` unprofiled ones on fresh prompts give the median wall time
without the profiler's overhead (``wall_median_ms``; at 1k tokens the profiler's share
of a 30 ms prefill is not small). ``--ctx`` takes a comma list for prefills (e.g.
``1023,1024``: each side of a layout threshold), all in one engine start; each length
gets its own JSON, ``--out`` with ``-ctx<N>`` before ``.json`` when there are several.
Writes ``--out`` (JSON) and prints a markdown summary.
"""

import argparse
import contextlib
import json
import os
import re
import statistics
import time

from .side import _prompts, engine_kwargs, serving_limits

# Kernel families, first match wins (names of the series' and of upstream's kernels).
FAMILIES = (
    ("KV cache write", r"reshape_and_cache|cache_write|write_sparse_cache|kv_insert"),
    ("MSA index / top-k", r"index|topk|score_attend|select_blocks"),
    ("MSA sparse attention", r"sparse_attn|block_major|short_decode|msa|sparse"),
    # before dense attention: flashinfer's RMSNorm kernels are named flashinfer::norm::...
    ("norm / RoPE / activation", r"norm|rope|rotary|silu|swiglu|act_|gelu"),
    ("dense attention", r"flash|fmha|attention|attn"),
    # moe_align_block_size, not cuBLAS's "...aligna4_alignc4..." GEMM names
    ("MoE", r"moe|expert|marlin|router|grouped|permute|align_block"),
    ("GEMM", r"gemm|cublas|cutlass|xmma|nvjet|matmul|mm_|_mm"),
)


def family(name: str) -> str:
    low = name.lower()
    for fam, pattern in FAMILIES:
        if re.search(pattern, low):
            return fam
    return "other"


def _is_device_event(evt) -> bool:
    """True for a kernel or memcpy as the GPU ran it; False for the host-side operator
    (``aten::mm``, ``vllm::moe_forward_shared``) that launched it."""
    return str(getattr(evt, "device_type", "")).rsplit(".", 1)[-1] in ("CUDA", "PrivateUse1")


def _kernel_times(prof, cuda: bool) -> dict[str, float]:
    """Device (CUDA) time per kernel or, on CPU, self CPU time per op name, in
    microseconds. With CUDA only the device-side events count: the profiler also gives
    the launching operator the device time of the kernels it launched directly, and
    summing both counted a kernel twice (found in the 2026-12-07 prefill profile: the
    kernel sum exceeded the step's wall time)."""
    out: dict[str, float] = {}
    for evt in prof.key_averages():
        if cuda and not _is_device_event(evt):
            continue
        t = getattr(evt, "self_device_time_total", None) if cuda else evt.self_cpu_time_total
        if cuda and t is None:
            t = getattr(evt, "self_cuda_time_total", 0.0)
        if t and t > 0:
            out[evt.key] = out.get(evt.key, 0.0) + float(t)
    return out


def _layer_hooks(model):
    """CUDA-event (CPU: perf_counter) pairs around every decoder layer's forward."""
    import torch

    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    log: list[list] = [[] for _ in layers]

    def pre(i):
        def hook(mod, args, kwargs=None):
            mark = torch.cuda.Event(enable_timing=True) if torch.cuda.is_available() \
                else time.perf_counter()
            if not isinstance(mark, float):
                mark.record()
            tokens = next((a.shape[0] for a in args if hasattr(a, "shape")), 0)
            log[i].append([tokens, mark, None])
        return hook

    def post(i):
        def hook(mod, args, output):
            mark = torch.cuda.Event(enable_timing=True) if torch.cuda.is_available() \
                else time.perf_counter()
            if not isinstance(mark, float):
                mark.record()
            log[i][-1][2] = mark
        return hook

    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(pre(i))
        layer.register_forward_hook(post(i))
    model._step_profile_log = log
    return [type(m).__name__ for m in layers]


def _layer_ms(model, batch: int) -> list[float | None]:
    """Median ms of each layer's forward over the calls with ``batch`` tokens; with
    ``batch`` 0, each layer's summed ms over the calls of more than one token (the chunks
    of the prefills logged since the last ``_clear_layer_log``)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    out = []
    for calls in model._step_profile_log:
        ms = [(b.elapsed_time(e) if not isinstance(b, float) else (e - b) * 1e3)
              for tokens, b, e in calls
              if (tokens == batch if batch else tokens > 1) and e is not None]
        value = (statistics.median(ms) if batch else sum(ms)) if ms else None
        out.append(round(value, 4) if value is not None else None)
    return out


def _clear_layer_log(model) -> None:
    for calls in model._step_profile_log:
        calls.clear()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--eager", action="store_true", help="no graphs; adds per-layer times")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", default="",
                   help="context tokens (default 8192, --prefill 32768; smoke 512); with "
                        "--prefill a comma list profiles each length in one engine start")
    p.add_argument("--repeats", type=int, default=10,
                   help="--prefill: unprofiled prefills timed before the profiled one")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--serving-limits", action="store_true",
                   help="the serving matrix's max_model_len and batched tokens (132096, 32768) "
                        "instead of the A/B rows' (40960, 8192)")
    p.add_argument("--prefill", action="store_true",
                   help="profile one prefill of --ctx tokens (batch 1) instead of decode steps")
    args = p.parse_args()
    if args.smoke and args.serving_limits:
        p.error("--serving-limits sizes the engine for the GPU's 128k serving rows; leave it "
                "off with --smoke")
    default_ctx = 512 if args.smoke else 32768 if args.prefill else 8192
    ctxs = parse_ctx_list(args.ctx, default_ctx)
    if len(ctxs) > 1 and not args.prefill:
        p.error("--ctx takes one length for decode steps; a comma list needs --prefill")
    if args.prefill and args.batch != 1:
        p.error("--prefill profiles one request: leave --batch at 1")
    import random

    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    kw = engine_kwargs(args.smoke)
    if args.serving_limits:
        kw.update(serving_limits())
    if args.eager:
        kw.pop("compilation_config", None)
        kw["enforce_eager"] = True
    llm = LLM(model=args.model, load_format="dummy", block_size=128, skip_tokenizer_init=True,
              language_model_only=True, enable_prefix_caching=False,
              enable_chunked_prefill=True, max_num_seqs=32, seed=0, **kw)
    cuda = torch.cuda.is_available()
    layer_names = llm.apply_model(_layer_hooks)[0] if args.eager else []
    vocab = 512 if args.smoke else 32000
    rng = random.Random(0)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def run(tokens: int, ctx: int, profiled: bool = True) -> tuple[float, dict]:
        sp = SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=0.0,
                            ignore_eos=True, detokenize=False)
        prompts = _prompts(args.batch, ctx, vocab, rng)
        with (profile(activities=acts) if profiled else contextlib.nullcontext()) as prof:
            t = time.perf_counter()
            llm.generate(prompts, sp, use_tqdm=False)
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - t
        return wall, (_kernel_times(prof, cuda) if profiled else {})

    for ctx in ctxs:
        walls, first_ms = [], None
        if args.prefill:  # the whole prefill of one fresh prompt (its token comes with it)
            first_ms = run(1, ctx, profiled=False)[0] * 1e3   # the first at this length
            walls = [run(1, ctx, profiled=False)[0] * 1e3 for _ in range(args.repeats)]
            if args.eager:
                llm.apply_model(_clear_layer_log)
            wall, kernels = run(1, ctx)
            per_step = {k: round(v, 2) for k, v in kernels.items() if v > 0.05}
            step_ms = wall * 1e3
        else:
            run(args.steps + 1, ctx)                # warm: compilation, autotuning, first launches
            run(1, ctx)
            long_wall, long_k = run(args.steps + 1, ctx)
            short_wall, short_k = run(1, ctx)
            per_step = {k: (long_k.get(k, 0.0) - short_k.get(k, 0.0)) / args.steps
                        for k in set(long_k) | set(short_k)}
            per_step = {k: round(v, 2) for k, v in per_step.items() if v > 0.05}
            step_ms = (long_wall - short_wall) / args.steps * 1e3
        result = summarize(per_step, step_ms, cuda, args, ctx,
                           torch.cuda.get_device_name() if cuda else "cpu", walls)
        if first_ms is not None:  # the engine's own first-vs-repeat, without a server
            result["first_wall_ms"] = round(first_ms, 4)
        if args.eager:
            per_layer = llm.apply_model(
                lambda m: _layer_ms(m, 0 if args.prefill else args.batch))[0]
            result["layers_ms"] = dict(zip([f"{i}:{n}" for i, n in enumerate(layer_names)],
                                           per_layer))
        json.dump(result, open(ctx_out_path(args.out, ctx, len(ctxs) > 1), "w"), indent=1)
        print(json.dumps({k: v for k, v in result.items() if k != "kernels_us_per_step"},
                         indent=1))


def parse_ctx_list(text: str, default: int) -> list[int]:
    """``--ctx``: "" (the default length), one length or a comma list, each >= 1."""
    if not text.strip():
        return [default]
    try:
        ctxs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--ctx {text!r}: give token counts, e.g. 1024 or 1023,1024")
    if not ctxs or min(ctxs) < 1:
        raise SystemExit(f"--ctx {text!r}: every length must be at least 1 token")
    return list(dict.fromkeys(ctxs))


def ctx_out_path(out: str, ctx: int, several: bool) -> str:
    """``--out`` itself for one length, else ``<stem>-ctx<N>.json``."""
    if not several:
        return out
    stem = out[:-5] if out.endswith(".json") else out
    return f"{stem}-ctx{ctx}.json"


def summarize(per_step: dict, step_ms: float, cuda: bool, args, ctx: int, device: str,
              walls: list[float]) -> dict:
    """step_profile's JSON for one length: families, top kernels, host share and, for
    prefills, the unprofiled wall times."""
    kernel_ms = sum(per_step.values()) / 1e3 if cuda else None
    fams: dict[str, float] = {}
    for k, v in per_step.items():
        fams[family(k)] = round(fams.get(family(k), 0.0) + v, 2)
    result = {
        "side_msa": os.environ.get("VLLM_MINIMAX_M3_MSA", "series"),
        "phase": "prefill" if args.prefill else "decode",
        "batch": args.batch, "ctx": ctx, "steps": 1 if args.prefill else args.steps,
        "eager": args.eager, "serving_limits": args.serving_limits,
        "device": device,
        "step_ms": round(step_ms, 4),
        "kernel_ms_per_step": round(kernel_ms, 4) if kernel_ms is not None else None,
        "host_ms_per_step": round(step_ms - kernel_ms, 4) if kernel_ms is not None else None,
        "families_us_per_step": dict(sorted(fams.items(), key=lambda kv: -kv[1])),
        "kernels_us_per_step": dict(sorted(per_step.items(), key=lambda kv: -kv[1])[:40]),
    }
    if walls:
        result["wall_median_ms"] = round(statistics.median(walls), 4)
        result["wall_ms_samples"] = [round(w, 4) for w in walls]
    return result


if __name__ == "__main__":
    main()
