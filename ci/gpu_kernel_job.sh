#!/usr/bin/env bash
# The MSA kernel job on one GPU, without building or installing the vLLM wheel:
# the Triton kernels (vllm_overlay/.../triton_ops) only need torch and triton, so
# this puts them (and the torch-only reference ops) on PYTHONPATH as a stub `vllm`
# package, then, in one call,
#   1. runs the kernel tests at real shapes (tests/kernels/test_minimax_m3_triton_msa.py
#      and the FP8 scale-mode test), pytest's report in $OUT/kernel_tests.log;
#   2. runs the MSA benchmark, `python3 -m benchmarks.msa` (BENCH_ARGS, default: the
#      table; e.g. --sweep-only --sweep-kinds pdl, --prefix-overlap) with the time left,
#      results in $OUT/bench_msa.{json,md} and its log in $OUT/bench.log.
# Env: BUDGET_S (default 570, the call's wall limit), TESTS_S (default 300, pytest's
# share), TEST_SHARDS (default 1: pytest processes run in parallel), GIT_COMMIT
# (recorded by the bench), BENCH_ARGS, BENCH=0 (tests only), PYTEST_K (a pytest -k
# expression: only those tests).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash ci/gpu_kernel_job.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-570}
TESTS_S=${TESTS_S:-300}
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

shim=$(mktemp -d)
ops=vllm_overlay/vllm/models/minimax_m3/common/triton_ops
mkdir -p "$shim/vllm/models/minimax_m3/common"
for d in vllm vllm/models vllm/models/minimax_m3 vllm/models/minimax_m3/common; do
  : > "$shim/$d/__init__.py"
done
cp -r "$ops" "$shim/vllm/models/minimax_m3/common/triton_ops"
# the PyTorch reference ops (torch only), which the kernel tests compare against
cp vllm_overlay/vllm/models/minimax_m3/common/sparse_ops.py vllm_overlay/vllm/models/minimax_m3/common/dense_prefix.py \
  "$shim/vllm/models/minimax_m3/common/"
if python3 -c "import vllm" 2>/dev/null && [ -z "${PYTHONPATH:-}" ]; then
  echo "note: an installed vllm is shadowed by the stub for this job"
fi
export PYTHONPATH="$shim"
# progress reaches the logs as it happens (a shard killed mid-run leaves its dots)
export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
  torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"

TEST_FILES="tests/kernels/test_minimax_m3_triton_msa.py tests/kernels/test_minimax_m3_score_attend.py vllm_overlay/tests/kernels/test_minimax_m3_sparse_attn_fp8_scale.py"
PYTEST=(python3 -m pytest -q -rs -p no:cacheprovider --durations=25)
SELECT=()
if [ -n "${PYTEST_K:-}" ]; then SELECT=(-k "$PYTEST_K"); fi
if [ "${TESTS_S}" -gt 0 ] && [ "${TEST_SHARDS:-1}" -le 1 ]; then
  timeout -s INT -k 15 "$TESTS_S" "${PYTEST[@]}" "${SELECT[@]}" $TEST_FILES > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$? ($(( $(date +%s) - T0 )) s)"
  tail -5 "$OUT/kernel_tests.log"
elif [ "${TESTS_S}" -gt 0 ]; then
  # Most of the tests' wall time is Triton compiling each test's kernel variants on
  # one CPU core; TEST_SHARDS pytest processes (round-robin over the collected test
  # ids) compile in parallel and share the GPU.  A shard that ignores the interrupt
  # (blocked in a CUDA wait) is killed 15 s later, so the bench keeps its time (a
  # shard that did not stop once took the rest of the call).
  python3 -m pytest -q --collect-only -p no:cacheprovider "${SELECT[@]}" $TEST_FILES 2>/dev/null \
    | grep '::' > "$OUT/test_ids.txt"
  pids=()
  for i in $(seq 0 $(( TEST_SHARDS - 1 ))); do
    awk -v n="$TEST_SHARDS" -v i="$i" 'NR % n == i' "$OUT/test_ids.txt" > "$OUT/shard$i.txt"
    timeout -s INT -k 15 "$TESTS_S" "${PYTEST[@]}" $(cat "$OUT/shard$i.txt") > "$OUT/kernel_tests.shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; echo "shard $i rc=$? $(tail -1 "$OUT/kernel_tests.shard$i.log")"
  done
  echo "kernel tests: $(( $(date +%s) - T0 )) s"
  cat "$OUT"/kernel_tests.shard*.log > "$OUT/kernel_tests.log"
  rm -f "$OUT"/kernel_tests.shard*.log "$OUT"/shard*.txt
fi

budget=$(( $(left) - 10 ))
if [ "${BENCH:-1}" = 0 ]; then
  echo "bench skipped (BENCH=0)"
elif [ "$budget" -gt 30 ]; then
  OUT="$OUT" timeout -s TERM -k 10 "$budget" python3 -m benchmarks.msa ${BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
  echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"
else
  echo "no time left for the bench"
fi
rm -rf "$shim"
