# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The MiniMax-M3 series' MSA kernels inside upstream's MiniMax-M3.

Upstream's sparse layer runs its indexer (top-k block ids into the shared
``topk_indices_buffer``: token-major [tokens, KV heads, top-k] in the NVIDIA
model, head-major in the AMD one; the series reads it token-major either way,
``token_major_topk``) and then its block-sparse attention; both pick a kernel impl class. With
``VLLM_MINIMAX_M3_MSA=series`` (the default) these two impls run the series'
ops instead: the Triton kernels of ``triton_ops`` on CUDA/ROCm, the PyTorch
reference of ``sparse_ops`` elsewhere (vLLM's CPU build, where upstream's
Triton kernels cannot run). ``VLLM_MINIMAX_M3_MSA=upstream`` keeps vLLM's own
kernels, so one install serves both sides of an A/B.

Layouts (upstream's caches, read in place):
  K/V cache: logical [pages, Hkv, page, 2 D] (K then V per row), any strides;
      the series' kernels take the view [pages, 2, page, Hkv, D].
  index-key cache: [pages, page, D_idx], model dtype.
  top-k: int32 block ids in request order, left-packed, -1 for empty slots.
Both impls split the batch as upstream's builders do (decode tokens first) and
derive each token's request and absolute position from that metadata.
"""

import torch

from vllm import envs
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.platforms import current_platform

from .indexer import MiniMaxM3IndexerTritonImpl
from .msa_ops import SparseOps, select_sparse_ops, token_request_positions
from .sparse_attention import MiniMaxM3SparseImpl, _minimax_m3_aiter_sparse_pa_requested

logger = init_logger(__name__)


def series_msa_selected() -> bool:
    """``VLLM_MINIMAX_M3_MSA``: True for "series"; "upstream" needs a GPU.

    AITER's sparse paged attention on ROCm (``VLLM_ROCM_USE_AITER=1`` with
    ``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1``) allocates the K/V cache in AITER's
    shuffled layout, which the series' kernels cannot read: there the default
    (the knob unset) is upstream's path, and an explicit "series" is refused."""
    choice = envs.VLLM_MINIMAX_M3_MSA.lower()
    if choice == "upstream" and not current_platform.is_cuda_alike():
        raise ValueError(
            "VLLM_MINIMAX_M3_MSA=upstream selects vLLM's Triton MSA kernels, which need a "
            f"CUDA or ROCm GPU; this platform is {current_platform.device_name!r}. Unset it "
            "(or set it to 'series') to run MiniMax-M3 with the series' MSA ops here."
        )
    if choice == "series" and _minimax_m3_aiter_sparse_pa_requested():
        if envs.is_set("VLLM_MINIMAX_M3_MSA"):
            raise ValueError(
                "VLLM_MINIMAX_M3_MSA=series reads MiniMax-M3's packed K/V cache, but "
                "AITER's sparse paged attention is on (VLLM_ROCM_USE_AITER=1 with "
                "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1), which lays the cache out shuffled "
                "for AITER's kernels. Unset VLLM_MINIMAX_M3_MSA to serve with AITER's "
                "sparse attention, or set VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0 to serve "
                "with the series' MSA kernels.")
        logger.info_once("MiniMax-M3: AITER's sparse paged attention is on (shuffled K/V "
                         "cache): upstream's MSA path serves, not the series'")
        return False
    return choice == "series"


def token_major_topk(buf: torch.Tensor | None) -> torch.Tensor | None:
    """The models' shared top-k buffer as the series' ops read and write it,
    [tokens, index heads, top-k]: the NVIDIA model's buffer as it is, the AMD
    model's (head-major) as a transposed view."""
    if buf is None or not current_platform.is_rocm():
        return buf
    return buf.transpose(0, 1)


