# SPDX-License-Identifier: Apache-2.0
"""The MSA wrappers learn the hardware in one place (``_utils.device_arch``):
a ROCm device is named by its gcnArchName, never taken for sm_90 (MI300X
reports compute capability 9.4), so the Gluon kernels' gates and PDL stay
off there; the ROCm token tiles apply on every AMD arch."""

import types

import pytest
import torch


@pytest.fixture
def utils():
    from vllm.models.minimax_m3.common.triton_ops import _utils
    _utils._cuda_device_arch.cache_clear()
    yield _utils
    _utils._cuda_device_arch.cache_clear()


def _props(**kw):
    return types.SimpleNamespace(**kw)


@pytest.mark.parametrize("hip, props, name, units", [
    ("6.4.1", _props(gcnArchName="gfx942:sramecc+:xnack-", major=9, minor=4,
                     multi_processor_count=304), "gfx942", 304),
    ("7.0.0", _props(gcnArchName="gfx950:sramecc+:xnack-", major=9, minor=5,
                     multi_processor_count=256), "gfx950", 256),
    (None, _props(major=9, minor=0, multi_processor_count=132), "sm_90", 132),
    (None, _props(major=10, minor=0, multi_processor_count=148), "sm_100", 148),
])
def test_device_arch_names_the_gpu(utils, monkeypatch, hip, props, name, units):
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda idx: props)
    arch = utils.device_arch(torch.device("cuda", 0))
    assert arch == utils.GpuArch(name, units)
    assert arch.rocm == (hip is not None)
    monkeypatch.setattr(utils, "device_arch", lambda device: arch)
    dev = torch.device("cuda", 0)
    assert utils.is_sm90(dev) == (name == "sm_90")
    assert utils.is_rocm(dev) == (hip is not None)
    assert utils.num_sms(dev) == units
    # PDL (NVIDIA-only griddepcontrol) on sm90+ CUDA only, compiled kernels only
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert utils.pdl_supported(dev) == (hip is None and utils.HAS_GDC)
    assert utils.use_pdl(dev, {}, 1) == (hip is None and utils.HAS_GDC)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not utils.pdl_supported(dev)


def test_off_gpu_has_no_arch(utils):
    cpu = torch.device("cpu")
    assert utils.device_arch(cpu) is None
    assert not utils.is_sm90(cpu) and not utils.is_rocm(cpu) and not utils.pdl_supported(cpu)
    assert utils.num_sms(cpu) == 4


@pytest.mark.parametrize("name", ["gfx942", "gfx950", "sm_90"])
def test_gluon_gates_follow_the_arch(utils, monkeypatch, name):
    """The sm_90 Gluon kernels' own gates, at the shapes they cover."""
    try:
        from vllm.models.minimax_m3.common.triton_ops.index_score_prefill_sm90 import (
            sm90_index_supported)
        from vllm.models.minimax_m3.common.triton_ops.sparse_attn_block_major_sm90 import (
            sm90_block_major_supported)
    except Exception as e:  # pragma: no cover - a Triton without Gluon's Hopper ops
        pytest.skip(f"no Gluon Hopper ops in this triton: {e}")
    monkeypatch.setattr(utils, "device_arch", lambda device: utils.GpuArch(name, 304))
    q = torch.empty((8, 16, 128), dtype=torch.bfloat16)
    cache = torch.empty((4, 128, 128), dtype=torch.bfloat16)
    want = name == "sm_90"
    for mode in (0, 1, 2):
        assert sm90_block_major_supported(q, mode, 128, 128, 16, 16, 4) == want
    assert sm90_index_supported(q[:, :1], cache, False, 128, 128, 8, 1, 64) == want
