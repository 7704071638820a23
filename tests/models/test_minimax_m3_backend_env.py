# SPDX-License-Identifier: Apache-2.0
"""The sparse backend's environment switches: defaults, and a clear error for
anything but 0 / 1.
  VLLM_MINIMAX_M3_FOLD_KV_SCALE (default 1): fold scalar FP8 KV scales.
  VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE (default 0): fused top-k select and split
  merge in the Triton decode kernels.
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
