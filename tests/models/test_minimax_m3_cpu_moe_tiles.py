# SPDX-License-Identifier: Apache-2.0
"""MoE sizes vLLM's CPU fused MoE cannot tile are refused at model construction.

vLLM's CPU grouped-GEMM MoE (the AVX-512 BF16 build's ``prepack_moe_weight``;
csrc/cpu/cpu_fused_moe.cpp) needs w13's 2 x intermediate rows per rank to be a
multiple of 2 x 32; its Python dispatch only checks 32, so an intermediate size of
48 used to abort the process in C++ ("Check failed: output_size_13 %
min_w13_n_tile_size == 0"). The engine tests run in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a ``setup`` can stand in for that build."""

import pytest
import torch
from minimax_m3_utils import build_checkpoint, run_vllm

from vllm.models.minimax_m3.common.layers import cpu_moe_tile_problem

AVX512_BUILD = ("import vllm.models.minimax_m3.common.layers as L\n"
                "L._cpu_moe_features = lambda: (True, False)\n")


def test_tile_rule_mirrors_vllm_cpu_moe_dispatch():
    bf16, f32 = torch.bfloat16, torch.float32
    why = cpu_moe_tile_problem(48, 64, bf16, grouped_gemm=True, amx=False)
    assert why is not None
    assert "intermediate size per rank is 48" in why and "96 rows" in why
    assert "multiple of 64 rows" in why and "multiple of 32" in why
    for n in (32, 64, 96, 128):                    # whole tile pairs: fine
        assert cpu_moe_tile_problem(n, 64, bf16, grouped_gemm=True, amx=False) is None
    # sizes vLLM sends to its torch path (any size works there)
    assert cpu_moe_tile_problem(48, 64, bf16, grouped_gemm=False, amx=False) is None
    assert cpu_moe_tile_problem(40, 64, f32, grouped_gemm=True, amx=False) is None  # 80 % 32
    assert cpu_moe_tile_problem(48, 48, f32, grouped_gemm=True, amx=False) is None  # hidden
    assert cpu_moe_tile_problem(48, 64, bf16, grouped_gemm=True, amx=True) is None  # 48 % 32
    assert cpu_moe_tile_problem(48, 64, f32, grouped_gemm=True, amx=True) is None   # not bf16
    # AMX with its conditions met takes the grouped GEMM, whose tiles are 32 too
    assert cpu_moe_tile_problem(64, 64, bf16, grouped_gemm=True, amx=True) is None


@pytest.fixture(scope="module")
def ckpt48(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("moe48") / "m"), intermediate_size=48)


def test_untileable_size_refused_at_construction(ckpt48, tmp_path):
    res = run_vllm(str(tmp_path / "run"), ckpt48, [[5, 6, 7]], 2, setup=AVX512_BUILD,
                   llm_kwargs=dict(dtype="bfloat16", max_model_len=256, block_size=32))
    assert "error" in res, res
    err = res["error"] + res.get("log", "")
    assert "MiniMax-M3 on CPU: the MoE intermediate size per rank is 48" in err, err[-3000:]
    assert "needs a multiple of 64 rows" in err and "multiple of 32" in err


def test_size_runs_where_vllm_takes_the_torch_path(ckpt48, tmp_path):
    """Without the grouped GEMM (or when this CPU's build has it: refused, as above)."""
    from vllm.models.minimax_m3.common.layers import _cpu_moe_features
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    grouped, amx = _cpu_moe_features()
    res = run_vllm(str(tmp_path / "run"), ckpt48, [[5, 6, 7]], 2,
                   llm_kwargs=dict(dtype="bfloat16", max_model_len=256, block_size=32))
    if cpu_moe_tile_problem(48, 64, torch.bfloat16, grouped_gemm=grouped, amx=amx):
        assert "intermediate size per rank is 48" in res.get("error", ""), res
    else:
        assert "error" not in res, res
        assert len(res["rounds"][0][0]["tokens"]) == 2
