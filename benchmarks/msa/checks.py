# SPDX-License-Identifier: Apache-2.0
"""Inputs (a paged decode / prefill ``Batch`` at one TP4 rank's shapes) and the
correctness check against a plain torch reference (float32/64)."""

import copy
import os
import traceback

import torch

from .harness import B, D, DIDX, FP8, HIDX, HKV, HQ, PAGE, TOPK, _load_sparse_ops, default_layout


def quantize_kv(kv, kv_mode):
    """(cache, k_scale, v_scale, kv_scales) of bf16 K/V ``kv`` [num_pages, 2,
    PAGE, HKV, D] stored in ``kv_mode``: 0 as is; 1 fp8 e4m3 with scalar
    scales (amax / 448 of all K, of all V); 2 fp8 with one scale per token and
    KV head (kv_scales [num_pages, 2, PAGE, HKV]; ``PTH_POW2_SCALES=1``: rounded up to
    powers of two, a diagnostic of whether timings depend on the operands' mantissas)."""
    if kv_mode == 0:
        return kv, None, None, None
    if kv_mode == 1:
        amax = kv.float().abs().amax(dim=(0, 2, 3, 4))
        k_scale = (amax[0] / 448.0).reshape(1).contiguous()
        v_scale = (amax[1] / 448.0).reshape(1).contiguous()
        sc = torch.stack([k_scale, v_scale]).view(1, 2, 1, 1, 1)
        return (kv.float() / sc).to(FP8), k_scale, v_scale, None
    kv_scales = (kv.float().abs().amax(-1) / 448.0).clamp_min(1e-8)
    if os.environ.get("PTH_POW2_SCALES") == "1":
        # diagnostic: scales rounded up to powers of two, so the dequantized
        # values keep fp8's 3 mantissa bits (as with scalar scales folded out)
        kv_scales = torch.exp2(torch.ceil(torch.log2(kv_scales)))
    kv_scales = kv_scales.contiguous()
    return (kv.float() / kv_scales[..., None]).to(FP8), None, None, kv_scales


