#!/usr/bin/env bash
# One-command validation on an AMD Instinct MI3xx machine (4 x MI300X / MI325X / MI355X, ROCm,
# this series installed: `make image BASE=<a rocm/vllm image>` or the wheel), with the seeds'
# exact commands:
#
#   ci/rocm_validate.sh [all|gsm8k|ab]        (default all)
#
#   gsm8k  seed 000: GSM8K (lm-eval, ci/accuracy_gsm8k.sh: gsm8k 8-shot, the whole test split,
#          strict-match and flexible-extract) of MiniMax-M3-MXFP8 and -MXFP4, each with FP8 KV
#          (--kv-cache-dtype fp8) and without (KV16), with seed 000's serve flags; 4 runs.
#   ab     seed 002: its serve command and environment (VLLM_ROCM_USE_AITER=1,
#          VLLM_ROCM_USE_AITER_MOE=0, VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1,
#          --attention-backend ROCM_AITER_UNIFIED_ATTN, FP8 KV) with
#          VLLM_MINIMAX_M3_FOLD_KV_SCALE=0 (baseline: scales applied per element) and =1 (this
#          series' default: folded); per fold `vllm bench serve` (random dataset, ISL/OSL 8k/1k
#          and 128k/1k, concurrency 4 and 8: output tok/s, median TTFT) and GSM8K 8-shot.
#
# Results: $OUT (default benchmarks/results/rocm/<UTC date>-rocm-validate-<gfx arch>): one directory per run
# (accuracy.md, lm-eval JSON and samples, server logs, bench JSON) and summary.md, the dated
# tables (machine, vLLM version, series hash, exact commands), as the H200 jobs leave them.
#
# Knobs: MXFP8_MODEL, MXFP4_MODEL (seed 000's checkpoints; default the seed's paths),
#   AB_MODEL (default EmbeddedLLM/MiniMax-M3-FP8-dynamic), LM_EVAL (lm-eval client, e.g. in its
#   own venv: requirements/accuracy.txt), VLLM=vllm, PORT=8001, LIMIT= (GSM8K examples; empty =
#   all 1319), AB_ISL="8192 131072", AB_OSL=1024, AB_CONC="4 8", AB_PROMPTS_PER_CONC=2,
#   STARTUP_TIMEOUT=3600, DRY_RUN=1 (print the commands, run nothing; works anywhere).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in all|gsm8k|ab) ;; -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  *) echo "unknown job '$what' (all | gsm8k | ab)" >&2; exit 2 ;; esac

DRY_RUN=${DRY_RUN:-0}
VLLM=${VLLM:-vllm}
PYTHON=${PYTHON:-python3}
PORT=${PORT:-8001}
URL="http://127.0.0.1:$PORT"
MXFP8_MODEL=${MXFP8_MODEL:-/shared/data/amd_int/models/MiniMax-M3-MXFP8}
MXFP4_MODEL=${MXFP4_MODEL:-/shared/data/amd_int/models/MiniMax-M3-MXFP4}
AB_MODEL=${AB_MODEL:-EmbeddedLLM/MiniMax-M3-FP8-dynamic}
AB_ISL=${AB_ISL:-8192 131072}
AB_OSL=${AB_OSL:-1024}
export AB_OSL
AB_CONC=${AB_CONC:-4 8}
AB_PROMPTS_PER_CONC=${AB_PROMPTS_PER_CONC:-2}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-3600}
export STARTUP_TIMEOUT PORT VLLM

arch() {  # gfx942 / gfx950 of GPU 0 ("unknown" without rocminfo)
  rocminfo 2>/dev/null | sed -n 's/^ *Name: *\(gfx[0-9a-f]*\).*/\1/p' | head -1 | grep . || echo unknown
}
ARCH=$( [ "$DRY_RUN" = 1 ] && echo dry-run || arch )
OUT=${OUT:-benchmarks/results/rocm/$(date -u +%Y-%m-%d)-rocm-validate-$ARCH}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.md
log() { echo "[rocm-validate $(date -u +%H:%M:%S)] $*"; }
quote() { "$PYTHON" -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "$@"; }
run() {  # run (or, with DRY_RUN=1, print) a command
  if [ "$DRY_RUN" = 1 ]; then echo "DRY_RUN: $(quote "$@")"; return 0; fi
  "$@"
}

