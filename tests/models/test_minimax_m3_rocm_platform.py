# SPDX-License-Identifier: Apache-2.0
"""MiniMax-M3 under vLLM's ROCm platform, on CPU (``rocm_platform_probe.py``
builds the layers with ``current_platform`` a ``RocmPlatform`` for gfx942 /
gfx950, in a fresh process):

* dense layers take ``--attention-backend ROCM_AITER_UNIFIED_ATTN`` (the
  seeds') and vLLM's other ROCm backends, with FP8 KV and without; sparse
  layers keep their own backend, with the platform's FP8 (e4m3fnuz on gfx942,
  e4m3fn on gfx950) for the K/V and index-key caches;
* ``VLLM_ROCM_USE_AITER=1`` puts the MoE on aiter's fused MoE; v0.23.0's
  ``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1`` fuses shared experts only
  for models that hand FusedMoE ``n_shared_experts`` (softmax routers), which
  MiniMax-M3 (sigmoid + bias routing) does not: its shared expert stays a
  separate MLP, or with ``fuse_shared_expert`` is one more expert of the
  aiter fused MoE (the series' own fusion);
* aiter is imported only by vLLM's ROCm attention Impls when built on ROCm,
  never by the model package (on CPU not even attempted)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BACKENDS = {"ROCM_AITER_UNIFIED_ATTN": "RocmAiterUnifiedAttentionBackend",
            "ROCM_ATTN": "RocmAttentionBackend",
            "ROCM_AITER_FA": "AiterFlashAttentionBackend",
            "TRITON_ATTN": "TritonAttentionBackend"}
FP8 = {"gfx942": "torch.float8_e4m3fnuz", "gfx950": "torch.float8_e4m3fn"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=sorted(FP8))
def probe(request):
    env = dict(os.environ, PORT=str(_free_port()))
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, str(HERE / "rocm_platform_probe.py"), request.param],
                         env=env, capture_output=True, text=True, timeout=900)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("PROBE ")]
    assert res.returncode == 0 and line, res.stdout[-3000:] + res.stderr[-6000:]
    return json.loads(line[-1][len("PROBE "):])


def test_platform_is_rocm(probe):
    assert probe["platform"] == "RocmPlatform"
    assert probe["fp8_dtype"] == FP8[probe["arch"]]


def test_dense_layers_take_the_rocm_backends(probe):
    for name, cls in BACKENDS.items():
        for kv in ("auto", "fp8"):
            assert probe["dense"][f"{name}/{kv}"] == cls, (name, kv, probe["dense"])


def test_sparse_layers_keep_their_backend_and_the_platform_fp8(probe):
    fp8 = FP8[probe["arch"]]
    for name in BACKENDS:
        for kv in ("auto", "fp8"):
            got = probe["sparse"][f"{name}/{kv}"]
            assert got["backend"] == "MINIMAX_M3_MSA", got
            assert got["kv_cache"] == (fp8 if kv == "fp8" else "torch.bfloat16"), got
            assert got["index_cache"] == fp8, got  # msa_index_cache_dtype fp8


def test_aiter_moe_and_shared_expert_paths(probe):
    for layout, experts in (("separate", 4), ("fused", 5)):
        moe = probe["moe"][layout]
        assert moe["aiter_fused_moe"] and moe["moe_backend"] == "UnquantizedMoeBackend.AITER"
        # the env switch is on, but v0.23.0 fuses only n_shared_experts (none here)
        assert moe["aiter_shared_expert_fusion"] and moe["num_fused_shared_experts"] == 0
        assert moe["global_num_experts"] == experts  # fuse_shared_expert: one more
        assert moe["separate_shared_expert"] == (layout == "separate")
        assert moe["router"] == "CustomRoutingRouter"


def test_aiter_only_from_vllm_rocm_attention(probe):
    mods = set(probe["aiter_modules"])
    assert "aiter.ops.triton.unified_attention" in mods  # ROCM_AITER_UNIFIED_ATTN's Impl


def test_model_package_never_imports_aiter():
    """On CPU, with an aiter that looks installed but fails to import:
    importing the whole model package (model, layers, backend, Triton ops,
    parsers) never imports it."""
    code = r"""
import importlib.machinery, pkgutil, sys
tried = []
class Poisoned:  # aiter looks installed (vLLM probes it with find_spec); importing it fails
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "aiter":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        tried.append(module.__name__)
        raise ImportError(f"aiter imported: {module.__name__}")
sys.meta_path.insert(0, Poisoned())
import vllm.models.minimax_m3 as pkg
for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    importlib.import_module(m.name)
for name in ("vllm.reasoning.minimax_m3_series_reasoning_parser",
             "vllm.tool_parsers.minimax_m3_series_tool_parser",
             "vllm.transformers_utils.configs.minimax_m3"):
    importlib.import_module(name)
print("TRIED", tried, sorted(m for m in sys.modules if m.startswith("vllm.models.minimax_m3")))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("TRIED ")][-1]
    assert line.startswith("TRIED [] "), line
    assert "vllm.models.minimax_m3.common.model" in line  # the walk did import the package
