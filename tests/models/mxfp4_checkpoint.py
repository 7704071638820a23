# SPDX-License-Identifier: Apache-2.0
"""A Quark OCP MXFP4 checkpoint in the layout of amd/MiniMax-M3-MXFP4 (as its
description declares it: ``quant_method: quark``, MXFP4 weights and dynamic
MXFP4 activations on the routed and shared experts only, everything else in
full precision), from a MiniMax-M3 checkpoint in the released tensor names;
and the dequantizing reference.

Experts' ``<module>.weight`` [out, in] become uint8 [out, in / 2]: two E2M1
codes per byte (element 2i in the low nibble, 2i+1 in the high one; code =
sign << 3 | index into (0, 0.5, 1, 1.5, 2, 3, 4, 6)), and
``<module>.weight_scale`` uint8 [out, in / 32]: the E8M0 exponent of 32
consecutive inputs of a row, ``ceil(log2(amax / 6))`` so the block fits
without clipping. The real release's exact exclude-list naming was not
available: ``exclude`` names every other linear explicitly in the released
naming. The packing convention is the OCP/vLLM one; the CPU stand-in test
dequantizes with this file's reference, so only a GPU run with ``amd-quark``
checks it against Quark's kernels.
"""

import json
import os
import re

import torch

from minimax_m3_utils import load_weights_copy_rest

MX_BLOCK = 32
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
EXPERT_RE = re.compile(
    r"^language_model\.model\.layers\.\d+\.block_sparse_moe\.("
    r"experts\.\d+\.w[123]|shared_experts\.(gate|up|down)_proj)\.weight$"
)
LINEAR_RE = re.compile(
    r"^language_model\.model\.layers\.\d+\.("
    r"self_attn\.(q|k|v|o|index_q|index_k)_proj|mlp\.(gate|up|down)_proj"
    r"|block_sparse_moe\.gate)\.weight$"
)
_MXFP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
          "is_dynamic": False, "scale_format": "e8m0", "round_method": "half_even",
          "observer_cls": "PerBlockMXObserver", "symmetric": None, "scale_type": "float",
          "mx_element_dtype": None, "scale_calculation_mode": "even"}


def quark_mxfp4_config(exclude: list[str]) -> dict:
    return {
        "quant_method": "quark",
        "export": {"kv_cache_group": [], "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None,
                   "min_kv_scale": 0.0},
        "global_quant_config": {"weight": None, "input_tensors": None, "output_tensors": None,
                                "bias": None, "target_device": None},
        "layer_type_quant_config": {},
        "layer_quant_config": {"*experts*": {
            "weight": dict(_MXFP4), "input_tensors": dict(_MXFP4, is_dynamic=True),
            "output_tensors": None, "bias": None, "target_device": None}},
        "exclude": list(exclude),
        "algo_config": None,
        "quant_mode": "eager_mode",
    }


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (uint8 packed E2M1 [..., K / 2], uint8 E8M0 [..., K / 32])."""
    if w.shape[-1] % MX_BLOCK:
        raise ValueError(f"MXFP4 needs K to be a multiple of {MX_BLOCK}, got {tuple(w.shape)}")
    blocks = w.float().reshape(*w.shape[:-1], w.shape[-1] // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(-1)
    exp = torch.ceil(torch.log2((amax / 6.0).clamp(min=torch.finfo(torch.float32).tiny)))
    exp = exp.clamp(-127, 127)
    x = blocks / torch.exp2(exp).unsqueeze(-1)
    idx = (x.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)  # nearest magnitude
    code = (idx | ((x < 0) & (idx > 0)).to(idx.dtype) << 3).to(torch.uint8)
    code = code.reshape(*w.shape[:-1], w.shape[-1] // 2, 2)
    packed = code[..., 0] | (code[..., 1] << 4)
    return packed.contiguous(), (exp + 127).to(torch.uint8)


def dequantize_mxfp4(packed: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """uint8 packed E2M1 [..., K / 2] and uint8 E8M0 [..., K / 32] -> float32."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)
    mag = E2M1[(codes & 7).long()]
    vals = torch.where((codes & 8) > 0, -mag, mag)
    blocks = vals.reshape(*vals.shape[:-1], vals.shape[-1] // MX_BLOCK, MX_BLOCK)
    return (blocks * torch.exp2(s.float() - 127).unsqueeze(-1)).reshape(vals.shape)


def convert_to_quark_mxfp4(src: str, dst: str) -> str:
    from safetensors.torch import save_file

    tensors = load_weights_copy_rest(src, dst)
    out, exclude = {}, []
    for name, w in tensors.items():
        if EXPERT_RE.match(name):
            q, s = quantize_mxfp4(w)
            out[name], out[name[: -len("weight")] + "weight_scale"] = q, s
            continue
        if LINEAR_RE.match(name) or name == "language_model.lm_head.weight":
            exclude.append(name[: -len(".weight")])
        out[name] = w.contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = quark_mxfp4_config(sorted(exclude))
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dst


def dequantize_checkpoint(src: str, dst: str, dtype: torch.dtype = torch.float32) -> str:
    from safetensors.torch import save_file

    tensors = load_weights_copy_rest(src, dst)
    out = {}
    for name, t in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        s = tensors.get(name[: -len("weight")] + "weight_scale")
        out[name] = (dequantize_mxfp4(t, s).to(dtype) if s is not None else t).contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dst