# seed 000's serve flags (both checkpoints; the MXFP8 run adds its own two, below)
SEED000_FLAGS=(--dtype auto --load-format auto --tensor-parallel-size 4
  --gpu-memory-utilization 0.85 --max-model-len 32768 --max-num-batched-tokens 32768
  --block-size 128 --no-enable-prefix-caching --language-model-only --no-trust-remote-code
  --compilation-config '{"cudagraph_mode": "FULL_AND_PIECEWISE"}')
SEED000_MXFP8_EXTRA=(--no-async-scheduling
  --additional-config '{"online_quant_config": {"global_quant_config": "ptpc_fp8", "exclude_layer": ["lm_head", "model.embed_tokens", "vision_tower", "multi_modal_projector", "patch_merge_mlp", "*block_sparse_moe"]}}')
# seed 002's serve flags and environment
SEED002_FLAGS=(--served-model-name minimax-m3 --tensor-parallel-size 4 --block-size 128
  --max-model-len 262144 --gpu-memory-utilization 0.92 --enable-chunked-prefill
  --max-num-batched-tokens 32768 --max-num-seqs 32 --no-enable-prefix-caching
  --async-scheduling --tool-call-parser minimax_m3 --enable-auto-tool-choice
  --reasoning-parser minimax_m3 --kv-cache-dtype fp8 --language-model-only
  --attention-backend ROCM_AITER_UNIFIED_ATTN)
SEED002_ENV=(HIP_VISIBLE_DEVICES=0,1,2,3 VLLM_ROCM_USE_AITER=1 VLLM_USE_BREAKABLE_CUDAGRAPH=0
  VLLM_ROCM_USE_AITER_MOE=0 VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1)

{
  echo "# ROCm validation $(date -u +%Y-%m-%dT%H:%M:%SZ) ($what)"
  echo
  echo "- machine: $( (rocm-smi --showproductname 2>/dev/null | grep -m1 -i 'card series' | sed 's/.*: *//') || true) $ARCH"
  echo "- vLLM: $("$PYTHON" -c 'import vllm; print(vllm.__version__)' 2>/dev/null || echo '?')"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
} > "$SUMMARY"
rc=0

gsm8k() {  # NAME MODEL FLAGS... : one ci/accuracy_gsm8k.sh run into $OUT/NAME, with the
           # environment in GSM8K_ENV (NAME=VALUE words) added
  local name=$1 model=$2 status=0; shift 2
  local cmd=(env "${GSM8K_ENV[@]}" SERVE_FLAGS="$(quote "$@")" OUT="$OUT/$name"
             NOTE="${NOTE:-}" bash ci/accuracy_gsm8k.sh "$model")
  log "gsm8k $name"
  run "${cmd[@]}" || status=1
  if [ -f "$OUT/$name/accuracy.md" ]; then
    { echo "## $name"; echo; sed -n '/^|/p' "$OUT/$name/accuracy.md"; echo; } >> "$SUMMARY"
  else
    echo "## $name: no report (see $OUT/$name)" >> "$SUMMARY"; echo >> "$SUMMARY"
    [ "$DRY_RUN" = 1 ] || status=1
  fi
  return $status
}
GSM8K_ENV=()

if [ "$what" = all ] || [ "$what" = gsm8k ]; then
  for model in mxfp8 mxfp4; do
    path=$MXFP8_MODEL extra=("${SEED000_MXFP8_EXTRA[@]}")
    [ "$model" = mxfp4 ] && path=$MXFP4_MODEL extra=()
    gsm8k "seed000-$model-kv8" "$path" "${SEED000_FLAGS[@]}" "${extra[@]}" \
      --kv-cache-dtype fp8 || rc=1
    gsm8k "seed000-$model-kv16" "$path" "${SEED000_FLAGS[@]}" "${extra[@]}" || rc=1
  done
fi