def series_kv_cache(impl, kv_cache: torch.Tensor) -> torch.Tensor:
    """Upstream's K/V cache as the series' kernels read it: viewed as the FP8
    dtype the impl was built with when the cache holds FP8 (vLLM allocates it
    as uint8), else as it is."""
    return kv_cache.view(impl.kv_cache_fp8_dtype) if impl.use_fp8_kv else kv_cache


def series_kv_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """Upstream's K/V cache (logical [pages, Hkv, page, 2 D]) as the series'
    [pages, 2, page, Hkv, D] view of the same memory."""
    pages, hkv, page, two_d = kv_cache.shape
    d = two_d // 2
    s_page, s_head, s_row, s_dim = kv_cache.stride()
    return kv_cache.as_strided(
        (pages, 2, page, hkv, d), (s_page, d * s_dim, s_row, s_head, s_dim),
        kv_cache.storage_offset())


_ARANGE: dict[torch.device, torch.Tensor] = {}


def _arange(n: int, device: torch.device) -> torch.Tensor:
    """[0, n) int32: a view of one cached device tensor, no launch per call
    (computed afresh while a CUDA graph is being captured)."""
    buf = _ARANGE.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.arange(n, device=device, dtype=torch.int32)
        buf = torch.arange(max(1024, 1 << (n - 1).bit_length()), device=device,
                           dtype=torch.int32)
        _ARANGE[device] = buf
    return buf[:n]


def decode_layout(seq_lens: torch.Tensor, num_tokens: int, query_len: int):
    """(request, position) of uniform decode tokens: ``query_len`` per request.
    One token per request (no speculative tokens) takes two launches: token i
    is request i at position ``seq_lens[i] - 1``."""
    if query_len == 1:
        pos = seq_lens[:num_tokens].to(torch.int32) - 1
        return _arange(num_tokens, seq_lens.device), pos.clamp_(min=0)
    tokens = _arange(num_tokens, seq_lens.device)
    req = tokens // query_len
    pos = seq_lens.to(torch.int32)[req.long()] - query_len + tokens % query_len
    return req, pos.clamp(min=0)


def prefill_layout(cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int):
    """(request, position) of prefill tokens (``cu_seqlens_q`` rebased to 0)."""
    return token_request_positions(cu_seqlens_q, seq_lens, _arange(num_tokens, seq_lens.device))


def _token_maps(md):
    """(decode (request, position), prefill (request, position)) of the batch,
    either None where the batch has no such tokens."""
    nd, total = md.num_decode_tokens, md.num_actual_tokens
    dec = pre = None
    if md.num_decodes > 0:
        dec = decode_layout(md.decode.seq_lens, nd, md.decode.decode_query_len)
    if md.num_prefills > 0:
        pre = prefill_layout(md.prefill.cu_seqlens_q, md.prefill.seq_lens, total - nd)
    return dec, pre


def _parts(md):
    """[(decode?, first token, end token, block table, request, position)] of the batch.
    The token maps are built once per metadata object (every sparse layer's indexer
    and attention reads the same batch: on the H100, 6 rebuilds a step on 3 layers
    were about 50 small launches per batch-1 decode step); a copy of the metadata
    (vLLM copies it to swap block tables) builds its own."""
    cached = getattr(md, "_series_token_maps", None)
    if cached is None or cached[0] != id(md):
        cached = (id(md), _token_maps(md))
        md._series_token_maps = cached
    dec, pre = cached[1]
    nd, total = md.num_decode_tokens, md.num_actual_tokens
    parts = []
    if dec is not None:
        parts.append((True, 0, nd, md.decode.block_table, *dec))
    if pre is not None:
        parts.append((False, nd, total, md.prefill.block_table, *pre))
    return parts


def _ops(cache: torch.Tensor, impl) -> SparseOps:
    if getattr(impl, "_series_ops", None) is None:
        impl._series_ops = select_sparse_ops(cache.device)
    return impl._series_ops


