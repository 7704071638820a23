# SPDX-License-Identifier: Apache-2.0
"""The engine A/B's decode-step profile: kernel families and the report's tables
(pure Python; the profile itself runs on the GPU, its CPU smoke by hand)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.engine_ab.report import write_report  # noqa: E402
from benchmarks.engine_ab.step_profile import family  # noqa: E402


def test_kernel_families():
    assert family("_C::cpu_attn_reshape_and_cache") == "KV cache write"
    assert family("_index_score_decode_kernel") == "MSA index / top-k"
    assert family("sparse_attn_block_major_kernel") == "MSA sparse attention"
    assert family("flash_fwd_splitkv_kernel") == "dense attention"
    assert family("fused_moe_kernel") == "MoE"
    assert family("nvjet_tst_128x64") == "GEMM"
    assert family("vllm::rms_norm_kernel") == "norm / RoPE / activation"
    assert family("void at::native::elementwise_kernel") == "other"


def test_report_shows_step_split_and_failed_profiles(tmp_path):
    prof = {"batch": 1, "ctx": 8192, "steps": 32, "device": "H200", "step_ms": 3.0,
            "kernel_ms_per_step": 2.5, "host_ms_per_step": 0.5,
            "families_us_per_step": {"MoE": 1500.0, "GEMM": 1000.0},
            "kernels_us_per_step": {"fused_moe_kernel": 1500.0},
            "layers_ms": {"0:MiniMaxM3DecoderLayer": 0.4}}
    meta = {"date": "2026-12-05", "layers": 4, "smoke": False, "sides": {
        "A": {"msa": "upstream", "rc": 0, "rows": {"decode_b1": 2.0},
              "profiles": {"graphs": {"rc": 1}}},
        "B": {"msa": "series", "rc": "not run", "rows": {}, "profiles": {"eager": prof}}}}
    out = tmp_path / "r.md"
    write_report(meta, str(out))
    text = out.read_text()
    assert "step 3.0 ms = kernels 2.5 ms + host 0.5 ms" in text
    assert "| MoE | 1500.0 |" in text and "| 0:MiniMaxM3DecoderLayer | 0.4 |" in text
    assert "## Decode step profile, side A, graphs" in text and "Not measured (rc=1" in text
    assert "Side B ended" not in text     # profile-only: rows not run is not a failure


def test_report_names_a_prefill_profile(tmp_path):
    prof = {"phase": "prefill", "batch": 1, "ctx": 32768, "steps": 1, "device": "H100",
            "step_ms": 900.0, "kernel_ms_per_step": 850.0, "host_ms_per_step": 50.0,
            "families_us_per_step": {"MSA sparse attention": 4e5},
            "kernels_us_per_step": {"sparse_attn_block_major_kernel": 4e5}}
    meta = {"date": "2026-12-06", "layers": 4, "smoke": False, "sides": {
        "B": {"msa": "series", "rc": "not run", "rows": {}, "profiles": {"prefill": prof}}}}
    out = tmp_path / "r.md"
    write_report(meta, str(out))
    text = out.read_text()
    assert "## Prefill profile, side B, prefill" in text
    assert "One 32768-token prompt on H100: step 900.0 ms" in text and "(the whole prefill)" in text


def test_prefill_layer_times_sum_the_chunks_and_skip_decode_calls():
    """``_layer_ms(model, 0)``: per layer, the sum over the logged calls of more than one
    token (a prefill's chunks), without the one-token decode calls."""
    from types import SimpleNamespace

    from benchmarks.engine_ab.step_profile import _clear_layer_log, _layer_ms

    log = [[[8192, 0.0, 0.010], [8192, 1.0, 1.020], [1, 2.0, 2.5]],   # layer 0
           [[1, 0.0, 0.001]]]                                          # layer 1: decode only
    model = SimpleNamespace(_step_profile_log=log)
    assert _layer_ms(model, 0) == [30.0, None]
    assert _layer_ms(model, 1) == [500.0, 1.0]
    _clear_layer_log(model)
    assert model._step_profile_log == [[], []]