serve_bg() {  # LOG ENV... -- ARGS... : the server in its own process group; sets SERVER_PID
  local logf=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  if [ "$DRY_RUN" = 1 ]; then
    echo "DRY_RUN: $(quote env "${envs[@]}" "$VLLM" serve "$@")"; SERVER_PID=; return 0
  fi
  env "${envs[@]}" setsid "$VLLM" serve "$@" > "$logf" 2>&1 &
  SERVER_PID=$!
  local t=0
  until curl -sf -o /dev/null --max-time 5 "$URL/health"; do
    kill -0 "$SERVER_PID" 2>/dev/null || { log "server exited; see $logf"; SERVER_PID=; return 1; }
    [ "$t" -ge "$STARTUP_TIMEOUT" ] && { log "no /health after ${t}s"; stop_bg; return 1; }
    sleep 10; t=$((t + 10))
  done
}
stop_bg() {
  [ -n "${SERVER_PID:-}" ] || return 0
  kill -INT -- "-$SERVER_PID" 2>/dev/null
  for _ in $(seq 120); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
}
trap stop_bg EXIT INT TERM

if [ "$what" = all ] || [ "$what" = ab ]; then
  for fold in 0 1; do
    dir=$OUT/seed002-fold$fold; mkdir -p "$dir/bench"
    log "seed 002 A/B: VLLM_MINIMAX_M3_FOLD_KV_SCALE=$fold"
    if serve_bg "$dir/server.log" "${SEED002_ENV[@]}" VLLM_MINIMAX_M3_FOLD_KV_SCALE=$fold -- \
        "$AB_MODEL" --host 127.0.0.1 --port "$PORT" "${SEED002_FLAGS[@]}"; then
      for isl in $AB_ISL; do for conc in $AB_CONC; do
        n=$((conc * AB_PROMPTS_PER_CONC))
        bench=("$VLLM" bench serve --backend vllm --host 127.0.0.1 --port "$PORT"
          --model minimax-m3 --tokenizer "$AB_MODEL" --dataset-name random
          --random-input-len "$isl" --random-output-len "$AB_OSL" --max-concurrency "$conc"
          --ignore-eos --temperature 0 --disable-tqdm)
        # an unrecorded warm-up at the same shape first (Triton JIT, first-call costs)
        run "${bench[@]}" --num-prompts "$conc" --seed 1 >> "$dir/bench.log" 2>&1
        run "${bench[@]}" --num-prompts "$n" --seed 0 --save-result --result-dir "$dir/bench" \
          --result-filename "isl${isl}-c${conc}.json" >> "$dir/bench.log" 2>&1 || rc=1
      done; done
    else
      rc=1
    fi
    stop_bg
    # GSM8K with the same command (accuracy_gsm8k.sh starts its own server)
    GSM8K_ENV=("${SEED002_ENV[@]}" VLLM_MINIMAX_M3_FOLD_KV_SCALE=$fold)
    NOTE="seed 002, VLLM_MINIMAX_M3_FOLD_KV_SCALE=$fold" \
      gsm8k "seed002-fold$fold-gsm8k" "$AB_MODEL" "${SEED002_FLAGS[@]}" || rc=1
    GSM8K_ENV=()
  done
  [ "$DRY_RUN" = 1 ] || "$PYTHON" - "$OUT" >> "$SUMMARY" <<'PY' || rc=1
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for fold in (0, 1):
    for f in sorted(glob.glob(os.path.join(out, f"seed002-fold{fold}", "bench", "*.json"))):
        r = json.load(open(f))
        key = (r.get("random_input_len") or os.path.basename(f), r.get("max_concurrency"))
        rows.setdefault(key, {})[fold] = r
print("## seed 002 A/B (VLLM_MINIMAX_M3_FOLD_KV_SCALE 0 = baseline, 1 = fold)\n")
print("| ISL/OSL | concurrency | metric | fold 0 | fold 1 | change |")
print("|---|---|---|---|---|---|")
for (isl, conc), r in sorted(rows.items(), key=lambda kv: str(kv[0])):
    for key, label in (("output_throughput", "output tok/s"), ("median_ttft_ms", "TTFT median (ms)")):
        a, b = (r.get(f, {}).get(key) for f in (0, 1))
        change = f"{100 * (b - a) / a:+.1f}%" if a and b else "-"
        fmt = lambda x: "-" if x is None else f"{x:.2f}"
        print(f"| {isl}/{os.environ.get('AB_OSL', '1024')} | {conc} | {label} | {fmt(a)} | {fmt(b)} | {change} |")
print()
PY
fi
log "results in $OUT (summary.md), exit $rc"
exit $rc
