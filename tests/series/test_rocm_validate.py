"""ci/rocm_validate.sh (the MI3xx job) in its DRY_RUN mode: the seeds' exact commands."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_prints_the_seeds_commands(tmp_path):
    env = dict(os.environ, DRY_RUN="1", OUT=str(tmp_path / "out"))
    res = subprocess.run(["bash", str(REPO / "ci/rocm_validate.sh"), "all"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    runs = [ln for ln in res.stdout.splitlines() if ln.startswith("DRY_RUN: ")]
    gsm = [ln for ln in runs if "ci/accuracy_gsm8k.sh" in ln]
    serves = [ln for ln in runs if " serve EmbeddedLLM/MiniMax-M3-FP8-dynamic " in ln]
    # seed 000: MXFP8 / MXFP4 x FP8 KV / KV16; seed 002: GSM8K per fold
    assert len(gsm) == 6 and len(serves) == 2, runs
    seed000 = [ln for ln in gsm if "MiniMax-M3-MX" in ln]
    assert sum("--kv-cache-dtype fp8" in ln for ln in seed000) == 2
    for ln in seed000:
        for flag in ("--tensor-parallel-size 4", "--max-model-len 32768", "--block-size 128",
                     "--max-num-batched-tokens 32768", "--language-model-only",
                     "FULL_AND_PIECEWISE", "--no-enable-prefix-caching"):
            assert flag in ln, (flag, ln)
    assert sum("online_quant_config" in ln for ln in seed000) == 2  # the MXFP8 runs
    for fold in (0, 1):
        lines = [ln for ln in serves + gsm if f"VLLM_MINIMAX_M3_FOLD_KV_SCALE={fold}" in ln]
        assert len(lines) == 2, (fold, lines)
        for ln in lines:
            for flag in ("VLLM_ROCM_USE_AITER=1", "VLLM_ROCM_USE_AITER_MOE=0",
                         "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1",
                         "--attention-backend ROCM_AITER_UNIFIED_ATTN", "--kv-cache-dtype fp8",
                         "--max-model-len 262144", "--max-num-seqs 32", "--block-size 128"):
                assert flag in ln, (flag, ln)
    assert (tmp_path / "out" / "summary.md").exists()
    assert subprocess.run(["bash", str(REPO / "ci/rocm_validate.sh"), "nope"], env=env,
                          capture_output=True).returncode == 2
