#!/usr/bin/env python3
"""How far torch.compile moves bf16 outputs, without CUDA graphs.

Runs the GPU graphs test's tiny checkpoint and prompts
(``tests/models/test_minimax_m3_gpu.py``) in three bf16 engines: eager
batched, eager one sequence at a time, and compiled (``cudagraph_mode:
NONE``), and prints the chosen-token logprob differences against eager
batched (mean, max over the common prefix; first divergence per prompt).
It explains why the bf16 graphs test compares graphs with the compiled model
rather than with eager. Works on CPU or GPU:

    .venv/bin/python ci/bf16_compile_numerics.py [WORKDIR]
"""

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "models"), str(REPO / "tests")]

import test_minimax_m3_gpu as gpu_test  # noqa: E402  (its helpers and prompts)
from minimax_m3_utils import build_checkpoint, run_vllm  # noqa: E402


def main() -> int:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="m3-bf16-"))
    ckpt = build_checkpoint(str(work / "ckpt"))

    def run(name, graphs, **llm):
        kw = dict(dtype="bfloat16", block_size=16, max_model_len=512, max_num_seqs=8,
                  max_num_batched_tokens=128, enable_prefix_caching=False)
        kw.update(llm)
        t = time.time()
        res = run_vllm(str(work / name), ckpt, gpu_test._prompts(), gpu_test.MAX_NEW,
                       graphs=graphs, llm_kwargs=kw, top_logprobs=2)
        if "error" in res:
            raise SystemExit(f"{name}: {res['error']}\n{res.get('traceback', '')}")
        print(f"{name}: {time.time() - t:.0f} s", flush=True)
        return res["rounds"][0]

    eager = run("eager", False)
    alone = run("eager_alone", False, max_num_seqs=1)
    compiled = run("compiled", True, compilation_config=gpu_test.NO_GRAPHS)
    print("| vs eager batched (bf16) | mean abs logprob diff | max | first divergence per prompt |")
    print("|---|---|---|---|")
    for name, x in (("eager, one sequence at a time", alone),
                    ("torch.compile, no CUDA graphs", compiled)):
        div = [gpu_test.first_divergence(a["tokens"], b["tokens"]) for a, b in zip(x, eager)]
        print(f"| {name} | {gpu_test.mean_logprob_diff(x, eager):.4f} | "
              f"{gpu_test.max_logprob_diff(x, eager):.4f} | {div} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
