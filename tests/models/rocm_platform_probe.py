# SPDX-License-Identifier: Apache-2.0
"""Build MiniMax-M3's layers with vLLM's current platform set to ROCm, on a
CPU machine (run by ``test_minimax_m3_rocm_platform.py`` in a fresh process;
prints one JSON object).

  python rocm_platform_probe.py gfx942|gfx950

The stand-in: vLLM's ``RocmPlatform`` as ``current_platform``, the GPU's
properties (gcnArchName) answered for the arch, and the CPU build's native
extension modules (``vllm._C``: x86 code this CPU may not run) left out --
the layers built here never call them.  Then, with a world of one (gloo):

* a dense layer (``MiniMaxM3Attention(sparse=False)``, vLLM's ``Attention``)
  under ``--attention-backend`` NAME for each of vLLM's ROCm backends, with
  FP8 KV and without: the backend it gets;
* a sparse layer under the same settings: its own backend, its K/V and
  index-key cache dtypes (the platform's FP8: e4m3fnuz on gfx942);
* the MoE block with ``VLLM_ROCM_USE_AITER=1`` and
  ``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1`` (aiter reported present:
  ``is_aiter_found_and_supported``), and with ``fuse_shared_expert``: what
  FusedMoE takes (aiter fused MoE, aiter shared-expert fusion, fused shared
  experts, the unquantized MoE backend);
* which modules named ``aiter*`` got imported (an ``aiter`` stub stands in:
  vLLM's ROCm attention Impls import their kernels from it when built).
"""

import importlib.machinery
import json
import os
import sys
import types

ARCH = sys.argv[1]
CUS = {"gfx942": 304, "gfx950": 256}[ARCH]
for _name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._rocm_C"):
    sys.modules.setdefault(_name, types.ModuleType(_name))



class _AiterStub:
    """``aiter`` as the MI3xx image has it, in name only: any ``aiter.*``
    module imports (attributes are placeholders); vLLM's ROCm backends import
    their aiter kernels when their Impl is built, which shows here as the
    modules named ``aiter*`` in ``sys.modules``."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "aiter":
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda attr: (_ for _ in ()).throw(AttributeError(attr)) \
            if attr.startswith("__") else types.SimpleNamespace(name=f"{spec.name}.{attr}")
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _AiterStub())

import torch  # noqa: E402

_props = types.SimpleNamespace(gcnArchName=f"{ARCH}:sramecc+:xnack-", name="AMD Instinct",
                               major=9, minor=4 if ARCH == "gfx942" else 5,
                               multi_processor_count=CUS, total_memory=192 << 30)
torch.cuda.get_device_properties = lambda *a, **k: _props

import vllm.platforms as platforms  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.platforms.rocm import RocmPlatform  # noqa: E402

RocmPlatform.get_device_capability = classmethod(
    lambda cls, device_id=0: DeviceCapability(_props.major, _props.minor))
platforms._current_platform = RocmPlatform()

from vllm.config import (AttentionConfig, CacheConfig, VllmConfig,  # noqa: E402
                         set_current_vllm_config)
from vllm.distributed import (init_distributed_environment,  # noqa: E402
                              initialize_model_parallel)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from minimax_m3_utils import text_config  # noqa: E402

BACKENDS = ("ROCM_AITER_UNIFIED_ATTN", "ROCM_ATTN", "ROCM_AITER_FA", "TRITON_ATTN")


def _text_config(**over):
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3TextConfig
    # production heads per TP4 rank (16 query heads per KV head, head_dim 128)
    return MiniMaxM3TextConfig(**text_config(
        sparse_block=128, topk=16, num_attention_heads=16, num_key_value_heads=1,
        head_dim=128, index_n_heads=1, index_head_dim=128, hidden_size=256, rotary_dim=64,
        **over))


def main() -> int:
    torch.set_default_dtype(torch.bfloat16)
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{os.environ['PORT']}")
        initialize_model_parallel(1, 1)
    from vllm.models.minimax_m3.common import layers
    from vllm.models.minimax_m3.common.layers import MiniMaxM3Attention, MiniMaxM3MoE
    layers._top_config = lambda: None  # no model config here: the text config has it all

    out = {"arch": ARCH, "platform": type(platforms.current_platform).__name__,
           "fp8_dtype": str(platforms.current_platform.fp8_dtype()), "dense": {},
           "sparse": {}}
    cfg = _text_config(msa_index_cache_dtype="fp8")
    n = 0
    for backend in BACKENDS:
        for kv in ("auto", "fp8"):
            vc = VllmConfig(attention_config=AttentionConfig(backend=backend),
                            cache_config=CacheConfig(block_size=128, cache_dtype=kv))
            with set_current_vllm_config(vc):
                n += 1
                dense = MiniMaxM3Attention(cfg, 0, False, vc.cache_config, None,
                                           f"model.layers.{n}.self_attn")
                n += 1
                sparse = MiniMaxM3Attention(cfg, 3, True, vc.cache_config, None,
                                            f"model.layers.{n}.self_attn")
            out["dense"][f"{backend}/{kv}"] = dense.attn.attn_backend.__name__
            spec = sparse.attn.get_kv_cache_spec(vc)
            out["sparse"][f"{backend}/{kv}"] = dict(
                backend=sparse.attn.get_attn_backend().get_name(),
                kv_cache=str(spec.dtype),
                index_cache=str(sparse.attn.index_cache.dtype))

    from vllm._aiter_ops import rocm_aiter_ops
    import vllm._aiter_ops as aiter_ops
    aiter_ops.is_aiter_found_and_supported = lambda: True  # the MI3xx image has aiter
    os.environ.update(VLLM_ROCM_USE_AITER="1", VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS="1")
    rocm_aiter_ops.refresh_env_variables()
    out["moe"] = {}
    for fused in (False, True):
        vc = VllmConfig()
        with set_current_vllm_config(vc):
            moe = MiniMaxM3MoE(_text_config(fuse_shared_expert=fused), None,
                               f"model.layers.{10 + fused}.block_sparse_moe")
        ex = moe.experts
        out["moe"]["fused" if fused else "separate"] = dict(
            aiter_fused_moe=bool(ex.rocm_aiter_fmoe_enabled),
            aiter_shared_expert_fusion=bool(ex.aiter_fmoe_shared_expert_enabled),
            num_fused_shared_experts=int(ex.num_fused_shared_experts),
            global_num_experts=int(ex.global_num_experts),
            separate_shared_expert=moe.shared_experts is not None,
            moe_backend=str(getattr(ex.quant_method, "unquantized_backend", None)),
            router=type(getattr(ex, "router", None)).__name__)
    out["aiter_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "aiter")
    print("PROBE " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
