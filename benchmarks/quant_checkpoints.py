# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 quantized checkpoints on one GPU, in one run: a production-shaped
few-layer checkpoint (hidden 6144, 64/4 heads of 128, 128 experts of 3072 top-4,
shared expert 3072, dense MLP 12288, vocab 200064, MSA block 128 / top-16) built
from random weights in BF16, then converted to compressed-tensors FP8-dynamic
(the MiniMax-M3-FP8-dynamic format) and to MXFP8 (the MiniMax-M3-MXFP8 format,
``quant_method: mxfp8``), each served by vLLM in a fresh process:

* weight memory per layer (bytes of the layer's parameters after vLLM's
  post-load processing, i.e. what the GPU holds: Marlin-repacked MXFP8 with
  its scales, FP8 with scales, bf16), for the dense layer 0, a MoE layer (the
  mean over them) and outside the layers (embeddings, LM head);
* prefill tokens/s: ``--prefill-batch`` prompts of ``--prefill-len`` random
  tokens, one output token each (best of ``--repeats``);
* decode tokens/s per batch size in ``--decode-batches``: ``--decode-len``-token
  prompts, the time of ``--decode-tokens`` output tokens minus the time of one
  (prefill and scheduling excluded), ``ignore_eos``.

  python benchmarks/quant_checkpoints.py --out benchmarks/results/quant/h200     # H200, ~30 GB disk
  python benchmarks/quant_checkpoints.py --tiny --formats bf16 --out /tmp/q   # CPU smoke

Layers: ``--layers`` (default 2) of which the first ``--dense-layers`` (1) have a
dense MLP and dense attention, the rest MSA attention and a MoE, as in the
release (0-2 dense, 3-59 MoE). The embeddings, LM head, norms and routers (the
same in all formats) are written once and linked into each checkpoint.
Results: ``OUT/quant_checkpoints.json`` and ``OUT/quant_checkpoints.md``.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))

FORMATS = ("bf16", "fp8_dynamic", "mxfp8")
SHARED_SHARD = "shared.safetensors"


def text_config(args) -> dict:
    n, dense = args.layers, args.dense_layers
    if not 0 <= dense <= n:
        raise SystemExit(f"--dense-layers {dense} must be between 0 and --layers {n}")
    cfg = dict(
        num_hidden_layers=n,
        layer_types=["full_attention"] * dense + ["minimax_m3_sparse"] * (n - dense),
        mlp_layer_types=["dense"] * dense + ["sparse"] * (n - dense),
        max_position_embeddings=max(args.max_model_len, 4096),
    )
    if args.tiny:  # CPU smoke: the shapes of the tests' tiny model
        from minimax_m3_utils import text_config as tiny

        t = tiny(sparse_block=32, topk=2)
        for k in ("layer_types", "mlp_layer_types", "num_hidden_layers",
                  "max_position_embeddings"):
            t.pop(k)
        cfg.update(t, dense_intermediate_size=64)
    return cfg


