#!/usr/bin/env bash
# One device call per phase on a two-GPU H200 machine (`nvidia-h200-x2`), after
# `bash .gpu/recv.sh install` (../shared/gpu/README): runs side by side what can,
# stops before the call's 600 s limit, and leaves ONE file, $OUT/results.tgz
# (the device tool returns at most 8 files).
#
#   bash ci/gpu_validate.sh tp      # TP2 and TP2 + expert parallelism vs TP1 (both GPUs)
#   bash ci/gpu_validate.sh suites  # graphs vs eager bf16, then the fused shared expert
#                                   # and bf16 parity with graphs on (GPU 0) beside the
#                                   # token-tile and kernel suites, then the kernel
#                                   # benchmark (GPU 1); SUITES_GPU0/1 override, LANE0_SUITE_S
#                                   # / LANE1_SUITE_S are seconds per suite, BENCH_ARGS
#                                   # (default --sweep) are the
#                                   # MSA benchmark's arguments (python -m benchmarks.msa)
#   bash ci/gpu_validate.sh e2e     # seed 002's A/B (`--sections bench_ab`, GPU 0)
#                                   # beside the throughput table without FP8 KV (GPU 1)
#   bash ci/gpu_validate.sh ab      # seed 002's A/B, fold on GPU 0 beside fold off on
#                                   # GPU 1, then bf16 graphs vs eager (GPU 0)
#   bash ci/gpu_validate.sh bench   # python -m benchmarks.msa --sweep on GPU 0
#
# Env: GIT_COMMIT (recorded), EXTRA_WHEELS (default /tmp/gpu-extra/e2e-wheels, from
# ci/gpu_extra_wheels.sh), BUDGET_S (default 560: wall limit of the phase).
set -uo pipefail
cd "$(dirname "$0")/.."
phase=${1:?usage: ci/gpu_validate.sh tp|suites|e2e|ab|bench}
OUT=${OUT:-out}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-560}
EXTRA_WHEELS=${EXTRA_WHEELS:-/tmp/gpu-extra/e2e-wheels}
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
T0=$(date +%s)
export DEADLINE_EPOCH=$(( T0 + BUDGET_S - 15 ))  # gpu_series_tests.sh never runs past it
left() {  # seconds left of the phase budget, at least 10
  local l=$(( BUDGET_S - ($(date +%s) - T0) )); echo $(( l > 10 ? l : 10 ))
}
case "$phase" in tp|suites|e2e|ab|bench) ;;
  *) echo "unknown phase '$phase' (tp | suites | e2e | ab | bench)"; exit 2 ;; esac
work="$OUT/$phase"; mkdir -p "$work"

