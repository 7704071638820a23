#!/usr/bin/env bash
# GPU job: the quantized-checkpoint table of issue 49 (benchmarks/quant_checkpoints.py:
# a production-shaped few-layer MiniMax-M3 in MXFP8, FP8-dynamic and BF16, one engine per
# format: prefill and decode tokens/s, weight memory per layer), in one call, on the GPU
# machine after
#   bash .gpu/recv.sh install && . /tmp/gpu-env.sh
# with the v0.23.0 flavor's CUDA wheel packed with ci/gpu_extra_wheels.sh's folder
# (compressed-tensors needs loguru, vLLM's quantization registry humming).
# Writes $OUT/quant/{quant_checkpoints.json,quant_checkpoints.md,env.md}; the result files
# are rewritten after each format, so a run stopped at BUDGET_S keeps the formats it finished.
# Knobs: FORMATS (mxfp8,fp8_dynamic,bf16), QUANT_ARGS (passed on), BUDGET_S (560),
# WORKDIR (/tmp/qwork: about 30 GB of checkpoints, outside $OUT).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/quant"
. "$(dirname "$0")/gpu_lib.sh"
install_wheels_once "${E2E_WHEELS:-/tmp/gpu-extra/e2e-wheels}" /tmp/site "$OUT/quant/extra_wheels.log" \
  || echo "extra wheels: pip failed, see extra_wheels.log"
gpu_env_lines | tee "$OUT/quant/env.md"
# shellcheck disable=SC2086
timeout -k 10 "${BUDGET_S:-560}" python3 benchmarks/quant_checkpoints.py --out "$OUT/quant" \
  --workdir "${WORKDIR:-/tmp/qwork}" --formats "${FORMATS:-mxfp8,fp8_dynamic,bf16}" \
  ${QUANT_ARGS:---decode-batches 1,8,32 --decode-tokens 64 --repeats 2 --timeout 150}
rc=$?
[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "stopped at BUDGET_S=${BUDGET_S:-560} s: $OUT/quant keeps the formats that finished"
exit $rc
