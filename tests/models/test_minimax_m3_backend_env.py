# SPDX-License-Identifier: Apache-2.0
"""The sparse backend's environment switches: defaults, and a clear error for
anything but 0 / 1.
  VLLM_MINIMAX_M3_FOLD_KV_SCALE (default 1): fold scalar FP8 KV scales.
  VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE (default 0): fused top-k select and split
  merge in the Triton decode kernels.
  VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE (default 0): token tiles in the Triton
  prefill attention.
"""

import pytest

SWITCHES = {"VLLM_MINIMAX_M3_FOLD_KV_SCALE": ("fold_scalar_kv_scales", True),
            "VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE": ("one_launch_decode", False)}


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_switch(monkeypatch, name):
    from vllm.models.minimax_m3.common import backend

    fn, default = SWITCHES[name]
    read = getattr(backend, fn)
    monkeypatch.delenv(name, raising=False)
    assert read() is default
    for value, want in (("0", False), ("1", True)):
        monkeypatch.setenv(name, value)
        assert read() is want
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ValueError, match=f"{name} must be 0 or 1, got 'yes'"):
        read()


def test_prefill_token_tile(monkeypatch):
    """VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE (default 0 = off): tokens per program
    of the tiled prefill attention, a power of two up to 16."""
    from vllm.models.minimax_m3.common import backend

    name = "VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE"
    monkeypatch.delenv(name, raising=False)
    assert backend.prefill_token_tile() == 0
    for value in ("0", "1", "2", "4", "16"):
        monkeypatch.setenv(name, value)
        assert backend.prefill_token_tile() == int(value)
    for value in ("3", "32", "-2", "four"):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name} must be 0 or a power of two"):
            backend.prefill_token_tile()
