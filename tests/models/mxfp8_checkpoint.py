# SPDX-License-Identifier: Apache-2.0
"""Turn a MiniMax-M3 checkpoint (released tensor names, any float dtype; a
tiny one from ``minimax_m3_utils.build_checkpoint`` or a production-shaped
few-layer one) into the format of the official MiniMax-M3-MXFP8 release, and
back (the dequantizing reference).

Format written (the release's, as its config and tensors declare it):

* ``config.json`` gets a top-level ``quantization_config =
  {"quant_method": "mxfp8", "activation_scheme": "dynamic",
  "weight_block_size": [1, 32]}`` (optionally with an ``ignored_layers`` list);
* every targeted linear weight ``<module>.weight`` [out, in] is stored as
  float8_e4m3fn with ``<module>.weight_scale_inv`` [out, in / 32] in uint8:
  an E8M0 shared exponent per 32 consecutive inputs of a row (OCP MX: the
  block's value is ``2 ** (byte - 127)``, byte 255 = NaN is never written).
  Targets: attention q/k/v/o, the indexer ``index_q_proj`` / ``index_k_proj``,
  the dense MLP gate/up/down, the shared expert gate/up/down and the routed
  experts w1/w3/w2;
* lm_head, embed_tokens, norms, the routing bias, the vision parts and every
  ``block_sparse_moe.gate`` (the router) keep their source dtype; the router is
  stored in float32 as in the release.

Block exponent: ``ceil(log2(amax / 448))`` over the block's 32 values, so the
largest element maps into E4M3's range without clipping (exponents clamped to
[-127, 127]; an all-zero block gets 2^-126); elements are ``w / 2**e`` rounded
to E4M3.

``dequantize_checkpoint`` writes the float checkpoint the MXFP8 values
represent (``q * 2**e`` exactly, in float32 or bfloat16: E4M3 times a power of
two is exact in both), config without ``quantization_config``: what
transformers (the oracle) loads for parity tests.
"""

import json
import os
import re
import shutil

import torch
from minimax_m3_utils import load_weights_copy_rest

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
MX_BLOCK = 32
E8M0_BIAS = 127
MXFP8_QUANT_CONFIG = {
    "quant_method": "mxfp8",
    "activation_scheme": "dynamic",
    "weight_block_size": [1, MX_BLOCK],
}

# released tensor names of the targeted linears (text model only)
TARGET_RE = re.compile(
    r"^language_model\.model\.layers\.\d+\.("
    r"self_attn\.(q|k|v|o|index_q|index_k)_proj"
    r"|mlp\.(gate|up|down)_proj"
    r"|block_sparse_moe\.(gate|up|down)_proj"  # a dense MLP as transformers 5.17 saves it
    r"|block_sparse_moe\.experts\.\d+\.w[123]"
    r"|block_sparse_moe\.shared_experts\.(gate|up|down)_proj"
    r")\.weight$"
)
ROUTER_RE = re.compile(r"^language_model\.model\.layers\.\d+\.block_sparse_moe\.gate\.weight$")


