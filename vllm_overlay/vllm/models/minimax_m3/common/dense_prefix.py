# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Dense attention for the prefill tokens whose sparse selection is every block.

A query token at position ``p`` sees ``p // sparse_block + 1`` key blocks.
While that is at most ``topk`` (``p < topk * sparse_block``, the *dense
limit*) the indexer selects all of them, so the token's block-sparse
attention is exactly dense causal attention over keys ``0 .. p``: it does not
depend on the index. The first ``topk * sparse_block`` tokens of a prompt
(2048 at the released sizes) are such tokens.

``MiniMaxM3SparseImpl`` gives a prefill chunk's tokens below the dense limit
to ``dense_prefix_attention`` (torch SDPA over the K/V rows gathered from the
paged cache) and the rest to the sparse kernels. On CUDA/ROCm the dense part
runs on a second stream beside the index and the sparse attention
(``run_beside``); it needs no selection, so it starts as soon as the cache is
written. H200, an 8192-token first chunk: the step is 7% faster
(``docs/decisions/0009-dense-prefix.md``).

Spans are host data (from the builder's CPU offsets): a chunk qualifies when
at least ``min_tokens`` of its tokens lie below the dense limit.
"""

from typing import Callable, NamedTuple

import torch

from . import sparse_ops
from .kv_scale import KVScaleMode
from .envs import DENSE_PREFIX_DEFAULT_MIN_TOKENS

# Spans of at least this many tokens are attended densely (the default of
# VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS; its evidence is with the knob)
DEFAULT_MIN_TOKENS = DENSE_PREFIX_DEFAULT_MIN_TOKENS


class PrefillChunk(NamedTuple):
    """One request's prefill tokens in the batch (host ints)."""

    token_start: int  # first token of the chunk in the flattened batch
    num_tokens: int
    request: int  # row of the block table
    first_pos: int  # absolute position of token_start


class DenseSpan(PrefillChunk):
    """The leading tokens of a chunk that are attended densely (same fields)."""


def long_prefill_chunks(
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor | None,
    min_tokens: int,
) -> tuple[PrefillChunk, ...]:
    """The batch's chunks of at least ``min_tokens`` tokens (``min_tokens``
    0: none). ``seq_lens_cpu`` must be exact for those rows (vLLM's
    ``seq_lens_cpu_upper_bound`` is exact for prefill rows); None gives none."""
    if min_tokens <= 0 or seq_lens_cpu is None:
        return ()
    starts = query_start_loc_cpu[:-1].tolist()
    q_lens = (query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]).tolist()
    seq_lens = seq_lens_cpu.tolist()
    return tuple(
        PrefillChunk(starts[r], q_lens[r], r, seq_lens[r] - q_lens[r])
        for r in range(len(q_lens))
        if q_lens[r] >= min_tokens
    )


def dense_spans(
    chunks: tuple[PrefillChunk, ...], dense_limit: int, min_tokens: int
) -> tuple[DenseSpan, ...]:
    """Each chunk's tokens below ``dense_limit`` (= topk x sparse_block),
    where there are at least ``min_tokens`` of them."""
    spans = []
    for c in chunks:
        n = min(c.num_tokens, dense_limit - c.first_pos)
        if n >= min_tokens:
            spans.append(DenseSpan(c.token_start, n, c.request, c.first_pos))
    return tuple(spans)


def _span_kv(kv_cache, block_table, span, dtype, kv_scale_mode, k_scale, v_scale,
             kv_scales):
    """K and V rows ``0 .. first_pos + num_tokens - 1`` of the span's request,
    dequantised to ``dtype``: two [n_keys, Hkv, D] tensors."""
    page_size = kv_cache.shape[2]
    n_keys = span.first_pos + span.num_tokens
    n_pages = -(-n_keys // page_size)
    pages = block_table[span.request, :n_pages].long()
    kv = kv_cache[pages]  # [n_pages, 2, page, Hkv, D]
    kv = kv.transpose(1, 2).reshape(n_pages * page_size, 2, *kv.shape[3:])[:n_keys]
    if kv_scale_mode == KVScaleMode.NONE:
        return kv[:, 0].to(dtype), kv[:, 1].to(dtype)
    ks = None
    if kv_scale_mode == KVScaleMode.PER_TOKEN_HEAD:  # [n_pages, 2, page, Hkv] -> [n_keys, 2, Hkv]
        ks = kv_scales[pages].transpose(1, 2).reshape(n_pages * page_size, 2, -1)[:n_keys]
    return tuple(sparse_ops._dequant(kv[:, c], c, kv_scale_mode, scale, ks).to(dtype)
                 for c, scale in ((0, k_scale), (1, v_scale)))


def dense_prefix_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    spans: tuple[DenseSpan, ...],
    scale: float,
    kv_scale_mode: KVScaleMode = KVScaleMode.NONE,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_scales: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Causal attention of each span's queries over all earlier keys.

    ``q`` [T, Hq, D] (the batch), ``kv_cache`` [num_pages, 2, page, Hkv, D]
    (bf16/fp16, or e4m3 with ``kv_scale_mode`` 1: scalar ``k_scale`` /
    ``v_scale``, 2: ``kv_scales`` [num_pages, 2, page, Hkv]). Returns one
    [num_tokens, Hq, D] tensor in q.dtype per span; query token i of a span
    (position first_pos + i) sees keys 0 .. first_pos + i.
    """
    from torch.nn.attention.bias import causal_lower_right

    Hq, D = q.shape[1:]
    outs = []
    for span in spans:
        k, v = _span_kv(kv_cache, block_table, span, q.dtype, kv_scale_mode,
                        k_scale, v_scale, kv_scales)
        n_keys, Hkv = k.shape[:2]
        # [Hkv, n, D] -> [Hq, n, D]: query head h reads KV head h // (Hq // Hkv)
        k = k.transpose(0, 1)[:, None].expand(Hkv, Hq // Hkv, n_keys, D).reshape(Hq, n_keys, D)
        v = v.transpose(0, 1)[:, None].expand(Hkv, Hq // Hkv, n_keys, D).reshape(Hq, n_keys, D)
        qs = q[span.token_start : span.token_start + span.num_tokens].transpose(0, 1)
        if span.first_pos == 0:
            mask, causal = None, True
        else:  # the queries are the last num_tokens positions of the keys
            mask, causal = causal_lower_right(span.num_tokens, n_keys), False
        o = torch.nn.functional.scaled_dot_product_attention(
            qs[None], k[None], v[None], attn_mask=mask, is_causal=causal, scale=scale)
        outs.append(o[0].transpose(0, 1))
    return outs


class SideStream:
    """Runs work on a second stream of the current device beside the caller's
    (one stream per device, made on first use); on CPU, in order."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def run_beside(self, device: torch.device, side_fn: Callable[[], list],
                   main_fn: Callable[[], object]):
        """``side_fn()`` on the side stream, forked after the work queued so
        far, and ``main_fn()`` on the current stream; joined. Returns
        (main result, side result); the side result's tensors are safe to use
        and free on the current stream."""
        if device.type != "cuda":
            return main_fn(), side_fn()
        main = torch.cuda.current_stream(device)
        side = self._streams.get(device)
        if side is None:
            side = self._streams[device] = torch.cuda.Stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            side_out = side_fn()
        main_out = main_fn()
        main.wait_stream(side)
        for t in side_out:
            t.record_stream(main)
        return main_out, side_out


def attend_with_dense_prefix(
    side: SideStream,
    output: torch.Tensor,
    num_tokens: int,
    num_decode_tokens: int,
    spans: tuple[DenseSpan, ...],
    dense_fn: Callable[[], list[torch.Tensor]],
    sparse_fn: Callable[[int, tuple[DenseSpan, ...], torch.Tensor], None],
) -> None:
    """Fills ``output[:num_tokens]``: the spans' rows from ``dense_fn()`` (one
    [num_tokens, Hq, D] tensor per span, run on the side stream), the other
    rows from ``sparse_fn(first, cleared, out)``, which must write the batch's
    tokens ``first ..`` into ``out`` (= ``output[first:num_tokens]``) and give
    the ``cleared`` spans' tokens no selected block (their rows are then
    overwritten). A span that leads a prefill-only batch is cut off the
    sparse tokens (``first``) and written on the side stream; the others are
    copied in after the join."""
    lead = spans[:1] if spans[0].token_start == 0 and num_decode_tokens == 0 else ()
    first = lead[0].num_tokens if lead else 0
    cleared = spans[len(lead):]

    def on_side():
        outs = dense_fn()
        for span, o in zip(lead, outs):  # rows the sparse ops do not write
            output[span.token_start : span.token_start + span.num_tokens].copy_(o)
        return outs[len(lead):]

    _, rest = side.run_beside(output.device, on_side,
                              lambda: sparse_fn(first, cleared, output[first:num_tokens]))
    for span, o in zip(cleared, rest):
        output[span.token_start : span.token_start + span.num_tokens].copy_(o)


# One side stream per device for every sparse layer of the process.
SIDE_STREAM = SideStream()
