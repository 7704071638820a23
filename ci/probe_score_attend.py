# SPDX-License-Identifier: Apache-2.0
"""Probe: device time of each kernel of the batch-1/2/4 decode step at 8k
context, the chain (index, select, attention, merge; and with the select in
the attention) against ``score_attend_decode`` (block, merge; with and without PDL, float32 or float16 partials), by the
profiler's kernel records (L2 flushed by a 256 MiB write before each call),
and the CUDA-graph replay of each whole step.  $OUT/probe_score_attend.json.

  PYTHONPATH=<stub vllm> python ci/probe_score_attend.py
  PAIRED=9 ...: only the paired rounds of ``paired``
"""

import json
import os
import statistics
import sys
from pathlib import Path

import torch

from bench_msa import (B, D, HIDX, TOPK, Batch, Timer, kernel_times, load_kernels,
                       score_attend_fn)


def main():
    dev = torch.device("cuda")
    timer = Timer(dev, int(os.environ.get("REPS", "50")))
    index_block_topk, block_sparse_attention, _ = load_kernels()
    score_attend = score_attend_fn(block_sparse_attention)
    rows = []
    if os.environ.get("PAIRED"):
        return paired(dev, timer, score_attend, int(os.environ["PAIRED"]))
    # (batch, KV scale mode, all variants or only chain / two launches with and without PDL)
    for batch, kv_mode, every in ((1, 0, True), (2, 0, False), (1, 1, False), (1, 2, False)):
        bt = Batch([8192] * batch, 1, kv_mode, dev)
        sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
        o = torch.empty_like(bt.q)
        kv = (bt.kv, bt.block_table, bt.token_req, bt.token_pos)
        ia = (bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos, B, TOPK)
        sc = (kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales)

        def chain():
            index_block_topk(*ia, out=sel, num_decode_tokens=bt.T)
            block_sparse_attention(bt.q, *kv, sel, B, D ** -0.5, *sc, out=o)

        def select_in_attention():
            s = index_block_topk(*ia, num_decode_tokens=bt.T, return_scores=True)
            block_sparse_attention(bt.q, *kv, s, B, D ** -0.5, *sc, out=o, select_topk=TOPK)

        def two_launch(**tune):
            score_attend(bt.idx_q, bt.idx_k, bt.q, *kv, B, TOPK, 1, 0, D ** -0.5, *sc, out=o,
                         _tune=tune)

        variants = [("chain", chain),
                    ("score_attend", two_launch),  # PDL where supported
                    ("score_attend_no_pdl", lambda: two_launch(pdl=False)),
                    ("score_attend_f32_partials", lambda: two_launch(f32_partials=True)),
                    ("score_attend_rank_merge", lambda: two_launch(merge_one_round=False)),
                    ("score_attend_one_round_merge", lambda: two_launch(merge_one_round=True)),
                    ("score_attend_one_round_merge_c8",
                     lambda: two_launch(merge_one_round=True, merge_chunks=8))]
        if every:
            variants += [("select_in_attention", select_in_attention),
                         ("score_attend_ks2", lambda: two_launch(key_split=2)),
                         ("score_attend_w2", lambda: two_launch(num_warps=2)),
                         ("score_attend_mw2", lambda: two_launch(merge_warps=2))]
        for name, fn in variants:
            r = dict(batch=batch, context=8192, kv_mode=kv_mode, step=name,
                     graph_us=timer.time_fn(fn), kernels=kernel_times(fn, timer, reps=50))
            rows.append(r)
            print(json.dumps(r), flush=True)
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_score_attend.json").write_text(json.dumps(rows, indent=1))


def paired(dev, timer, score_attend, rounds):
    """PAIRED=<rounds>: the two launches with the merge that loads the chosen
    rows after the ranks against the one that loads every row with the
    scores (``merge_one_round``), graphs timed in alternating rounds (write
    flush and read flush), so drift between calls cancels."""
    rows = []
    for batch, kv_mode in ((1, 0), (2, 0), (1, 2)):
        bt = Batch([8192] * batch, 1, kv_mode, dev)
        o = torch.empty_like(bt.q)
        kv = (bt.kv, bt.block_table, bt.token_req, bt.token_pos)
        sc = (kv_mode, bt.k_scale, bt.v_scale, bt.kv_scales)
        graphs = {name: timer.graph(lambda tune=tune: score_attend(
            bt.idx_q, bt.idx_k, bt.q, *kv, B, TOPK, 1, 0, D ** -0.5, *sc, out=o, _tune=tune))
            for name, tune in (("rank_merge", dict(merge_one_round=False)),
                               ("one_round_merge", dict(merge_one_round=True)))}
        for flush in ("write", "read"):
            us = {name: [] for name in graphs}
            for _ in range(rounds):
                for name, g in graphs.items():
                    us[name].append(timer.time_graph(g, flush))
            r = dict(batch=batch, context=8192, kv_mode=kv_mode, flush=flush, us=us,
                     median={n: statistics.median(v) for n, v in us.items()},
                     one_round_faster=sum(b < a for a, b in zip(us["rank_merge"],
                                                                us["one_round_merge"])))
            rows.append(r)
            print(json.dumps(r), flush=True)
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_score_attend_paired.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