def quantize_mxfp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] (K a multiple of 32) -> (float8_e4m3fn [..., K], uint8 E8M0
    [..., K / 32]) with w ~= dequantize_mxfp8(q, s)."""
    if w.shape[-1] % MX_BLOCK:
        raise ValueError(
            f"MXFP8 needs the input dimension to be a multiple of {MX_BLOCK}, "
            f"got a tensor of shape {tuple(w.shape)}."
        )
    blocks = w.float().reshape(*w.shape[:-1], w.shape[-1] // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    tiny = torch.finfo(torch.float32).tiny
    exp = torch.ceil(torch.log2((amax / FP8_MAX).clamp(min=tiny)))
    exp = exp.clamp(-E8M0_BIAS, E8M0_BIAS)
    scale = torch.exp2(exp)
    q = (blocks / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(w.shape), (exp + E8M0_BIAS).to(torch.uint8)


def dequantize_mxfp8(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [..., K] and uint8 E8M0 [..., K / 32] -> float32."""
    if s.dtype != torch.uint8:
        s = s.view(torch.uint8)
    blocks = q.float().reshape(*q.shape[:-1], q.shape[-1] // MX_BLOCK, MX_BLOCK)
    scale = torch.exp2(s.float() - E8M0_BIAS)
    return (blocks * scale.unsqueeze(-1)).reshape(q.shape)


def released_ignore_list(tensors) -> list[str]:
    """Explicit names of the text model's unquantized linears (LM head and
    routers) plus the vision parts, in the released naming."""
    names = sorted(n[: -len(".weight")] for n in tensors if ROUTER_RE.match(n))
    if "language_model.lm_head.weight" in tensors:
        names.insert(0, "language_model.lm_head")
    return names + ["vision_tower", "multi_modal_projector", "patch_merge_mlp"]


def convert_to_mxfp8(
    src: str,
    dst: str,
    *,
    ignored_layers: str | None = None,
    device: str = "cpu",
    router_dtype: torch.dtype = torch.float32,
) -> str:
    """Write the MXFP8 form of checkpoint ``src`` to ``dst``.

    ignored_layers: None (no list, as in the declaration quoted above) or
    "released" (explicit released module names: LM head, routers, vision)."""
    from safetensors.torch import save_file

    tensors = load_weights_copy_rest(src, dst)
    out: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if TARGET_RE.match(name):
            q, s = quantize_mxfp8(w.to(device))
            out[name] = q.cpu().contiguous()
            out[name[: -len("weight")] + "weight_scale_inv"] = s.cpu().contiguous()
        elif ROUTER_RE.match(name):
            out[name] = w.to(router_dtype).contiguous()
        else:
            out[name] = w.contiguous()
    if not any(n.endswith(".weight_scale_inv") for n in out):
        raise ValueError(f"no targeted linear weights found in {src}")
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})

    qcfg = dict(MXFP8_QUANT_CONFIG)
    if ignored_layers == "released":
        qcfg["ignored_layers"] = released_ignore_list(tensors)
    elif ignored_layers is not None:
        raise ValueError(f"unknown ignored_layers style {ignored_layers!r}")
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = qcfg
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dst


def dequantize_checkpoint(src: str, dst: str, dtype: torch.dtype = torch.float32) -> str:
    """The float checkpoint an MXFP8 checkpoint ``src`` represents: every
    ``weight`` / ``weight_scale_inv`` pair replaced by ``q * 2**(s - 127)`` in
    ``dtype``; other tensors copied; ``quantization_config`` removed."""
    from safetensors.torch import save_file

    tensors = load_weights_copy_rest(src, dst)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(".weight_scale_inv"):
            continue
        scale = tensors.get(name[: -len("weight")] + "weight_scale_inv")
        if name.endswith(".weight") and scale is not None:
            t = dequantize_mxfp8(t, scale).to(dtype)
        elif t.dtype == torch.float8_e4m3fn:
            raise ValueError(f"{name} is float8 but has no weight_scale_inv")
        out[name] = t.contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("quantization_config", None)
    cfg.get("text_config", {}).pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dst


def vary_rows(src: str, dst: str, pattern=TARGET_RE, max_factor: float = 8.0,
              seed: int = 3) -> str:
    """Copy of checkpoint ``src`` whose weights matching ``pattern`` have their
    rows scaled by log-uniform factors in [1/max_factor, max_factor] (so that
    rows' scales differ and a misplaced scale row shows)."""
    import math

    from safetensors.torch import save_file

    tensors = load_weights_copy_rest(src, dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, w in sorted(tensors.items()):
        if pattern.match(n):
            f = torch.exp((torch.rand(w.shape[0], 1, generator=g) * 2 - 1)
                          * math.log(max_factor))
            w = (w.float() * f).to(w.dtype)
        out[n] = w.contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst
