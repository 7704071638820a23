# SPDX-License-Identifier: Apache-2.0
"""The engine A/B's decode-step profile: kernel families and the report's tables
(pure Python; the profile itself runs on the GPU, its CPU smoke by hand)."""

import sys

import pytest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.engine_ab.report import write_report  # noqa: E402
from benchmarks.engine_ab.step_profile import ctx_out_path, family, parse_ctx_list  # noqa: E402


def test_kernel_families():
    assert family("_C::cpu_attn_reshape_and_cache") == "KV cache write"
    assert family("_index_score_decode_kernel") == "MSA index / top-k"
    assert family("sparse_attn_block_major_kernel") == "MSA sparse attention"
    assert family("flash_fwd_splitkv_kernel") == "dense attention"
    assert family("fused_moe_kernel") == "MoE"
    assert family("nvjet_tst_128x64") == "GEMM"
    assert family("vllm::rms_norm_kernel") == "norm / RoPE / activation"
    assert family("void at::native::elementwise_kernel") == "other"
    # names seen in the 2026-12-07 H100 prefill profile
    assert family("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>") \
        == "norm / RoPE / activation"
    assert family("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_"
                  "warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel") == "GEMM"
    assert family("void vllm::moe::moe_align_block_size_kernel<int>") == "MoE"
    assert family("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::"
                  "FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90") == "dense attention"


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
    assert "One 32768-token prompt on H100: step 900.0 ms" in text and "(the whole prefill, profiled)" in text
    assert "Without the profiler" not in text   # no repeats recorded: nothing claimed


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


def test_device_time_counts_each_kernel_once():
    """The profiler gives a launching operator (``aten::mm``) the device time of the
    kernel it launched as well; only the device-side event may count (the 2026-12-07
    prefill profile summed both: 598 ms of kernels in a 375 ms step)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks.engine_ab.step_profile import _kernel_times

    def evt(key, device_type, device_us, cpu_us=0.0):
        return SimpleNamespace(key=key, device_type=device_type,
                               self_device_time_total=device_us, self_cpu_time_total=cpu_us)

    events = [evt("aten::mm", DeviceType.CPU, 70.0, cpu_us=5.0),
              evt("nvjet_sm90_tst_192x192", DeviceType.CUDA, 70.0),
              evt("vllm::moe_forward_shared", DeviceType.CPU, 120.0, cpu_us=9.0),
              evt("fused_moe_kernel", DeviceType.CUDA, 120.0)]
    prof = SimpleNamespace(key_averages=lambda: events)
    assert _kernel_times(prof, cuda=True) == {"nvjet_sm90_tst_192x192": 70.0,
                                              "fused_moe_kernel": 120.0}
    assert _kernel_times(prof, cuda=False) == {"aten::mm": 5.0, "vllm::moe_forward_shared": 9.0}


def test_prefill_lengths_parse_and_name_one_file_each():
    assert parse_ctx_list("", 32768) == [32768]
    assert parse_ctx_list("1023,1024,1023", 32768) == [1023, 1024]
    for bad in ("1k", "0", ","):
        with pytest.raises(SystemExit, match="--ctx"):
            parse_ctx_list(bad, 32768)
    assert ctx_out_path("d/profile-B-prefill.json", 1024, True) == "d/profile-B-prefill-ctx1024.json"
    assert ctx_out_path("d/p.json", 1024, False) == "d/p.json"


def test_report_compares_unprofiled_prefill_walls_per_length(tmp_path):
    def prof(ctx, wall):
        return {"phase": "prefill", "batch": 1, "ctx": ctx, "steps": 1, "device": "H100",
                "step_ms": wall * 1.2, "kernel_ms_per_step": wall, "host_ms_per_step": 0.2 * wall,
                "families_us_per_step": {}, "kernels_us_per_step": {},
                "wall_median_ms": wall, "wall_ms_samples": [wall] * 10,
                "first_wall_ms": 3 * wall}
    meta = {"date": "2026-12-07", "layers": 4, "smoke": False, "sides": {
        "A": {"msa": "upstream", "rc": "not run", "rows": {},
              "profiles": {"prefill@1023": prof(1023, 30.0), "prefill@1024": prof(1024, 30.0)}},
        "B": {"msa": "series", "rc": "not run", "rows": {},
              "profiles": {"prefill@1023": prof(1023, 25.0), "prefill@1024": {"rc": "timeout"}}}}}
    out = tmp_path / "r.md"
    write_report(meta, str(out))
    text = out.read_text()
    assert "| prefill@1023 | 30.0 | 25.0 | 1.20x | 3.00 | 3.00 |" in text
    assert "| prefill@1024 | 30.0 | - | n/a | 3.00 | - |" in text
    assert "median 25.0 ms over 10 fresh prompts" in text
