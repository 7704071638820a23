#!/usr/bin/env bash
# The seed's GSM8K matrix on the real quantized checkpoints, one ci/accuracy_gsm8k.sh run each:
# MiniMax-M3-MXFP8 and MiniMax-M3-MXFP4, each with the FP8 KV cache (the seed's flags) and without.
#
#   ci/accuracy_gsm8k_seed.sh MODELS_DIR [extra vllm serve args...]
#
# MODELS_DIR holds the downloaded checkpoints as MODELS_DIR/MiniMax-M3-MXFP8 and
# MODELS_DIR/MiniMax-M3-MXFP4 (a missing one is reported and skipped). Reports go to
# $OUT_ROOT/<checkpoint>-kv-<fp8|auto>/accuracy.md (OUT_ROOT=out/accuracy-seed); a summary of the
# exit codes to $OUT_ROOT/summary.md. Every knob of ci/accuracy_gsm8k.sh (TP, PORT, LM_EVAL, VLLM,
# LIMIT, ...) passes through. CHECKPOINTS and KV_DTYPES (space separated) narrow the matrix.
# The MXFP4 (Quark) checkpoint runs emulated on NVIDIA GPUs and needs `pip install amd-quark` in
# vLLM's environment (the model refuses to start without it), or VLLM_MINIMAX_M3_MXFP4=bf16 (the
# v0.23.0 flavor's weights-only path, any platform); the mode is written into each report's note.
# See docs/checkpoints.md.
set -uo pipefail
if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
MODELS_DIR=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
OUT_ROOT=${OUT_ROOT:-out/accuracy-seed}
CHECKPOINTS=${CHECKPOINTS:-"MiniMax-M3-MXFP8 MiniMax-M3-MXFP4"}
KV_DTYPES=${KV_DTYPES:-"fp8 auto"}
mkdir -p "$OUT_ROOT"
SUMMARY=$OUT_ROOT/summary.md
printf '# GSM8K seed matrix\n\n| checkpoint | kv cache | exit code | report |\n|---|---|---|---|\n' > "$SUMMARY"
RC=0
for ckpt in $CHECKPOINTS; do
  for kv in $KV_DTYPES; do
    out=$OUT_ROOT/$ckpt-kv-$kv
    if [ ! -f "$MODELS_DIR/$ckpt/config.json" ]; then
      echo "skipping $ckpt: no $MODELS_DIR/$ckpt/config.json" >&2
      echo "| $ckpt | $kv | not found | |" >> "$SUMMARY"; RC=1; continue
    fi
    note="Seed matrix: $ckpt, --kv-cache-dtype $kv."
    case $ckpt in *MXFP4*) note="$note VLLM_MINIMAX_M3_MXFP4=${VLLM_MINIMAX_M3_MXFP4:-emulate}.";; esac
    OUT=$out KV_CACHE_DTYPE=$kv NOTE="$note" \
      "$HERE/accuracy_gsm8k.sh" "$MODELS_DIR/$ckpt" "$@"
    rc=$?
    [ "$rc" = 0 ] || RC=1
    echo "| $ckpt | $kv | $rc | $out/accuracy.md |" >> "$SUMMARY"
  done
done
cat "$SUMMARY"
exit "$RC"
