#!/usr/bin/env python3
"""Where bf16 CUDA-graph runs part from compiled runs without graphs (GPU probe).

The tiny checkpoint and prompts of ``tests/models/test_minimax_m3_gpu.py``, greedy
bf16, one engine per compilation mode: FULL_AND_PIECEWISE (vLLM's default),
PIECEWISE (batches padded to the same capture sizes, the sparse attention run
eagerly between graph pieces) and NONE (torch.compile without graphs, batches
not padded).  For each pair of modes and each prompt: equal tokens, max
|chosen-token logprob difference| before any fork, and at a fork each run's
logprob of the other's token.  ``ALL_SPARSE=1``: every attention layer
sparse (no dense layer, hence no FlashAttention).  Writes
``$OUT/graph_modes[_all_sparse].json``.

    . /tmp/gpu-env.sh && OUT=$OUT [ALL_SPARSE=1] python ci/probe_graph_modes.py

H200 run 49 (default checkpoint): PIECEWISE == NONE, FULL_AND_PIECEWISE parted
from both on the two longest prompts (ci/results/2026-12-02-graph-modes-h200-run49.json).
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))

from minimax_m3_utils import LAYER_TYPES, N_LAYERS, build_checkpoint  # noqa: E402
from test_minimax_m3_gpu import (  # noqa: E402
    PROMPT_LENS,
    _run,
    first_divergence,
    max_logprob_diff,
)

MODES = ("FULL_AND_PIECEWISE", "PIECEWISE", "NONE")


def compare(got, ref) -> list[dict]:
    rows = []
    for i, (x, y) in enumerate(zip(got, ref)):
        j = first_divergence(x["tokens"], y["tokens"])
        row = dict(prompt=i, length=PROMPT_LENS[i],
                   equal_tokens=len(x["tokens"]) if j is None else j,
                   max_lp_diff=max_logprob_diff([x], [y]))
        if j is not None:
            row["fork"] = {name: dict(token=b["tokens"][j], logprob=b["logprobs"][j],
                                      other_token_logprob=b["top"][j].get(str(a["tokens"][j])))
                           for a, b, name in ((x, y, "second"), (y, x, "first"))}
        rows.append(row)
    return rows


def main() -> None:
    out_dir = os.environ.get("OUT", "out")
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="graph_modes_")
    all_sparse = os.environ.get("ALL_SPARSE", "0") == "1"
    over = dict(layer_types=[LAYER_TYPES[-1]] * N_LAYERS) if all_sparse else {}
    ckpt = build_checkpoint(os.path.join(tmp, "ckpt"), **over)
    runs = {m: _run(os.path.join(tmp, m), ckpt, True, "bfloat16",
                    compilation_config={"cudagraph_mode": m}) for m in MODES}
    result = {}
    for a, b in (("FULL_AND_PIECEWISE", "PIECEWISE"), ("PIECEWISE", "NONE"),
                 ("FULL_AND_PIECEWISE", "NONE")):
        rows = compare(runs[a], runs[b])
        result[f"{a} vs {b}"] = rows
        for r in rows:
            print(f"{a} vs {b}: {json.dumps(r)}")
    name = "graph_modes_all_sparse.json" if all_sparse else "graph_modes.json"
    json.dump(result, open(os.path.join(out_dir, name), "w"), indent=1)


if __name__ == "__main__":
    main()