def build_bf16(args, root: str) -> dict[str, str]:
    """Random production-shaped checkpoint: the released tensor names, bf16
    linears (N(0, 0.02)), fp32 routers; one shard of the quantizable linears
    per format is written by ``convert``. Returns {format: dir}."""
    import torch
    from safetensors.torch import save_file
    from transformers.models.minimax_m3_vl import (
        MiniMaxM3SparseForConditionalGeneration,
        MiniMaxM3VLConfig,
    )

    from minimax_m3_utils import released_from_state_dict
    from mxfp8_checkpoint import ROUTER_RE, TARGET_RE

    vc = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    cfg = MiniMaxM3VLConfig(text_config=text_config(args), vision_config=vc,
                            projector_hidden_size=64)
    with torch.device("meta"):
        model = MiniMaxM3SparseForConditionalGeneration(cfg)
    names = released_from_state_dict(model.state_dict())
    dev = args.build_device
    g = torch.Generator(device=dev).manual_seed(0)
    shared, linears = {}, {}
    for n, meta in names.items():
        if TARGET_RE.match(n):
            w = torch.empty(meta.shape, device=dev, dtype=torch.bfloat16)
            linears[n] = w.normal_(0.0, 0.02, generator=g)
        elif ROUTER_RE.match(n) or n.endswith("e_score_correction_bias"):
            shared[n] = torch.empty(meta.shape, device=dev).normal_(0.0, 0.02, generator=g).cpu()
        elif "norm" in n:
            shared[n] = torch.empty(meta.shape, device=dev).normal_(
                0.0, 0.1, generator=g).to(torch.bfloat16).cpu()
        else:  # embeddings, LM head
            shared[n] = torch.empty(meta.shape, device=dev).normal_(
                0.0, 0.02, generator=g).to(torch.bfloat16).cpu()
    os.makedirs(root, exist_ok=True)
    save_file(shared, os.path.join(root, SHARED_SHARD), metadata={"format": "pt"})
    cfg_dict = json.loads(cfg.to_json_string())
    cfg_dict["architectures"] = ["MiniMaxM3SparseForConditionalGeneration"]
    dirs = {}
    for fmt in args.formats:
        d = os.path.join(root, fmt)
        os.makedirs(d, exist_ok=True)
        link = os.path.join(d, SHARED_SHARD)
        if not os.path.exists(link):
            os.symlink(os.path.join(root, SHARED_SHARD), link)
        tensors, qcfg = convert(fmt, linears)
        save_file(tensors, os.path.join(d, "linears.safetensors"), metadata={"format": "pt"})
        c = dict(cfg_dict)
        if qcfg is not None:
            c["quantization_config"] = qcfg
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(c, fh, indent=2)
        dirs[fmt] = d
        del tensors
    linears.clear()
    if torch.cuda.is_available():  # hand the build's memory back before the engines start
        torch.cuda.empty_cache()
    return dirs


def convert(fmt: str, linears: dict):
    """The quantizable linears in ``fmt`` and the config's quantization_config."""
    from fp8_dynamic_checkpoint import FP8_DYNAMIC_SCHEME, quantize_per_channel
    from mxfp8_checkpoint import MXFP8_QUANT_CONFIG, quantize_mxfp8

    out = {}
    for n, w in linears.items():
        base = n[: -len("weight")]
        if fmt == "bf16":
            out[n] = w.cpu()
        elif fmt == "fp8_dynamic" and ".index_" in n:
            out[n] = w.cpu()  # the FP8-dynamic release leaves the indexer in bf16
        elif fmt == "fp8_dynamic":
            q, s = quantize_per_channel(w)
            out[n], out[base + "weight_scale"] = q.cpu(), s.cpu()
        elif fmt == "mxfp8":
            q, s = quantize_mxfp8(w)
            out[n], out[base + "weight_scale_inv"] = q.cpu(), s.cpu()
        else:
            raise SystemExit(f"unknown format {fmt!r}; use one of {FORMATS}")
    if fmt == "bf16":
        return out, None
    if fmt == "mxfp8":
        return out, dict(MXFP8_QUANT_CONFIG)
    ignore = ["re:.*lm_head$", r"re:.*block_sparse_moe\.gate$", r"re:.*vision_tower\..*",
              r"re:.*multi_modal_projector\..*", r"re:.*patch_merge_mlp\..*",
              r"re:.*self_attn\.index_[qk]_proj$"]
    return out, {"quant_method": "compressed-tensors", "format": "float-quantized",
                 "quantization_status": "compressed",
                 "config_groups": {"group_0": json.loads(json.dumps(FP8_DYNAMIC_SCHEME))},
                 "ignore": ignore, "kv_cache_scheme": None}


# ------------------------------------------------------------------ worker

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def _weight_bytes(model) -> dict:
    per_layer, other = {}, 0
    seen = set()
    for n, t in model.named_parameters():
        if id(t) in seen:
            continue
        seen.add(id(t))
        b = t.numel() * t.element_size()
        m = _LAYER_RE.match(n)
        if m is None:
            other += b
        else:
            per_layer[int(m.group(1))] = per_layer.get(int(m.group(1)), 0) + b
    return {"per_layer": per_layer, "outside_layers": other}


