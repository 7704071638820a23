# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""PyTorch reference ops for MiniMax Sparse Attention (MSA) over paged caches.

These define the semantics the Triton kernels
(``vllm.models.minimax_m3.common.triton_ops``) must match, and they are the
backend used on CPU. Layouts (per sparse layer):

* ``kv_cache``:    [num_pages, 2, page_size, num_kv_heads, head_dim]
* ``idx_k_cache``: [num_pages, page_size, index_dim]; an fp8 one with its
  ``idx_k_scales`` [num_pages, page_size] float32 are views of one packed
  page allocation (``fp8_index_cache_views``)
* ``kv_scales``:   [num_pages, 2, page_size, num_kv_heads] float32 (mode 2)

Batch description for T flattened query tokens of R requests:
``block_table`` [R, max_pages] int32, ``token_req`` [T] int32,
``token_pos`` [T] int32 (absolute position), ``seq_lens`` [R] int32.

Work is done per request on the keys ``0 .. max(token_pos)``; query tokens are
processed in chunks so memory stays bounded for long prefills.
"""

import torch

from .kv_scale import KVScaleMode

# Query tokens handled at once per request (bounds the [t, H, keys] buffers).
_TOKEN_CHUNK = 512


def _request_spans(token_req: torch.Tensor) -> list[tuple[int, int, int]]:
    """(request, start, end) for each run of equal ``token_req`` values."""
    if token_req.numel() == 0:
        return []
    req = token_req.tolist()
    spans, start = [], 0
    for i in range(1, len(req) + 1):
        if i == len(req) or req[i] != req[start]:
            spans.append((req[start], start, i))
            start = i
    return spans


def _write_rows(cache_tok: torch.Tensor, x: torch.Tensor, slots: torch.Tensor) -> None:
    """cache_tok: [num_pages, page_size, ...]; x[i] goes to slot slots[i] >= 0."""
    valid = slots >= 0
    if not bool(valid.all()):
        x, slots = x[valid], slots[valid]
    page_size = cache_tok.shape[1]
    slots = slots.long()
    cache_tok[slots // page_size, slots % page_size] = x.to(cache_tok.dtype)


# the FP8 e4m3 caches: OCP e4m3fn (max 448; NVIDIA, MI355X / gfx950) and
# e4m3fnuz (max 240, exponent bias 8, no negative zero; MI300X / MI325X, gfx942)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def per_token_head_scales(x: torch.Tensor,
                          fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """FP8 dequantisation scale of each (token, KV head) row of x [T, Hkv, D]
    for a cache of ``fp8_dtype``: amax / its max (448 e4m3fn, 240 e4m3fnuz) in
    fp32 (1.0 for an all-zero row)."""
    amax = x.float().abs().amax(-1)
    return torch.where(amax > 0, amax / torch.finfo(fp8_dtype).max, 1.0)


def write_sparse_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    idx_k: torch.Tensor,
    kv_cache: torch.Tensor,
    idx_k_cache: torch.Tensor,
    slots: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_scales: torch.Tensor | None = None,
    idx_scales: torch.Tensor | None = None,
) -> None:
    """Store K/V [T, Hkv, D] and index keys [T, Didx] at ``slots`` [T]
    (negative = skip). An fp8 ``kv_cache`` stores ``clamp(x / scale)``: with
    the scalar ``k_scale`` / ``v_scale``, or, when ``kv_scales``
    [num_pages, 2, page_size, Hkv] is given, with per (token, KV head) scales
    computed here (``per_token_head_scales``) and stored there. An fp8
    ``idx_k_cache`` stores each index key the same way, its scale in
    ``idx_scales`` [num_pages, page_size]."""
    if kv_cache.dtype in FP8_DTYPES:
        fmax = torch.finfo(kv_cache.dtype).max
        if kv_scales is not None:
            ks = per_token_head_scales(k, kv_cache.dtype)
            vs = per_token_head_scales(v, kv_cache.dtype)
            _write_rows(kv_scales[:, 0], ks, slots)
            _write_rows(kv_scales[:, 1], vs, slots)
            k_scale, v_scale = ks[..., None], vs[..., None]
        k = (k.float() / k_scale).clamp(-fmax, fmax)
        v = (v.float() / v_scale).clamp(-fmax, fmax)
    _write_rows(kv_cache[:, 0], k, slots)
    _write_rows(kv_cache[:, 1], v, slots)
    if idx_k_cache.dtype in FP8_DTYPES:
        if idx_scales is None:
            raise ValueError("an fp8 index-key cache needs idx_scales [num_pages, page_size]")
        fmax = torch.finfo(idx_k_cache.dtype).max
        s = per_token_head_scales(idx_k[:, None, :], idx_k_cache.dtype)[:, 0]  # one per token
        _write_rows(idx_scales, s, slots)
        idx_k = (idx_k.float() / s[:, None]).clamp(-fmax, fmax)
    _write_rows(idx_k_cache, idx_k, slots)


INDEX_SCALE_BYTES = 4  # one float32 scale per fp8 index key


def fp8_index_cache_views(
    pages: torch.Tensor, index_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and the scales of an fp8 index-key cache, as views.

    ``pages`` [num_pages, page_size, index_dim + 4] e4m3, contiguous, is how
    the engine allocates it; a page holds its ``page_size`` keys first
    (``index_dim`` bytes each), then their ``page_size`` float32 scales:
    ``index_dim + 4`` bytes per token, and the keys of a page are one
    contiguous run. Returns keys [num_pages, page_size, index_dim] e4m3 (page
    stride ``page_size * (index_dim + 4)``) and scales [num_pages, page_size]
    float32, the ``idx_k_cache`` / ``idx_k_scales`` of the ops here and of the
    Triton kernels."""
    if pages.dtype not in FP8_DTYPES or pages.dim() != 3:
        raise ValueError(
            "an fp8 index-key cache is e4m3 [num_pages, page_size, index_dim + "
            f"{INDEX_SCALE_BYTES}], got {pages.dtype} {tuple(pages.shape)}")
    num_pages, page_size, width = pages.shape
    if index_dim % INDEX_SCALE_BYTES or width != index_dim + INDEX_SCALE_BYTES:
        raise ValueError(
            f"an fp8 index-key cache of index_dim {index_dim} (a multiple of "
            f"{INDEX_SCALE_BYTES}) has rows of {index_dim + INDEX_SCALE_BYTES} bytes, "
            f"got {width}")
    if not pages.is_contiguous():
        raise ValueError("the fp8 index-key cache must be contiguous (pages packed as "
                         "[keys | scales]); got strides " + str(pages.stride()))
    page_bytes = page_size * width
    keys = pages.as_strided((num_pages, page_size, index_dim), (page_bytes, index_dim, 1))
    flat = pages.view(num_pages, page_bytes).view(torch.uint8)
    scales = flat[:, page_size * index_dim:].view(torch.float32)
    return keys, scales


