# SPDX-License-Identifier: Apache-2.0
"""CPU probe for the FP8-KV difference between the two MSA paths of the v0.26.0 flavor.

With an fp8 cache and bf16 queries, upstream's Triton kernels dequantize K and V to bf16
and cast the softmax probabilities P to bf16 before the P.V product; the series' kernels
run that product in fp16 (P rounded to 2**-11, not 2**-8). On the GPU (2026-12-07) A and
B differed by 0.145 in mean prompt logprob with FP8 KV and by 0.042 with bf16 KV.

This probe puts that one known arithmetic difference into transformers' MiniMax-M3 (the
test oracle, fp32, index keys rounded to bf16 as upstream stores them): in the sparse
layers only, P is rounded to bf16 or to fp16 before the product, with and without an
e4m3-rounded KV cache. It prints, per prompt of the GPU tests (300 and 850 tokens):
  * P bf16 vs P fp16: what the rounding difference alone moves;
  * each rounding against exact P;
  * the model's own bf16-vs-fp32 error under the same cache, the scale of its noise.

    python -m benchmarks.engine_ab.fp8_rounding_probe [--out FILE.md]
"""

import argparse
import contextlib
import datetime
import os
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "tests", "upstream_m3"), os.path.join(REPO, "tests", "models")]

from minimax_m3_utils import hf_token_logprobs  # noqa: E402
from upstream_checkpoint import (bf16_index_keys, build_upstream_checkpoint,  # noqa: E402
                                 fp8_kv_cache)

# the prompts of tests/upstream_m3/test_upstream_m3_gpu.py
PROMPTS = [[3 + (7 * i) % 500 for i in range(300)], [5 + (11 * i) % 490 for i in range(850)]]
ROUNDINGS = {"exact": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def rounded_probabilities(setting: dict):
    """transformers' eager attention with P rounded to ``setting["p"]`` (a dtype, or None
    for transformers' own function) before P.V, in sparse layers only (the dense layer
    runs FlashAttention on both sides)."""
    import transformers.models.minimax_m3_vl.modeling_minimax_m3_vl as hf_mod

    plain = hf_mod.eager_attention_forward

    def attend(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        p_dtype = setting["p"] if module.indexer is not None else None
        if p_dtype is None:
            return plain(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        groups = module.num_key_value_groups
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        p = torch.softmax(scores, -1, dtype=torch.float32).to(p_dtype).to(query.dtype)
        return torch.matmul(p, value).transpose(1, 2).contiguous(), p

    hf_mod.eager_attention_forward = attend
    try:
        yield
    finally:
        hf_mod.eager_attention_forward = plain


def _mean_abs(a, b) -> float:
    return (torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().mean().item()


def probe(workdir: str) -> list[dict]:
    hf, _ = build_upstream_checkpoint(os.path.join(workdir, "ckpt"), topk=2)
    setting = {"p": None}
    rows = []
    for kv in ("bf16", "fp8"):
        cache = fp8_kv_cache() if kv == "fp8" else contextlib.nullcontext()
        # the rounding wrapper goes in first, so fp8_kv_cache rounds K and V before it
        with bf16_index_keys() as hf_cls, rounded_probabilities(setting), cache:
            ref32 = hf_cls.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager").eval()
            ref16 = hf_cls.from_pretrained(hf, dtype=torch.bfloat16, attn_implementation="eager").eval()
            for prompt in PROMPTS:
                lp = {}
                for name, dtype in ROUNDINGS.items():
                    setting["p"] = dtype
                    lp[name] = hf_token_logprobs(ref32, prompt)
                setting["p"] = None
                own = hf_token_logprobs(ref16, prompt)
                rows.append(dict(kv=kv, tokens=len(prompt),
                                 p_bf16_vs_fp16=_mean_abs(lp["bf16"], lp["fp16"]),
                                 p_bf16_vs_exact=_mean_abs(lp["bf16"], lp["exact"]),
                                 p_fp16_vs_exact=_mean_abs(lp["fp16"], lp["exact"]),
                                 model_bf16_vs_fp32=_mean_abs(own, lp["exact"])))
                print(rows[-1], flush=True)
    return rows


def render(rows: list[dict]) -> str:
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    import transformers
    lines = [f"date: {datetime.date.today()}", "machine: CPU (no GPU involved)",
             f"commit: {commit}; torch {torch.__version__}, transformers {transformers.__version__}",
             "rerun: `python -m benchmarks.engine_ab.fp8_rounding_probe --out FILE.md`", "",
             "| KV cache | prompt tokens | P bf16 vs P fp16 | P bf16 vs exact | P fp16 vs exact "
             "| model bf16 vs fp32 |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kv']} | {r['tokens']} | {r['p_bf16_vs_fp16']:.4f} | "
                     f"{r['p_bf16_vs_exact']:.4f} | {r['p_fp16_vs_exact']:.4f} | "
                     f"{r['model_bf16_vs_fp32']:.4f} |")
    lines.append("")
    lines.append("Mean absolute difference in prompt logprob (nats), transformers' MiniMax-M3 in "
                 "fp32 (index keys bf16), P rounded in the sparse layers only.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine_ab.fp8_rounding_probe")
    p.add_argument("--out", help="write the table here (markdown)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text = render(probe(tmp))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
