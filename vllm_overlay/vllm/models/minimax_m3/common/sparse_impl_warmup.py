# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Compile the series' MSA kernels at engine start, not at a first request (v0.23.0).

On v0.23.0 the series' own backend (``backend.MiniMaxM3SparseImpl``) runs
uniform decode batches inside FULL CUDA graphs, so graph capture compiles
those. Prefills, mixed decode + prefill batches and decode batches beyond the
largest graph run eagerly between graph pieces, and their kernel variants
(prefill layout by chunk and context, the dense prefix's sparse remainder,
decode splits by batch, Triton's keys on integer arguments) compiled inside
the requests that first needed them: on the H100 serving matrix of 2026-12-07
the first 1k request took 9.6 s, 197 times a repeat.

So the warm-up runs the Impl's own forward (cache write, score-attend or
one-launch decode, dense prefix, index + top-k, sparse attention) on metadata
shaped as the builder shapes a real batch (``warm_metadata``) over the plan of
``compile_plan``, in compile-only mode, then a few real launches
(``compile_warmup.warm_up_launches``). Every slot of the metadata is -1, so
nothing is written to the caches; the caches are only read.
"""

from types import SimpleNamespace

import torch

from . import dense_prefix
from .attention import MiniMaxM3SparseAttention
from .backend import MiniMaxM3SparseMetadata
from .kv_scale import KVScaleMode
from .compile_warmup import (MIXED_OFFSETS, GrowingBlockTable, layout_contexts,
                             prefill_token_counts, warm_cases, warm_up_launches)

def msa_layer(model: torch.nn.Module) -> MiniMaxM3SparseAttention | None:
    """The model's first sparse attention layer, or None (not MiniMax-M3)."""
    return next((m for m in model.modules() if isinstance(m, MiniMaxM3SparseAttention)),
                None)


def compile_plan(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                 layout) -> list[tuple[int, int, int, int]]:
    """(decode tokens, prefill tokens, context, prefill requests) of the compile
    pass: every decode batch up to ``max_num_seqs``; every ``prefill_token_counts``
    part at one context per prefill layout ``layout(tokens, context)`` can give;
    the real launches' prefill sizes as two requests and after ``MIXED_OFFSETS``
    decode tokens; every decode count below ``max_num_seqs`` ahead of a one-token
    prefill. A mixed batch's kernels take its decode and prefill tokens as two
    slices: the decode slice runs the decode launches of a batch that is not
    decode-only (no short decode; splits and warps by its token count), the
    prefill slice a prefill part, whose placement in the batch (first token, token
    maps off a 16-byte boundary) no variant depends on
    (``triton_ops._triton.BATCH_PLACEMENT``)."""
    chunk = min(max_num_batched_tokens, max_model_len)
    decode_ctx = min(max_model_len, 8192)
    plan = [(b, 0, decode_ctx, 0) for b in range(1, max_num_seqs + 1)]
    plan += [(b, 1, decode_ctx, 1) for b in range(1, max_num_seqs)
             if b < max_num_batched_tokens]
    for tokens in prefill_token_counts(chunk):
        plan += [(0, tokens, ctx, 1) for ctx in layout_contexts(tokens, max_model_len, layout)]
    for decode, tokens, ctx in warm_cases(max_num_batched_tokens, max_num_seqs, max_model_len):
        if decode:
            continue
        if tokens >= 2:
            plan.append((0, tokens, ctx, 2))
        plan += [(d, tokens, ctx, 1) for d in MIXED_OFFSETS
                 if d < max_num_seqs and d + tokens <= max_num_batched_tokens]
    return list(dict.fromkeys(plan))


