# SPDX-License-Identifier: Apache-2.0
"""ROCm readiness without an AMD GPU: every MSA Triton kernel variant the
dispatcher picks on an MI300X / MI325X (gfx942) or MI355X (gfx950) compiles
for that target within its LDS limit (``rocm_compile.py``, in a process
without TRITON_INTERPRET, the launches recorded from the dispatcher on a
stand-in GPU); the sm_90-only Gluon kernels and PDL are never picked there,
while the same recording on an H200 stand-in does pick them."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).parent
GLUON = {"sparse_attn_block_major_sm90_kernel", "index_block_max_prefill_sm90_kernel"}
# every Triton kernel of the MSA ops that a ROCm engine launches at production
# shapes with its default and documented settings (block_topk_bitonic_kernel
# serves only the sm_90 prefill index's select)
ROCM_KERNELS = {
    "sparse_cache_write_kernel", "index_block_max_decode_kernel", "block_topk_select_kernel",
    "index_topk_prefill_kernel", "sparse_attn_fwd_kernel", "sparse_attn_merge_kernel",
    "sparse_attn_tiled_kernel", "sparse_attn_block_major_kernel", "block_major_rank_kernel",
    "block_major_scatter_kernel", "score_attend_block_kernel", "score_attend_merge_kernel"}
LDS = {"gfx942": 64 << 10, "gfx950": 160 << 10}
FP8 = {"gfx942": "*fp8e4b8", "gfx950": "*fp8e4nv", "sm_90": "*fp8e4nv"}


def _amd_backend_missing() -> str | None:
    spec = importlib.util.find_spec("triton")
    amd = pathlib.Path(spec.origin).parent / "backends" / "amd"
    if not (amd / "compiler.py").exists():
        return f"this triton wheel has no AMD backend ({amd})"
    return None


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Record on gfx942, gfx950 and an H200 stand-in; compile the two AMD
    targets' variants.  Prints the per-variant report (pytest -s) and the
    wall time."""
    why = _amd_backend_missing()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("rocm") / "rocm.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(HERE / "rocm_compile.py"),
                          "--arch", "gfx942,gfx950,sm_90", "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=1800)
    print(res.stdout)
    print(f"rocm_compile.py: {time.monotonic() - t0:.0f} s wall")
    return res, (json.loads(out.read_text()) if out.exists() else {})


def _name(rec):
    return rec["kernel"].split(":")[1]


def _value(rec, name):
    return rec["variant"].get(name)


def test_rocm_variants_compile_within_lds(recorded):
    res, data = recorded
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    for arch, limit in LDS.items():
        variants = data[arch]
        assert {_name(r) for r in variants} == ROCM_KERNELS, arch
        for rec in variants:
            assert "error" not in rec, (arch, rec.get("error"))
            usage = rec["usage"]
            assert 0 <= usage["lds"] <= limit, (arch, _name(rec), rec["variant"], usage)
        # the report: spills are counted, not failed (the per-variant lines above)
        assert f"ok {len(variants)} variants {arch}" in res.stdout


def test_rocm_variants_cover_the_dispatch_space(recorded):
    """Every KV scale mode (3: unfolded scalar scales), decode and prefill
    paths, both index-key dtypes and the platform's FP8 dtype."""
    res, data = recorded
    assert data, res.stdout[-3000:] + res.stderr[-3000:]
    for arch in LDS:
        variants = data[arch]
        modes = {_value(r, "SCALE_MODE") for r in variants if _name(r) == "sparse_attn_fwd_kernel"}
        assert modes == {0, 1, 2, 3}, (arch, modes)
        for kernel in ("sparse_attn_block_major_kernel", "sparse_attn_tiled_kernel",
                       "score_attend_block_kernel"):
            modes = {_value(r, "SCALE_MODE") for r in variants if _name(r) == kernel}
            assert {0, 1, 2} <= modes, (arch, kernel, modes)
        for kernel in ("index_topk_prefill_kernel", "index_block_max_decode_kernel"):
            scaled = {_value(r, "K_SCALED") for r in variants if _name(r) == kernel}
            assert scaled == {False, True}, (arch, kernel, scaled)
        # the decode chain's split merge and the block-major merge; one launch decode
        assert any(_value(r, "FUSED_MERGE") for r in variants
                   if _name(r) == "sparse_attn_fwd_kernel"), arch
        assert any(_value(r, "FUSED_SELECT") for r in variants
                   if _name(r) == "index_block_max_decode_kernel"), arch
        kv_types = {r["signature"]["kv_ptr"] for r in variants
                    if _name(r) == "sparse_attn_fwd_kernel"}
        assert kv_types == {"*bf16", FP8[arch]}, (arch, kv_types)
        # ROCm's own token tiles: at most 4 tokens per program, one stage
        tiles = [r for r in variants if _name(r) == "sparse_attn_tiled_kernel"]
        assert tiles and all(_value(r, "TM") <= 4 and r["options"]["num_stages"] == 1
                             for r in tiles), [(r["variant"], r["options"]) for r in tiles]


def test_gluon_and_pdl_never_dispatched_on_rocm(recorded):
    res, data = recorded
    assert data, res.stdout[-3000:] + res.stderr[-3000:]
    for arch in LDS:
        assert not [r for r in data[arch] if r["gluon"] or _name(r) in GLUON], arch
        assert not [r for r in data[arch] if _value(r, "PDL")], arch
        assert not [r for r in data[arch] if "launch_pdl" in r["options"]], arch
    # the same recording on an H200 stand-in takes both Gluon kernels and PDL:
    # the recording can see them
    h200 = data["sm_90"]
    assert GLUON <= {_name(r) for r in h200 if r["gluon"]}
    assert any(_value(r, "PDL") and r["options"].get("launch_pdl") for r in h200)