def worker(spec_path: str, out_path: str) -> None:
    import torch

    from vllm import LLM, SamplingParams

    spec = json.load(open(spec_path))
    llm = LLM(model=spec["model"], **spec["llm_kwargs"])
    res = {"format": spec["format"], "weights": llm.apply_model(_weight_bytes)[0]}
    g = torch.Generator().manual_seed(0)

    def prompts(n, length):
        return [{"prompt_token_ids": torch.randint(10, 150000 if not spec["tiny"] else 500,
                                                   (length,), generator=g).tolist()}
                for _ in range(n)]

    def timed(ps, max_tokens):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            detokenize=False)
        best = None
        for _ in range(spec["repeats"]):
            t = time.perf_counter()
            llm.generate(ps, sp, use_tqdm=False)
            dt = time.perf_counter() - t
            best = dt if best is None else min(best, dt)
        return best

    pb, pl = spec["prefill_batch"], spec["prefill_len"]
    ps = prompts(pb, pl)
    timed(ps, 1)  # warm-up at this shape
    t = timed(ps, 1)
    res["prefill"] = {"batch": pb, "prompt_len": pl, "seconds": t, "tok_s": pb * pl / t}
    res["decode"] = []
    for b in spec["decode_batches"]:
        ps = prompts(b, spec["decode_len"])
        d = spec["decode_tokens"]
        timed(ps, 2)
        t1, tn = timed(ps, 1), timed(ps, d)
        res["decode"].append({"batch": b, "prompt_len": spec["decode_len"], "tokens": d,
                              "seconds": tn - t1, "tok_s": b * (d - 1) / (tn - t1)})
    json.dump(res, open(out_path, "w"), indent=2)


# ------------------------------------------------------------------ driver


def run_format(args, fmt: str, path: str) -> dict:
    llm_kwargs = dict(tensor_parallel_size=args.tp, max_model_len=args.max_model_len,
                      block_size=32 if args.tiny else 128, enable_prefix_caching=False,
                      kv_cache_dtype=args.kv_cache_dtype, dtype="bfloat16",
                      max_num_seqs=max(args.decode_batches + [args.prefill_batch]),
                      max_num_batched_tokens=max(args.prefill_len * args.prefill_batch, 8192),
                      enforce_eager=args.eager, skip_tokenizer_init=True)
    if args.tiny:  # CPU: a small KV cache (the CPU backend reserves host memory)
        llm_kwargs.update(gpu_memory_utilization=0.3, kv_cache_memory_bytes=64 << 20)
    else:
        llm_kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    work = os.path.join(args.workdir, f"run_{fmt}")
    os.makedirs(work, exist_ok=True)
    spec = dict(model=path, format=fmt, llm_kwargs=llm_kwargs, tiny=args.tiny,
                repeats=args.repeats, prefill_batch=args.prefill_batch,
                prefill_len=args.prefill_len, decode_batches=args.decode_batches,
                decode_len=args.decode_len, decode_tokens=args.decode_tokens)
    spec_p, out_p = os.path.join(work, "spec.json"), os.path.join(work, "out.json")
    json.dump(spec, open(spec_p, "w"), indent=2)
    t = time.time()
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec_p,
                               out_p], capture_output=True, text=True, timeout=args.timeout)
        log, failed = proc.stdout + proc.stderr, proc.returncode != 0
    except subprocess.TimeoutExpired as e:  # a row that says so; the other formats still run
        log, failed = _text(e.stdout) + _text(e.stderr), True
        log = f"timed out after {args.timeout} s (--timeout); the worker's output so far:\n{log}"
    open(os.path.join(work, "log.txt"), "w").write(log)
    if failed or not os.path.exists(out_p):
        return {"format": fmt, "error": log[-3000:]}
    res = json.load(open(out_p))
    res["wall_s"] = time.time() - t
    return res


def _text(out) -> str:
    """A TimeoutExpired's captured output (bytes, str or None) as text."""
    if out is None:
        return ""
    return out.decode(errors="replace") if isinstance(out, bytes) else out