if [ -d "$EXTRA_WHEELS" ]; then  # once, before anything runs side by side
  python -m pip install -q --no-index --no-deps --target "${EXTRA_SITE:-/tmp/site}" \
    "$EXTRA_WHEELS"/*.whl > "$work/extra_wheels.log" 2>&1 || echo "extra wheels: pip failed"
fi

case "$phase" in
  tp)  # a suite gets SIGINT at its budget, so pytest still reports
    OUT="$work" SUITE_TIMEOUT=$(( $(left) - 10 )) RUN_SUITES="tp2" bash ci/gpu_series_tests.sh
    ;;
  suites)  # GPU 0: bf16 graphs vs eager, then the fused shared expert and bf16 parity with
           # graphs; GPU 1: graphs == eager with token-tiled prefill attention and the
           # kernel tests at real shapes, then the kernel benchmark (+ sweep) with the time left (rows are printed
           # as they are measured, so a cut run still leaves what it measured)
    half=${LANE0_SUITE_S:-$(( $(left) / 2 - 5 ))}
    ( OUT="$work/gpu0" CUDA_VISIBLE_DEVICES=0 SUITE_TIMEOUT=$half \
        RUN_SUITES="${SUITES_GPU0:-graphs_bf16 fused_graphs}" bash ci/gpu_series_tests.sh \
        > "$work/gpu0.out" 2>&1 ) &
    ( OUT="$work/gpu1" CUDA_VISIBLE_DEVICES=1 SUITE_TIMEOUT=${LANE1_SUITE_S:-170} \
        RUN_SUITES="${SUITES_GPU1:-graphs_token_tile kernels}" bash ci/gpu_series_tests.sh \
        > "$work/gpu1.out" 2>&1
      OUT="$work/gpu1" CUDA_VISIBLE_DEVICES=1 timeout -s TERM "$(( $(left) > 30 ? $(left) - 10 : 5 ))" \
        python3 -m benchmarks.msa ${BENCH_ARGS---sweep} > "$work/gpu1/bench.out" 2>&1 ) &
    wait
    cat "$work/gpu0/gpu_tests.md" "$work/gpu1/gpu_tests.md" 2>/dev/null
    grep -c '^\[decode\]\|^\[prefill\]\|^\[sweep\]' "$work/gpu1/bench.out"
    ;;
  e2e)
    d=$(( $(left) > 70 ? $(left) - 40 : 30 ))
    CUDA_VISIBLE_DEVICES=0 timeout -s TERM $(( d + 30 )) python3 -m benchmarks.serving \
      --wheels "$EXTRA_WHEELS" --sections bench_ab --deadline "$d" --out "$work/ab" \
      > "$work/ab.out" 2>&1 &
    CUDA_VISIBLE_DEVICES=1 timeout -s TERM $(( d + 30 )) python3 -m benchmarks.serving \
      --wheels "$EXTRA_WHEELS" --sections throughput --tp-modes graphs:auto,eager:auto \
      --deadline "$d" --out "$work/tput" > "$work/tput.out" 2>&1 &
    wait
    tail -40 "$work/ab/e2e.md" "$work/tput/e2e.md" 2>/dev/null
    ;;
  ab)  # seed 002's A/B with each fold on its own GPU, side by side (AB_S seconds),
       # then the bf16 graphs-vs-eager test on GPU 0 with the time left
    d=${AB_S:-175}
    for g in 0 1; do
      fold=$(( 1 - g ))
      CUDA_VISIBLE_DEVICES=$g timeout -s TERM $(( d + 30 )) python3 -m benchmarks.serving \
        --wheels "$EXTRA_WHEELS" --sections bench_ab --ab-folds $fold \
        --ab-isl "${AB_ISL:-8192,131072}" --ab-concurrency "${AB_CONC:-4,8}" \
        --deadline "$d" --out "$work/fold$fold" > "$work/fold$fold.out" 2>&1 &
    done
    wait
    python3 -m benchmarks.serving --merge-ab "$work"/fold1/e2e.json "$work"/fold0/e2e.json \
      --out "$work/ab" > "$work/merge.out" 2>&1
    sed -n '/## bench_ab/,/example command/p' "$work/ab/e2e.md"
    if [ "${AB_THEN_BF16:-1}" = 1 ]; then
      OUT="$work/gpu0" CUDA_VISIBLE_DEVICES=0 SUITE_TIMEOUT=$(( $(left) - 10 )) \
        RUN_SUITES="graphs_bf16" bash ci/gpu_series_tests.sh > "$work/gpu0.out" 2>&1
      cat "$work/gpu0/gpu_tests.md"; grep "^prompt\|^bf16:" "$work/gpu0/graphs_bf16.log"
    fi
    ;;
  bench)
    OUT="$work" CUDA_VISIBLE_DEVICES=0 timeout -s TERM "$(left)" \
      python3 -m benchmarks.msa --sweep > "$work/bench.out" 2>&1
    tail -40 "$work/bench.out"
    ;;
esac
tar czf "$OUT/results.tgz" -C "$OUT" "$phase" && rm -rf "$work"
echo "$phase: $(( $(date +%s) - T0 )) s; results in \$OUT/results.tgz"
