# SPDX-License-Identifier: Apache-2.0
"""The KV-scale type: config name -> per-layer mode -> the kernels' SCALE_MODE."""

import pytest
import torch


def test_config_names_and_bad_values():
    from vllm.models.minimax_m3.common.kv_scale import KVScaleMode

    assert KVScaleMode.from_config("scalar") is KVScaleMode.SCALAR
    assert KVScaleMode.from_config("per_token_head") is KVScaleMode.PER_TOKEN_HEAD
    with pytest.raises(ValueError, match=r"msa_kv_cache_scales must be one of "
                                         r"\('scalar', 'per_token_head'\), got 'tensor'"):
        KVScaleMode.from_config("tensor")


def test_layer_and_kernel_modes():
    from vllm.models.minimax_m3.common.kv_scale import KVScaleMode as M

    assert M.PER_TOKEN_HEAD.for_layer(fp8_cache=False) is M.NONE
    assert M.SCALAR.for_layer(fp8_cache=True) is M.SCALAR
    # the kernels' constexpr: scalar scales unfolded are mode 3, the rest their value
    assert M.SCALAR.kernel_mode(fold_scalar_scales=False) == 3
    assert M.SCALAR.kernel_mode(fold_scalar_scales=True) == 1
    assert M.PER_TOKEN_HEAD.kernel_mode(fold_scalar_scales=False) == 2
    assert type(M.NONE.kernel_mode(True)) is int


def test_scales_carry_what_their_mode_reads():
    from vllm.models.minimax_m3.common.kv_scale import KVScales, KVScaleMode as M

    one = torch.ones(())
    assert KVScales().args() == (M.NONE, None, None, None)
    assert KVScales(M.SCALAR, k=one, v=one).args()[:3] == (M.SCALAR, one, one)
    with pytest.raises(ValueError, match="KVScales\\(SCALAR\\) needs v"):
        KVScales(M.SCALAR, k=one)
    with pytest.raises(ValueError, match="needs per_token_head"):
        KVScales(M.PER_TOKEN_HEAD)


def test_layers_get_their_mode_from_the_config_and_cache():
    from types import SimpleNamespace

    from vllm.models.minimax_m3.common.attention import kv_scale_mode
    from vllm.models.minimax_m3.common.backend import MiniMaxM3SparseImpl
    from vllm.models.minimax_m3.common.kv_scale import KVScaleMode as M

    cfg = SimpleNamespace(msa_kv_cache_scales=None)
    assert kv_scale_mode(cfg, SimpleNamespace(msa_kv_cache_scales="per_token_head")) \
        is M.PER_TOKEN_HEAD
    assert kv_scale_mode(cfg) is M.SCALAR
    with pytest.raises(ValueError, match="msa_kv_cache_scales must be one of"):
        kv_scale_mode(SimpleNamespace(msa_kv_cache_scales="row"))
    impl = lambda dtype, scales: MiniMaxM3SparseImpl(  # noqa: E731
        4, 32, 32 ** -0.5, 2, kv_cache_dtype=dtype, sparse_block=32, topk_blocks=2,
        kv_scales=scales).kv_scale_mode
    assert impl("fp8", M.PER_TOKEN_HEAD) is M.PER_TOKEN_HEAD
    assert impl("fp8", M.SCALAR) is M.SCALAR
    assert impl("auto", M.PER_TOKEN_HEAD) is M.NONE