class Batch:
    """Requests laid out in a paged cache (random page order)."""

    def __init__(self, ctxs, new_tokens, kv_mode, dev, idx_fp8=False):
        self.ctxs = ctxs  # total tokens per request (incl. new)
        R = len(ctxs)
        pages = [-(-c // PAGE) for c in ctxs]
        self.max_pages = max(pages)
        num_pages = sum(pages)
        perm = torch.randperm(num_pages, device=dev).to(torch.int32)
        bt = torch.zeros(R, self.max_pages, dtype=torch.int32, device=dev)
        k = 0
        for r, p in enumerate(pages):
            bt[r, :p] = perm[k:k + p]
            k += p
        self.block_table = bt
        req, pos = [], []
        for r, c in enumerate(ctxs):
            req += [r] * new_tokens
            pos += list(range(c - new_tokens, c))
        self.token_req = torch.tensor(req, dtype=torch.int32, device=dev)
        self.token_pos = torch.tensor(pos, dtype=torch.int32, device=dev)
        T = len(pos)
        self.T = T
        self.idx_q = torch.randn(T, HIDX, DIDX, device=dev, dtype=torch.bfloat16)
        self.idx_k = torch.randn(num_pages, PAGE, DIDX, device=dev, dtype=torch.bfloat16)
        self.idx_k8 = self.idx_s = None
        if idx_fp8:
            # the engine's fp8 index cache: packed pages [keys | float32 scales]
            # (DIDX + 4 bytes per token), keys and scales as views of them
            s = self.idx_k.float().abs().amax(-1) / 448.0
            pages = torch.zeros(num_pages, PAGE, DIDX + 4, dtype=FP8, device=dev)
            self.idx_k8, self.idx_s = _load_sparse_ops().fp8_index_cache_views(pages, DIDX)
            self.idx_k8.copy_((self.idx_k.float() / s[..., None]).to(FP8))
            self.idx_s.copy_(s)
        self.q = torch.randn(T, HQ, D, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(num_pages, 2, PAGE, HKV, D, device=dev, dtype=torch.bfloat16)
        self.kv_mode = kv_mode
        self.kv, self.k_scale, self.v_scale, self.kv_scales = quantize_kv(kv, kv_mode)
        del kv

    def with_kv_mode(self, kv_mode):
        """This batch (same pages, queries and index) with its bf16 K/V stored
        in ``kv_mode`` instead (1 fp8 scalar, 2 fp8 per-token-head scales)."""
        assert self.kv_mode == 0 and kv_mode in (1, 2)
        other = copy.copy(self)
        other.kv_mode = kv_mode
        other.kv, other.k_scale, other.v_scale, other.kv_scales = quantize_kv(self.kv, kv_mode)
        return other

    def dequant_kv(self):
        """Float32 [num_pages, 2, PAGE, HKV, D] of what the kernel should see."""
        if self.kv_mode == 0:
            return self.kv.float()
        if self.kv_mode == 1:
            sc = torch.stack([self.k_scale, self.v_scale]).view(1, 2, 1, 1, 1)
            return self.kv.float() * sc
        return self.kv.float() * self.kv_scales[..., None]

    def contiguous_rows(self, cache, r, n=None):
        """[n, ...] rows (default: all ctx) of request r from a paged
        [num_pages, PAGE, ...] cache."""
        n = self.ctxs[r] if n is None else n
        return cache[self.block_table[r, : -(-n // PAGE)].long()].flatten(0, 1)[:n]


def ref_block_scores(bt: Batch, idx_k=None, idx_s=None):
    """[T, HIDX, nblocks_max] float32 block scores (+inf forced, -inf invisible)."""
    idx_k = bt.idx_k if idx_k is None else idx_k
    nbm = -(-max(bt.ctxs) // B)
    out = torch.full((bt.T, HIDX, nbm), float("-inf"), device=bt.q.device)
    for r in range(len(bt.ctxs)):
        tok = (bt.token_req == r).nonzero().flatten()
        if tok.numel() == 0:
            continue
        keys = bt.contiguous_rows(idx_k, r).float()
        if idx_s is not None:
            keys = keys * bt.contiguous_rows(idx_s, r).float()[:, None]
        n = keys.shape[0]
        pos = bt.token_pos[tok].long()
        for c0 in range(0, tok.numel(), 1024):
            tk, ps = tok[c0:c0 + 1024], pos[c0:c0 + 1024]
            s = torch.einsum("thd,nd->thn", bt.idx_q[tk].double(), keys.double()).float()
            s = s.masked_fill(torch.arange(n, device=s.device)[None, None, :] > ps[:, None, None],
                              float("-inf"))
            nb = -(-n // B)
            s = torch.nn.functional.pad(s, (0, nb * B - n), value=float("-inf"))
            bs = s.view(len(tk), HIDX, nb, B).amax(-1)
            own = ps // B
            bs[torch.arange(len(tk)), :, own] = float("inf")
            out[tk, :, :nb] = bs
    return out


def check_selection(sel, scores):
    """Fraction of (token, head) rows whose selection is a valid top-k (set equal
    to the reference up to score ties) plus the first failure message."""
    T, H, _ = sel.shape
    sel = sel.long()
    nvis = torch.isfinite(scores).sum(-1) + (scores == float("inf")).sum(-1)
    nvalid = nvis.clamp(max=TOPK)
    ar = torch.arange(TOPK, device=sel.device)
    ok_pack = ((sel >= 0) == (ar[None, None, :] < nvalid[..., None])).all(-1)
    safe = sel.clamp(min=0)
    chosen = torch.gather(scores, 2, safe).masked_fill(sel < 0, float("inf"))
    dup = torch.zeros_like(scores, dtype=torch.int32).scatter_add_(
        2, safe, (sel >= 0).to(torch.int32))
    ok_dup = (dup <= 1).all(-1)
    rest = scores.clone()
    rest.scatter_(2, safe, float("-inf"))
    kth = rest.amax(-1)
    fin = torch.where(torch.isfinite(scores), scores.abs(), torch.zeros_like(scores)).amax(-1)
    ok_thr = chosen.amin(-1) >= kth - 1e-3 * (1 + fin)
    ok = ok_pack & ok_dup & ok_thr
    msg = ""
    if not bool(ok.all()):
        t, h = (~ok).nonzero()[0].tolist()
        msg = (f"token {t} head {h}: got {sel[t, h].tolist()} pack={bool(ok_pack[t, h])} "
               f"dup={bool(ok_dup[t, h])} thr={bool(ok_thr[t, h])}")
    return float(ok.float().mean()), msg


def ref_attention(bt: Batch, sel):
    """[T, HQ, D] float32 reference over the dequantised cache."""
    deq = bt.dequant_kv()
    out = torch.zeros(bt.T, HQ, D, device=bt.q.device)
    G = HQ // HKV
    for r in range(len(bt.ctxs)):
        tok = (bt.token_req == r).nonzero().flatten()
        if tok.numel() == 0:
            continue
        K = bt.contiguous_rows(deq[:, 0], r)  # [n, HKV, D]
        V = bt.contiguous_rows(deq[:, 1], r)
        n = K.shape[0]
        for c0 in range(0, tok.numel(), 256):
            tk = tok[c0:c0 + 256]
            pos = bt.token_pos[tk].long()
            for g in range(HKV):
                s_blk = sel[tk, g].long()  # [t, TOPK]
                kpos = s_blk[:, :, None] * B + torch.arange(B, device=s_blk.device)  # [t,K,B]
                valid = (s_blk[:, :, None] >= 0) & (kpos <= pos[:, None, None]) & (kpos < n)
                kpos = kpos.clamp(0, n - 1).flatten(1)
                valid = valid.flatten(1)
                k = K[kpos, g]  # [t, K*B, D]
                v = V[kpos, g]
                q = bt.q[tk, g * G:(g + 1) * G].float()  # [t, G, D]
                s = torch.einsum("tgd,tnd->tgn", q, k) * D ** -0.5
                s = s.masked_fill(~valid[:, None, :], float("-inf"))
                out[tk, g * G:(g + 1) * G] = torch.einsum("tgn,tnd->tgd", torch.softmax(s, -1), v)
    return out


def correctness(index_block_topk, block_sparse_attention, dev):
    results = []
    cases = [
        ("decode", [100, 127, 128, 5000, 40000, 131072], 1),
        ("prefill", [20000], 1024),
        ("prefill_short", [700], 700),
    ]
    for name, ctxs, new in cases:
        for kv_mode in (0, 1, 2):
            tag = f"{name} kv={['bf16', 'fp8-scalar', 'fp8-per-token-head'][kv_mode]}"
            try:
                bt = Batch(ctxs, new, kv_mode, dev, idx_fp8=(kv_mode == 0))
                nd = bt.T if new == 1 else 0
                sel = torch.full((bt.T, HIDX, TOPK), 999, dtype=torch.int32, device=dev)
                index_block_topk(bt.idx_q, bt.idx_k, bt.block_table, bt.token_req, bt.token_pos,
                                 B, TOPK, out=sel, num_decode_tokens=nd)
                scores = ref_block_scores(bt)
                frac, msg = check_selection(sel, scores)
                entry = dict(case=tag, topk_valid_fraction=frac, topk_msg=msg)
                if kv_mode == 0:
                    sel8 = index_block_topk(bt.idx_q, bt.idx_k8, bt.block_table, bt.token_req,
                                            bt.token_pos, B, TOPK, idx_k_scales=bt.idx_s,
                                            num_decode_tokens=nd)
                    f8, m8 = check_selection(sel8, ref_block_scores(bt, bt.idx_k8, bt.idx_s))
                    entry.update(fp8_index_valid_fraction=f8, fp8_index_msg=m8,
                                 fp8_index_overlap_with_bf16=overlap(sel8, sel))
                outs = {}
                variants = [dict(num_splits=n) for n in (None, 1, 4)]
                if nd == 0:  # prefill: also the engine's layout (block-major from 1024 tokens)
                    variants.append(default_layout(block_sparse_attention, bt.T, max(ctxs),
                                                   kv_mode != 0))
                    entry["layout"] = variants[-1]
                for i, kw in enumerate(variants):
                    o = torch.full_like(bt.q, float("nan"))
                    block_sparse_attention(bt.q, bt.kv, bt.block_table, bt.token_req,
                                           bt.token_pos, sel, B, D ** -0.5, kv_mode, bt.k_scale,
                                           bt.v_scale, bt.kv_scales, out=o, **kw)
                    outs[i] = o
                ref = ref_attention(bt, sel)
                err = max(float((o.float() - ref).abs().max()) for o in outs.values())
                nan = any(bool(o.isnan().any()) for o in outs.values())
                entry.update(attn_max_abs_err=err, attn_ref_max=float(ref.abs().max()))
                entry["passed"] = bool(frac == 1.0 and not nan and err < 2e-2 + 1e-2 * entry["attn_ref_max"]
                                       and entry.get("fp8_index_valid_fraction", 1.0) == 1.0)
            except Exception:  # noqa: BLE001
                entry = dict(case=tag, passed=False, error=traceback.format_exc())
            print(f"[check] {tag}: {'PASS' if entry['passed'] else 'FAIL'} "
                  f"{ {k: v for k, v in entry.items() if k not in ('case', 'error')} }", flush=True)
            if "error" in entry:
                print(entry["error"], flush=True)
            results.append(entry)
            torch.cuda.empty_cache()
    return results


def same_selection(a, b):
    """The same block ids in every row of two selections (the order of the ids
    inside a row is unspecified: arg-max rounds write them by score, the
    threshold search by block id)."""
    return bool(torch.equal(a.sort(dim=-1).values, b.sort(dim=-1).values))


def overlap(a, b):
    """Mean |A & B| / |B| over rows of two selections."""
    a, b = a.long(), b.long()
    m = (a[..., :, None] == b[..., None, :]) & (b[..., None, :] >= 0)
    inter = m.any(-2).sum(-1).float()
    return float((inter / (b >= 0).sum(-1).clamp(min=1)).mean())

