# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""OCP MXFP4 checkpoint weights dequantized while loading (the weights-only path
for amd/MiniMax-M3-MXFP4, ``VLLM_MINIMAX_M3_MXFP4=bf16``).

Layouts (OCP Microscaling, as the Quark checkpoint stores them):
  ``<module>.weight``        uint8 [out, in / 2]: two E2M1 codes per byte, element
                             2i in the low nibble and 2i + 1 in the high one; a code
                             is sign << 3 | index into ``E2M1_VALUES``;
  ``<module>.weight_scale``  uint8 [out, in / 32] (float8_e8m0fnu read as uint8):
                             the power of two 2 ** (s - 127) of 32 consecutive inputs
                             of a row; 255 is E8M0's NaN and is refused.
The result is the model dtype [out, in]: exact (an E2M1 value times a power of two
fits bf16 whenever the scale is within bf16's exponent range).
"""

from collections.abc import Iterable, Iterator

import torch

MX_BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E8M0_NAN = 255


def _code_table(device: torch.device) -> torch.Tensor:
    magnitudes = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([magnitudes, -magnitudes])   # code 8 + i: the negative of code i


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                     name: str = "tensor") -> torch.Tensor:
    """``packed`` uint8 [..., K / 2] and ``scales`` uint8 (or float8_e8m0fnu)
    [..., K / 32] -> ``dtype`` [..., K]. ``name`` is the checkpoint tensor the
    errors name."""
    if scales.dtype != torch.uint8 and "e8m0" in str(scales.dtype):
        scales = scales.view(torch.uint8)
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(
            f"MiniMax-M3 MXFP4: {name} must be uint8 packed E2M1 codes with uint8 (or "
            f"float8_e8m0fnu) E8M0 scales, got {packed.dtype} and {scales.dtype}")
    k = 2 * packed.shape[-1]
    if (scales.shape[:-1] != packed.shape[:-1] or k % MX_BLOCK
            or scales.shape[-1] * MX_BLOCK != k):
        raise ValueError(
            f"MiniMax-M3 MXFP4: {name} holds {tuple(packed.shape)} packed codes "
            f"({k} inputs per row) but {tuple(scales.shape)} scales; expected one scale "
            f"per {MX_BLOCK} inputs, [..., {k // MX_BLOCK}]")
    if bool((scales == _E8M0_NAN).any()):
        raise ValueError(f"MiniMax-M3 MXFP4: {name}_scale holds the E8M0 NaN code (255)")
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], k)
    values = _code_table(packed.device)[codes.long()]
    powers = torch.exp2(scales.float() - 127.0).repeat_interleave(MX_BLOCK, dim=-1)
    return (values * powers).to(dtype)


def dequantized_weights(weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint stream with every MXFP4 pair (a uint8 ``X.weight`` and its
    ``X.weight_scale``, in either order) replaced by one ``X.weight`` in ``dtype``;
    every other tensor passes through. A half without its partner at the end of the
    stream is an error naming it."""
    held: dict[str, dict[str, torch.Tensor]] = {}
    for name, w in weights:
        base, _, kind = name.rpartition(".")
        if kind == "weight_scale" or (kind == "weight" and w.dtype == torch.uint8):
            pair = held.setdefault(base, {})
            pair[kind] = w
            if len(pair) == 2:
                del held[base]
                yield (f"{base}.weight",
                       dequantize_mxfp4(pair["weight"], pair["weight_scale"], dtype,
                                        f"{base}.weight"))
            continue
        yield name, w
    if held:
        base, pair = next(iter(held.items()))
        have = next(iter(pair))
        missing = "weight_scale" if have == "weight" else "weight"
        raise ValueError(
            f"MiniMax-M3 MXFP4: the checkpoint has {base}.{have} but no {base}.{missing} "
            f"({len(held)} such tensor(s)); an MXFP4 weight needs its E8M0 scales")
