# SPDX-License-Identifier: Apache-2.0
"""Mode ``--prefix-overlap``: the 8k prefill step with the chunk's first tokens
attended densely *while the index runs* (the engine's dense prefix).

A token at position p sees ``p // 128 + 1`` blocks; while that is at most
top-k (p < 2048 at the released sizes) its selection is every visible block,
so its sparse attention *is* dense causal attention over its prefix, and it
does not depend on the index at all. Giving those tokens to a Triton kernel
after the index lost (docs/decisions/0006-8k-prefill-routes-closed.md); this mode
times the prefix on a second stream, beside the index and the grouping.

One bf16 batch (an 8192-token chunk at 8k context, the index's own
selections). Every variant is the whole step (index + top-k + attention) in one
CUDA graph, timed in ``ROUNDS`` paired rounds after an L2 flush:

- ``base``: today's step (block-major for every token);
- ``prefix_serial``: block-major for tokens [P, T), then the prefix [0, P)
  by torch SDPA (the dense baseline's kernel; its K/V rows gathered from the
  paged cache and expanded to the query heads, its output copied into place:
  all counted), one stream;
- ``prefix_overlap``: the same prefix work on a second stream forked before
  the index and joined at the end;
- ``prefix_overlap_index_rest``: as ``prefix_overlap``, with the index scoring
  only tokens [P, T) (the prefix's selections are not needed).
- ``engine``: the engine's path (``dense_prefix``: its spans and side stream,
  its SDPA over the paged cache; the span of 2048 tokens whatever P is).

P = ``PREFIX`` (default 2048: every token that selects all its blocks). Also
reports the dense baseline (``sdpa_dense_prefill``) and each variant's largest
output difference from ``base``. If ``prefix_overlap`` does not beat dense,
the route is closed even with the fastest dense kernel torch has. It answered
that question (docs/decisions/0009-dense-prefix.md) and now checks that the engine's
path stays within a few percent of dense. Results: $OUT/prefix_overlap.json.

  BENCH_ARGS=--prefix-overlap GIT_COMMIT=... bash ci/gpu_kernel_job.sh
"""

import json
import os

import torch

from .checks import Batch
from .harness import (B, D, HIDX, HQ, TOPK, Timer, load_kernels, paired_rounds,
                      sdpa_dense_prefill)


def run(out_dir, reps):
    """Times the variants in paired rounds; writes ``out_dir/prefix_overlap.json``."""
    F = torch.nn.functional.scaled_dot_product_attention
    dev = torch.device("cuda")
    torch.manual_seed(0)
    timer = Timer(dev, reps)
    rounds = int(os.environ.get("ROUNDS", "7"))
    ctx = int(os.environ.get("CONTEXT", "8192"))
    P = int(os.environ.get("PREFIX", str(TOPK * B)))
    index_block_topk, block_sparse_attention, src = load_kernels()
    bt = Batch([ctx], ctx, 0, dev)  # the chunk is the whole context: its first tokens
    assert P <= TOPK * B, "tokens past top-k x block do not select every block"
    sel = torch.empty(bt.T, HIDX, TOPK, dtype=torch.int32, device=dev)
    kp = torch.empty(1, HQ, P, D, device=dev, dtype=bt.kv.dtype)
    vp = torch.empty_like(kp)
    side = torch.cuda.Stream()

    def index(first=0):
        index_block_topk(bt.idx_q[first:], bt.idx_k, bt.block_table, bt.token_req[first:],
                         bt.token_pos[first:], B, TOPK, out=sel[first:], num_decode_tokens=0)

    def sparse(o, first):
        block_sparse_attention(bt.q[first:], bt.kv, bt.block_table, bt.token_req[first:],
                               bt.token_pos[first:], sel[first:], B, D ** -0.5,
                               out=o[first:], block_major=4)

    def prefix(o):
        # the prefix's K/V rows from the paged cache ([P, HKV, D] each), expanded to the
        # query heads (one KV head per rank), dense causal attention, the output
        # copied into place
        for dst, c in ((kp, 0), (vp, 1)):
            rows = bt.contiguous_rows(bt.kv[:, c], 0, P)
            dst.copy_(rows.permute(1, 0, 2).expand(HQ, P, D)[None])
        qp = bt.q[:P].transpose(0, 1)[None]
        o[:P].copy_(F(qp, kp, vp, is_causal=True)[0].transpose(0, 1))

    # the engine's path (MiniMaxM3SparseImpl.forward with the dense prefix): its
    # spans, its side stream, the leading span cut off the sparse ops' tokens
    from vllm.models.minimax_m3.common import dense_prefix as dp
    qsl = torch.tensor([0, bt.T], dtype=torch.int32)
    chunks = dp.long_prefill_chunks(qsl, torch.tensor([ctx]), dp.DEFAULT_MIN_TOKENS)
    spans = dp.dense_spans(chunks, TOPK * B, dp.DEFAULT_MIN_TOKENS)
    assert spans and spans[0].token_start == 0, spans
    runner = dp.SIDE_STREAM

    def engine(o):
        def sparse_rest(first, cleared, out):
            assert not cleared and out.data_ptr() == o[first:].data_ptr()
            index(first)
            sparse(o, first)
        dp.attend_with_dense_prefix(
            runner, o, bt.T, 0, spans,
            lambda: dp.dense_prefix_attention(bt.q, bt.kv, bt.block_table, spans, D ** -0.5),
            sparse_rest)

    def variant(name):
        o = torch.empty_like(bt.q)

        def step():
            if name == "engine":
                engine(o)
            elif name == "base":
                index()
                sparse(o, 0)
            elif name == "prefix_serial":
                index()
                sparse(o, P)
                prefix(o)
            else:  # prefix_overlap, prefix_overlap_index_rest
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    prefix(o)
                index(P if name == "prefix_overlap_index_rest" else 0)
                sparse(o, P)
                torch.cuda.current_stream().wait_stream(side)
        return step, o

    graphs, diffs, keep = {}, {}, []  # keep: each graph's step and output stay alive
    base = None
    for name in ("base", "prefix_serial", "prefix_overlap", "prefix_overlap_index_rest",
                 "engine"):
        step, o = variant(name)
        o.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        if base is None:
            base = o.clone()
        diffs[name] = float((o.float() - base.float()).abs().max())
        graphs[name] = timer.graph(step)
        keep.append((step, o))
        print(name, "max diff from base", diffs[name], flush=True)
    dense = sdpa_dense_prefill(ctx, ctx, dev)
    graphs["dense"] = timer.graph(dense)
    res = dict(kernels_from=src, gpu=torch.cuda.get_device_name(0),
               commit=os.environ.get("GIT_COMMIT", "?"), context=ctx, chunk=bt.T, prefix=P,
               engine_spans=[list(x) for x in spans],
               rounds=rounds, max_diff_from_base=diffs,
               **paired_rounds(timer, graphs, rounds, base="base"))
    print(json.dumps({k: v for k, v in res.items() if k != "us"}, indent=1))
    (out_dir / "prefix_overlap.json").write_text(json.dumps(res, indent=1))

