# SPDX-License-Identifier: Apache-2.0
"""Fused shared expert option (``fuse_shared_expert``): config reading and
refusals. The end-to-end parity test (fused engine vs. the default engine and
transformers) is test_minimax_m3.py::test_fp32_fused_shared_expert_matches,
which reuses that module's default engine and transformers reference."""

import pytest


def test_fused_shared_expert_refusals():
    """Cases the fused layout cannot serve are refused with a clear error."""
    from types import SimpleNamespace

    from vllm.models.minimax_m3.common.layers import (
        _check_fused_shared_expert,
        fuse_shared_expert_enabled,
    )

    cfg = SimpleNamespace(shared_intermediate_size=32, intermediate_size=32)
    _check_fused_shared_expert(cfg, None)  # fine
    with pytest.raises(ValueError, match="fuse_shared_expert cannot be used: "
                       "shared_intermediate_size 48"):
        _check_fused_shared_expert(
            SimpleNamespace(shared_intermediate_size=48, intermediate_size=32), None)
    quant = SimpleNamespace(get_name=lambda: "fp8")
    with pytest.raises(ValueError, match="quantization 'fp8'"):
        _check_fused_shared_expert(cfg, quant)
    # read from the text config first, then the top-level config; default off
    top = SimpleNamespace(fuse_shared_expert=True)
    assert fuse_shared_expert_enabled(SimpleNamespace(), SimpleNamespace()) is False
    assert fuse_shared_expert_enabled(SimpleNamespace(), top) is True
    assert fuse_shared_expert_enabled(
        SimpleNamespace(fuse_shared_expert=False), top) is False
    with pytest.raises(ValueError, match="must be true or false"):
        fuse_shared_expert_enabled(SimpleNamespace(fuse_shared_expert="yes"), None)


def test_fused_shared_expert_refused_with_expert_parallel():
    from types import SimpleNamespace

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.config.parallel import ParallelConfig
    from vllm.models.minimax_m3.common.layers import _check_fused_shared_expert

    vc = VllmConfig(parallel_config=ParallelConfig(enable_expert_parallel=True))
    cfg = SimpleNamespace(shared_intermediate_size=32, intermediate_size=32)
    with set_current_vllm_config(vc), pytest.raises(
            ValueError, match="expert parallelism"):
        _check_fused_shared_expert(cfg, None)