def table(results: list, args) -> str:
    gib = 2.0**20  # MiB
    lines = ["| format | dense layer 0 MiB | MoE layer MiB | outside layers MiB | prefill tok/s "
             f"(b{args.prefill_batch} x {args.prefill_len}) | "
             + " | ".join(f"decode tok/s b{b}" for b in args.decode_batches) + " |",
             "|---|---|---|---|---|" + "---|" * len(args.decode_batches)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['format']} | error: see the JSON |" + " |" * (3 + len(
                args.decode_batches)))
            continue
        pl = {int(k): v for k, v in r["weights"]["per_layer"].items()}
        dense = pl.get(0, 0) / gib if args.dense_layers else float("nan")
        moe = [v for k, v in pl.items() if k >= args.dense_layers]
        moe_gib = (sum(moe) / len(moe) / gib) if moe else float("nan")
        lines.append(f"| {r['format']} | {dense:.1f} | {moe_gib:.1f} | "
                     f"{r['weights']['outside_layers'] / gib:.1f} | "
                     f"{r['prefill']['tok_s']:.0f} | "
                     + " | ".join(f"{d['tok_s']:.1f}" for d in r["decode"]) + " |")
    return "\n".join(lines)


def _git_commit() -> str:
    proc = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        # in-process engine core: apply_model runs here (TP workers still fork)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return worker(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default=None, help="checkpoints and run logs (default OUT/work)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dense-layers", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--prefill-batch", type=int, default=4)
    ap.add_argument("--prefill-len", type=int, default=4096)
    ap.add_argument("--decode-batches", default="1,8,32,64")
    ap.add_argument("--decode-len", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--eager", action="store_true", help="no torch.compile / CUDA graphs")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    ap.add_argument("--build-device", default=None, help="default: cuda if available")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per format")
    args = ap.parse_args()
    args.formats = [f for f in args.formats.split(",") if f]
    for f in args.formats:
        if f not in FORMATS:
            raise SystemExit(f"unknown format {f!r}; use some of {FORMATS}")
    args.decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
    args.workdir = args.workdir or os.path.join(args.out, "work")
    if args.build_device is None:
        import torch

        args.build_device = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(args.out, exist_ok=True)
    t = time.time()
    dirs = build_bf16(args, os.path.join(args.workdir, "ckpt"))
    build_s = time.time() - t
    results, md = [], write_results(args, [], build_s)
    for fmt in args.formats:
        r = run_format(args, fmt, dirs[fmt])
        print(f"{fmt}: " + ("error" if "error" in r else json.dumps(
            {"prefill_tok_s": r["prefill"]["tok_s"],
             "decode_tok_s": [d["tok_s"] for d in r["decode"]]})), flush=True)
        results.append(r)
        md = write_results(args, results, build_s)  # after each format: a cut-off run keeps its rows
    if not args.keep:
        import shutil

        shutil.rmtree(os.path.join(args.workdir, "ckpt"), ignore_errors=True)
    print(md)


def write_results(args, results: list, build_s: float) -> str:
    """OUT/quant_checkpoints.{json,md} for the formats run so far; returns the markdown."""
    import torch

    meta = {"args": {k: v for k, v in vars(args).items()}, "build_s": build_s,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": os.environ.get("GIT_COMMIT") or _git_commit()}
    json.dump({"meta": meta, "results": results},
              open(os.path.join(args.out, "quant_checkpoints.json"), "w"), indent=2)
    md = [f"# MiniMax-M3 quantized checkpoints: {args.layers} layers "
          f"({args.dense_layers} dense), {meta['device']}, TP {args.tp}", "",
          f"{meta['date']}; repo commit {meta['commit']}; kv cache {args.kv_cache_dtype}; "
          f"{'eager' if args.eager else 'compiled, CUDA graphs'}; decode prompts "
          f"{args.decode_len} tokens, {args.decode_tokens} output tokens; best of "
          f"{args.repeats}; checkpoint build {build_s:.0f} s. Weight memory: parameters and "
          "buffers after loading (Marlin-repacked for MXFP8); the MXFP8 linears and experts "
          "run W8A16 on sm_90 (Marlin: activations bf16).", "", table(results, args), ""]
    missing = [f for f in args.formats if f not in {r["format"] for r in results}]
    if missing:
        md += [f"Not run (the run stopped first): {', '.join(missing)}.", ""]
    for r in results:
        if "error" in r:
            md += [f"{r['format']} failed:", "", "```", r["error"][-1500:], "```", ""]
    text = "\n".join(md)
    open(os.path.join(args.out, "quant_checkpoints.md"), "w").write(text)
    return text


if __name__ == "__main__":
    main()