def series_index_forward(impl, index_query: torch.Tensor):
    """The series' index scoring + top-k for upstream's indexer impl ``impl``:
    writes the token-major top-k into ``impl.topk_indices_buffer`` and returns
    upstream's ``(decode_topk, prefill_topk)`` views of it."""
    attn_metadata = get_forward_context().attn_metadata
    if not isinstance(attn_metadata, dict):
        return None, None  # profiling run; caches unbound
    md = attn_metadata[impl.index_cache.prefix]
    total = md.num_actual_tokens
    iq = index_query[:total].view(-1, impl.num_index_heads, impl.index_head_dim)
    cache = impl.index_cache.kv_cache
    if cache.dtype != iq.dtype:
        raise ValueError(
            f"the series' MSA path reads a {iq.dtype} index-key cache, got {cache.dtype}; "
            "use the model dtype for index keys or VLLM_MINIMAX_M3_MSA=upstream")
    buf = token_major_topk(impl.topk_indices_buffer)
    if buf is None:
        buf = torch.empty(total, impl.num_index_heads, impl.topk_blocks, dtype=torch.int32,
                          device=iq.device)
    ops = _ops(cache, impl)
    for decode, first, end, block_table, req, pos in _parts(md):
        kw = {"num_decode_tokens": end - first if decode else 0} if ops.triton else {}
        topk = ops.index_block_topk(
            iq[first:end], cache, block_table, req, pos, impl.block_size, impl.topk_blocks,
            impl.local_blocks, impl.init_blocks, **kw)
        buf[first:end].copy_(topk)
    nd = md.num_decode_tokens
    return (buf[:nd] if md.num_decodes else None,
            buf[nd:total] if md.num_prefills else None)


def series_attention_forward(impl, layer, query: torch.Tensor, kv_cache: torch.Tensor,
                             output: torch.Tensor) -> torch.Tensor:
    """The series' block-sparse attention for upstream's main impl ``impl``,
    over the top-k the series' indexer left in ``layer.topk_indices_buffer``."""
    attn_metadata = get_forward_context().attn_metadata
    if not isinstance(attn_metadata, dict):
        return output  # profiling run; caches unbound
    md = attn_metadata[layer.layer_name]
    total, hd = md.num_actual_tokens, impl.head_size
    q = query[:total].view(-1, impl.num_heads, hd)
    out = output[:total].view(-1, impl.num_heads, hd)
    cache = series_kv_cache(impl, kv_cache)
    kv = series_kv_view(cache)
    mode, k_scale, v_scale = 0, None, None
    if impl.use_fp8_kv:  # scalar scales, as upstream reads them
        mode, k_scale, v_scale = 1, layer._k_scale, layer._v_scale
    topk = token_major_topk(layer.topk_indices_buffer)
    ops = _ops(cache, impl)
    for decode, first, end, block_table, req, pos in _parts(md):
        args = (q[first:end], kv, block_table, req, pos, topk[first:end], impl.block_size,
                impl.scale, mode, k_scale, v_scale, None)
        if ops.triton:
            layout = {}
            if not decode:  # the measured prefill layout (block-major or token tiles)
                from .triton_ops import default_prefill_layout

                layout = default_prefill_layout(end - first, md.prefill.max_seq_len,
                                                impl.block_size, impl.topk_blocks, mode != 0)
            ops.block_sparse_attention(*args, out=out[first:end], **layout)
        else:  # the reference returns a new tensor
            out[first:end].copy_(ops.block_sparse_attention(*args))
    return output


class MiniMaxM3IndexerSeriesImpl(MiniMaxM3IndexerTritonImpl):
    """Upstream's indexer (its cache and metadata builder) on the series' ops."""

    def forward(self, index_query: torch.Tensor):
        return series_index_forward(self, index_query)


class MiniMaxM3SparseSeriesImpl(MiniMaxM3SparseImpl):
    """Upstream's block-sparse attention (its cache and metadata) on the series' ops."""

    def forward(self, layer, query, kv_cache, output):
        return series_attention_forward(self, layer, query, kv_cache, output)
