# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 with Quark OCP MXFP4 checkpoints (the amd/MiniMax-M3-MXFP4
format: ``quant_method: quark``, MXFP4 weights with E8M0 scales per 32 inputs
and dynamic MXFP4 activations on the routed and shared experts only).

What vLLM v0.23.0 can do with it: the Quark OCP MX MoE method picks a native
MXFP4 x MXFP4 backend where one exists (AMD), else its emulation
(``OCP_MXQuantizationEmulationTritonExperts``: Triton experts on weights
dequantized on the fly, activations quantize-dequantized), and the shared
expert's linears emulate in PyTorch; both emulations call the ``amd-quark``
package. On CPU there is no path (the emulated experts are Triton GPU
kernels); the model refuses at construction, naming the checkpoint and the
alternative. On an NVIDIA GPU without ``amd-quark`` it refuses likewise.
"""

import json
import os
import shutil

import pytest
import torch

from minimax_m3_utils import build_checkpoint, run_vllm

pytest.importorskip("transformers.models.minimax_m3_vl")

_MXFP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1,
          "is_dynamic": False, "scale_format": "e8m0", "round_method": "half_even",
          "observer_cls": "PerBlockMXObserver", "symmetric": None, "scale_type": "float",
          "mx_element_dtype": None, "scale_calculation_mode": "even"}
QUARK_MXFP4 = {
    "quant_method": "quark",
    "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized",
               "weight_merge_groups": None, "min_kv_scale": 0.0},
    "global_quant_config": {"weight": None, "input_tensors": None, "output_tensors": None,
                            "bias": None, "target_device": None},
    "layer_type_quant_config": {},
    "layer_quant_config": {
        pattern: {"weight": dict(_MXFP4), "input_tensors": dict(_MXFP4, is_dynamic=True),
                  "output_tensors": None, "bias": None, "target_device": None}
        for pattern in ("*block_sparse_moe.experts.*", "*block_sparse_moe.shared_experts.*")
    },
    "exclude": ["lm_head"],
    "algo_config": None,
    "quant_mode": "eager_mode",
}


def test_quark_ocp_mx_is_detected():
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
    from vllm.models.minimax_m3.common.model import _quark_ocp_mx

    assert _quark_ocp_mx(QuarkConfig.from_config(json.loads(json.dumps(QUARK_MXFP4))))
    fp8 = json.loads(json.dumps(QUARK_MXFP4))
    for c in fp8["layer_quant_config"].values():
        c["weight"] = dict(c["weight"], dtype="fp8_e4m3", qscheme="per_channel")
        c["input_tensors"] = None
    assert not _quark_ocp_mx(QuarkConfig.from_config(fp8))
    assert not _quark_ocp_mx(None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
def test_mxfp4_quark_on_cpu_is_refused_clearly(tmp_path):
    path = build_checkpoint(str(tmp_path / "src"))
    dst = str(tmp_path / "mxfp4")
    shutil.copytree(path, dst)
    p = os.path.join(dst, "config.json")
    cfg = json.load(open(p))
    cfg["quantization_config"] = QUARK_MXFP4
    json.dump(cfg, open(p, "w"))
    res = run_vllm(str(tmp_path / "run"), dst, [[5, 6, 7]], 1, timeout=300,
                   llm_kwargs=dict(dtype="bfloat16", block_size=32, max_model_len=128))
    err = res.get("error", "") + res.get("traceback", "")
    assert "amd/MiniMax-M3-MXFP4" in err and "cannot run on CPU" in err, err[-3000:]
    assert "serve the BF16 checkpoint MiniMaxAI/MiniMax-M3" in err, err[-3000:]
