# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""How the sparse (MSA) layers' KV cache rows are scaled: one type from the config
option to the kernels' ``SCALE_MODE`` constexpr.

``msa_kv_cache_scales`` (config or ``--hf-overrides``) names the scheme of an FP8
cache; each sparse layer turns it into its ``KVScaleMode`` (a layer whose cache
stays in the model dtype has ``NONE``); the backend passes the mode with its
tensors (``KVScales``) to the ops; the Triton wrapper hands ``int(mode)`` to the
kernels, choosing ``SCALAR_UNFOLDED`` where scalar scales are not folded.
"""

from dataclasses import dataclass
from enum import IntEnum

import torch


class KVScaleMode(IntEnum):
    """The scale of a K/V cache row; the values are the kernels' ``SCALE_MODE``."""

    NONE = 0             # model-dtype cache: no scale
    SCALAR = 1           # FP8: one k_scale / v_scale per layer, folded into q and the output
    PER_TOKEN_HEAD = 2   # FP8: a float32 scale per token and KV head, in each row's padding
    SCALAR_UNFOLDED = 3  # kernels only: SCALAR applied to each K/V element (no folding)

    @classmethod
    def from_config(cls, name: str) -> "KVScaleMode":
        """The FP8 scheme that ``msa_kv_cache_scales`` names."""
        try:
            return CONFIG_NAMES[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"MiniMax-M3: msa_kv_cache_scales must be one of "
                f"{tuple(CONFIG_NAMES)}, got {name!r}.") from None

    def for_layer(self, fp8_cache: bool) -> "KVScaleMode":
        """This scheme on one layer: ``NONE`` where the layer's cache is not FP8."""
        return self if fp8_cache else KVScaleMode.NONE

    def kernel_mode(self, fold_scalar_scales: bool) -> int:
        """The ``SCALE_MODE`` constexpr for the attention kernels."""
        if self is KVScaleMode.SCALAR and not fold_scalar_scales:
            return int(KVScaleMode.SCALAR_UNFOLDED)
        return int(self)


CONFIG_NAMES = {"scalar": KVScaleMode.SCALAR, "per_token_head": KVScaleMode.PER_TOKEN_HEAD}


@dataclass(frozen=True)
class KVScales:
    """A layer's scale mode with the tensors it reads: ``k`` / ``v`` float32 scalars
    (SCALAR; registered buffers that captured graphs read by address), or
    ``per_token_head`` [pages, 2, page, Hkv] float32 (PER_TOKEN_HEAD)."""

    mode: KVScaleMode = KVScaleMode.NONE
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    per_token_head: torch.Tensor | None = None

    def __post_init__(self):
        need = {KVScaleMode.SCALAR: ("k", "v"), KVScaleMode.PER_TOKEN_HEAD: ("per_token_head",)}
        missing = [n for n in need.get(self.mode, ()) if getattr(self, n) is None]
        if missing:
            raise ValueError(f"KVScales({self.mode.name}) needs {', '.join(missing)}")

    def args(self) -> tuple:
        """``(mode, k_scale, v_scale, kv_scales)``: the ops' positional scale arguments."""
        return self.mode, self.k, self.v, self.per_token_head
