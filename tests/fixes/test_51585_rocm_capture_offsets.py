"""Regression test for the series entry porting vllm-project/vllm#51585.

RocmAttentionMetadataBuilder.build_for_cudagraph_capture must zero only the
device copy of the query offsets; the CPU copy is shared with the metadata
builders of the model's other attention layers. The test runs the method of
the installed (patched) vLLM and, to show that it detects the bug, the same
method from the pristine base commit of the applied tree (build/vllm), which
must zero the CPU copy. Runs on CPU: the method only touches tensors.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _installed_flavor_tree() -> Path:
    """The applied tree of the flavor whose CPU build is installed (build/vllm for the
    default flavor, build/vllm-<flavor> for the others). Reads the installed version
    from its metadata: importing vllm at collection time would import triton before
    tests/kernels/conftest.py can set TRITON_INTERPRET."""
    import importlib.metadata
    sys.path.insert(0, str(REPO))
    from m3series.series import default_flavor
    flavor = "v" + importlib.metadata.version("vllm").split("+")[0]
    return REPO / "build" / ("vllm" if flavor == default_flavor(REPO) else f"vllm-{flavor}")
PATH = "vllm/v1/attention/backends/rocm_attn.py"


def _builder_class(variant: str):
    if variant == "entry":
        from vllm.v1.attention.backends import rocm_attn
        return rocm_attn.RocmAttentionMetadataBuilder
    tree = _installed_flavor_tree()
    stamp = tree / ".git" / "m3-series.json"
    if not stamp.exists():
        pytest.fail(f"{tree} is missing: run `make apply` (make test does) before this test")
    base = json.loads(stamp.read_text())["base"]
    source = subprocess.run(["git", "-C", str(tree), "show", f"{base}:{PATH}"],
                            capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("rocm_attn_pristine_base", loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    exec(compile(source, f"base:{PATH}", "exec"), mod.__dict__)
    return mod.RocmAttentionMetadataBuilder


@pytest.mark.parametrize("variant", ["entry", "base"])
def test_capture_keeps_cpu_query_offsets(variant):
    cls = _builder_class(variant)
    builder = SimpleNamespace(build=lambda prefix_len, cam: SimpleNamespace(
        seq_lens=torch.full((4,), 7, dtype=torch.int32)))
    offsets = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    cam = SimpleNamespace(query_start_loc=offsets.clone(), query_start_loc_cpu=offsets.clone())
    meta = cls.build_for_cudagraph_capture(builder, cam)
    assert torch.all(meta.seq_lens == 1)
    assert torch.all(cam.query_start_loc == 0)            # the device copy, for the kernel
    cpu_kept = torch.equal(cam.query_start_loc_cpu, offsets)
    if variant == "entry":
        assert cpu_kept, "the CPU offsets shared with other builders were zeroed"
    else:
        assert not cpu_kept, "v0.23.0 zeroes the CPU copy; this test must detect that"


def test_the_seeds_rocm_backends_build_with_the_fixed_builder():
    """The seeds' --attention-backend ROCM_AITER_UNIFIED_ATTN (and ROCM_ATTN)
    build their metadata with the builder this entry fixes; capturing it
    first, then MiniMax-M3's sparse builder (as a FULL_AND_PIECEWISE capture
    of a model with dense and sparse layers does) keeps the CPU offsets the
    other builders read, and the sparse capture its token layout."""
    from vllm.v1.attention.backends import rocm_attn
    from vllm.v1.attention.backends.rocm_aiter_unified_attn import (
        RocmAiterUnifiedAttentionBackend)

    for backend in (RocmAiterUnifiedAttentionBackend, rocm_attn.RocmAttentionBackend):
        assert backend.get_builder_cls() is rocm_attn.RocmAttentionMetadataBuilder, backend

    sys.path.insert(0, str(REPO / "tests" / "models"))
    from test_minimax_m3_sparse_metadata import _builder, _metadata

    cm = _metadata([1, 1, 1, 1], [7, 130, 1, 64])
    rocm_attn.RocmAttentionMetadataBuilder.build_for_cudagraph_capture(
        SimpleNamespace(build=lambda _, c: SimpleNamespace(seq_lens=c.seq_lens)), cm)
    assert torch.equal(cm.query_start_loc_cpu, torch.arange(5, dtype=torch.int32))
    md = _builder().build_for_cudagraph_capture(cm)
    assert md.token_req.tolist() == [0, 1, 2, 3] and md.token_pos.tolist() == [0, 0, 0, 0]