def _gather_pages(
    cache: torch.Tensor, pages: torch.Tensor, n_keys: int
) -> torch.Tensor:
    """Contiguous [n_keys, ...] view of one request's paged tokens."""
    page_size = cache.shape[1]
    n_pages = -(-n_keys // page_size)
    g = cache[pages[:n_pages].long()]  # [n_pages, page_size, ...]
    return g.reshape(n_pages * page_size, *cache.shape[2:])[:n_keys]


def index_block_topk(
    idx_q: torch.Tensor,
    idx_k_cache: torch.Tensor,
    block_table: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    sparse_block: int,
    topk: int,
    local_blocks: int = 1,
    init_blocks: int = 0,
    idx_k_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Select the top-``topk`` key blocks per (query token, index head).

    Score of token t against key j is ``idx_q[t, h] . idx_k[j]`` in fp32 with
    no scale, for ``j <= token_pos[t]``; with an fp8 index-key cache,
    ``idx_k_scales`` [num_pages, page_size] float32 holds each key's scale
    (idx_k = cache value x scale). A block's score is the max over its
    visible keys. The query's own block and the ``local_blocks - 1`` blocks
    before it, and the first ``init_blocks`` blocks, are always selected.
    Returns [T, H_idx, topk] int32 block ids (position // sparse_block),
    left-packed, without repeats, padded with -1.
    """
    T, H, _ = idx_q.shape
    out = torch.full((T, H, topk), -1, dtype=torch.int32, device=idx_q.device)
    page_size = idx_k_cache.shape[1]
    assert sparse_block % page_size == 0, (sparse_block, page_size)
    for r, s, e in _request_spans(token_req):
        n_keys = int(token_pos[s:e].max()) + 1
        keys = _gather_pages(idx_k_cache, block_table[r], n_keys).float()
        if idx_k_scales is not None:
            keys = keys * _gather_pages(idx_k_scales, block_table[r], n_keys)[:, None]
        n_blocks = -(-n_keys // sparse_block)
        pad = n_blocks * sparse_block - n_keys
        key_pos = torch.arange(n_keys, device=idx_q.device)
        for cs in range(s, e, _TOKEN_CHUNK):
            ce = min(cs + _TOKEN_CHUNK, e)
            pos = token_pos[cs:ce].long()
            scores = torch.einsum("thd,jd->thj", idx_q[cs:ce].float(), keys)
            future = key_pos[None, None, :] > pos[:, None, None]
            scores = scores.masked_fill(future, float("-inf"))
            if pad:
                scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
            blk = scores.view(ce - cs, H, n_blocks, sparse_block).amax(-1)
            own = pos // sparse_block
            forced = [(own - i).clamp(min=0) for i in range(local_blocks)]
            forced += [
                torch.minimum(torch.full_like(own, i), own) for i in range(init_blocks)
            ]
            for f in forced:
                blk.scatter_(-1, f.view(-1, 1, 1).expand(-1, H, 1), float("inf"))
            k = min(topk, n_blocks)
            vals, ids = blk.topk(k, dim=-1)
            ids = ids.to(torch.int32).masked_fill(vals == float("-inf"), -1)
            out[cs:ce, :, :k] = ids
    return out


def _dequant(
    x: torch.Tensor,
    kind: int,
    kv_scale_mode: KVScaleMode,
    scale: torch.Tensor | None,
    kv_scales_req: torch.Tensor | None,
) -> torch.Tensor:
    x = x.float()
    if kv_scale_mode == KVScaleMode.SCALAR:
        x = x * scale.float()
    elif kv_scale_mode == KVScaleMode.PER_TOKEN_HEAD:
        x = x * kv_scales_req[:, kind, :, None]
    return x


def block_sparse_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    topk_blocks: torch.Tensor,
    sparse_block: int,
    scale: float,
    kv_scale_mode: KVScaleMode = KVScaleMode.NONE,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """GQA attention restricted to the selected key blocks.

    Query head h uses KV head ``h // (Hq // Hkv)`` and that KV head's
    ``topk_blocks``; a key is visible iff its block is selected and
    ``key_pos <= token_pos``. Softmax in fp32; returns [T, Hq, Dh] in q.dtype.
    ``kv_scale_mode`` (``kv_scale.KVScaleMode``): NONE, SCALAR ``k_scale``/``v_scale``,
    PER_TOKEN_HEAD ``kv_scales`` [num_pages, 2, page_size, Hkv].
    """
    T, Hq, D = q.shape
    Hkv = kv_cache.shape[3]
    G = Hq // Hkv
    out = torch.zeros(T, Hq, D, dtype=q.dtype, device=q.device)
    page_size = kv_cache.shape[2]
    assert sparse_block % page_size == 0, (sparse_block, page_size)
    for r, s, e in _request_spans(token_req):
        n_keys = int(token_pos[s:e].max()) + 1
        n_pages = -(-n_keys // page_size)
        pages = block_table[r, :n_pages].long()
        kv = kv_cache[pages]  # [n_pages, 2, page_size, Hkv, D]
        ks = None
        if kv_scale_mode == KVScaleMode.PER_TOKEN_HEAD:
            # [n_pages, 2, page, Hkv] -> [n_keys, 2, Hkv]
            ks = kv_scales[pages].transpose(1, 2).reshape(-1, 2, Hkv)[:n_keys]
        kv = kv.transpose(1, 2).reshape(n_pages * page_size, 2, Hkv, D)[:n_keys]
        k = _dequant(kv[:, 0], 0, kv_scale_mode, k_scale, ks)  # [n, Hkv, D]
        v = _dequant(kv[:, 1], 1, kv_scale_mode, v_scale, ks)
        n_blocks = -(-n_keys // sparse_block)
        key_pos = torch.arange(n_keys, device=q.device)
        key_blk = key_pos // sparse_block
        for cs in range(s, e, _TOKEN_CHUNK):
            ce = min(cs + _TOKEN_CHUNK, e)
            t = ce - cs
            pos = token_pos[cs:ce].long()
            sel = topk_blocks[cs:ce].long()  # [t, Hkv, topk]
            sel = torch.where(sel < 0, n_blocks, sel).clamp(max=n_blocks)
            chosen = torch.zeros(
                t, Hkv, n_blocks + 1, dtype=torch.bool, device=q.device
            )
            chosen.scatter_(-1, sel, True)
            allowed = chosen[..., key_blk]  # [t, Hkv, n]
            allowed &= (key_pos[None, :] <= pos[:, None])[:, None, :]
            qf = q[cs:ce].float().view(t, Hkv, G, D)
            logits = torch.einsum("thgd,jhd->thgj", qf, k) * scale
            logits = logits.masked_fill(~allowed[:, :, None, :], float("-inf"))
            p = torch.softmax(logits, dim=-1).nan_to_num(0.0)
            o = torch.einsum("thgj,jhd->thgd", p, v)
            out[cs:ce] = o.reshape(t, Hq, D).to(q.dtype)
    return out