def warm_metadata(num_decode: int, num_prefill: int, context: int, prefill_reqs: int,
                  block_table: torch.Tensor, dense_prefix_min_tokens: int,
                  device) -> MiniMaxM3SparseMetadata:
    """The metadata the builder gives a batch of ``num_decode`` decode requests
    (one token each, at ``context``) followed by ``prefill_reqs`` prefill
    requests sharing ``num_prefill`` tokens; the last prefill request is the
    batch's longest (``context``), the others are fresh prompts. Every slot is
    -1 (nothing written). ``block_table`` has the batch's rows."""
    q_lens = [1] * num_decode
    if prefill_reqs:
        share = num_prefill // prefill_reqs
        q_lens += [share] * (prefill_reqs - 1) + [num_prefill - share * (prefill_reqs - 1)]
    # decodes at the context, fresh prompts, then the longest request at the context
    seq_lens = [context] * num_decode
    if prefill_reqs:
        seq_lens += q_lens[num_decode:-1] + [context]
    reqs, tokens = len(q_lens), sum(q_lens)
    q_len_t = torch.tensor(q_lens, dtype=torch.int32)
    seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
    starts = torch.cat([q_len_t.new_zeros(1), q_len_t.cumsum(0)])
    # per token: its request, and its position (its request's first new position on)
    req = torch.repeat_interleave(torch.arange(reqs, dtype=torch.int32, device=device),
                                  q_len_t.to(device), output_size=tokens)
    first_pos = (seq_lens_cpu - q_len_t - starts[:-1]).to(device)
    pos = torch.arange(tokens, dtype=torch.int32, device=device) + first_pos[req.long()]
    return MiniMaxM3SparseMetadata(
        num_actual_tokens=tokens,
        block_table=block_table[:reqs],
        token_req=req,
        token_pos=pos.to(torch.int32),
        seq_lens=seq_lens_cpu.to(device),
        slot_mapping=torch.full((tokens,), -1, dtype=torch.int64, device=device),
        num_decode_tokens=num_decode,
        max_seq_len=max(seq_lens),
        prefill_chunks=dense_prefix.long_prefill_chunks(starts, seq_lens_cpu,
                                                        dense_prefix_min_tokens),
    )


class _Forward:
    """The Impl's forward on one layer's caches, for batches up to ``rows`` tokens."""

    def __init__(self, layer: MiniMaxM3SparseAttention, dtype: torch.dtype, rows: int,
                 max_model_len: int) -> None:
        self.layer, self.impl = layer, layer.impl
        self.kv, self.index_cache = layer.kv_cache, layer.index_cache.kv_cache
        self.dev = self.kv.device
        heads, kv_heads, size = self.impl.num_heads, self.impl.num_kv_heads, self.impl.head_size
        index_dim = layer.index_cache.index_dim

        def zeros(*shape):  # batch-wide inputs and output the batches slice
            return torch.zeros(rows, *shape, dtype=dtype, device=self.dev)

        self.q, self.out = zeros(heads, size), zeros(heads, size)
        self.k, self.v = zeros(kv_heads, size), zeros(kv_heads, size)
        self.idx_q, self.idx_k = zeros(kv_heads, index_dim), zeros(index_dim)
        self.tables = GrowingBlockTable(max_model_len, self.kv.shape[2], self.kv.shape[0],
                                        self.dev)
        self.kv_fp8 = self.impl.kv_scale_mode is not KVScaleMode.NONE

    def layout(self, tokens: int, context: int) -> dict:
        """The prefill layout the Impl picks for a prefill-only batch (knobs included)."""
        md = SimpleNamespace(num_actual_tokens=tokens, num_decode_tokens=0,
                             max_seq_len=context)
        return self.impl._prefill_layout(md, self.kv_fp8)

    def run(self, num_decode: int, num_prefill: int, context: int, prefill_reqs: int) -> None:
        md = warm_metadata(num_decode, num_prefill, context, prefill_reqs,
                           self.tables.rows(num_decode + prefill_reqs),
                           self.impl.dense_prefix_min_tokens, self.dev)
        t = md.num_actual_tokens
        self.impl.forward(self.layer, self.q[:t], self.k[:t], self.v[:t], self.idx_q[:t],
                          self.idx_k[:t], self.kv, self.index_cache, md, self.out[:t])

    def run_case(self, decode: bool, tokens: int, context: int) -> None:
        """A ``compile_warmup.warm_cases`` case: a decode batch or one prefill request."""
        if decode:
            self.run(tokens, 0, context, 0)
        else:
            self.run(0, tokens, context, 1)


def sparse_impl_warmup(model: torch.nn.Module, vllm_config) -> bool:
    """Compile every launch variant of the sparse layers' forward and run the real
    warm launches, on a GPU; False when there is nothing to warm (no MiniMax-M3
    sparse layer, no KV cache yet, CPU, or the PyTorch reference ops)."""
    layer = msa_layer(model)
    if layer is None or layer.kv_cache.numel() == 0 or not layer.kv_cache.is_cuda:
        return False
    from .msa_ops import select_sparse_ops

    if not select_sparse_ops(layer.kv_cache.device).triton:
        return False
    sched, model_config = vllm_config.scheduler_config, vllm_config.model_config
    max_tokens, max_seqs = sched.max_num_batched_tokens, sched.max_num_seqs
    max_model_len = model_config.max_model_len
    forward = _Forward(layer, model_config.dtype, max_tokens + max_seqs, max_model_len)
    plan = compile_plan(max_tokens, max_seqs, max_model_len, forward.layout)
    warm_up_launches("MiniMax-M3 MSA", plan, forward.run,
                     warm_cases(max_tokens, max_seqs, max_model_len), forward.run_case,
                     forward.dev)
    return True
