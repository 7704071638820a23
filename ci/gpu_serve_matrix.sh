#!/usr/bin/env bash
# GPU job: the engine-level serving matrix (benchmarks/serving/matrix.py): one config-only
# MiniMax-M3 directory (released layer shapes, LAYERS layers, dummy weights) served by
# `vllm serve` with seed 002's flags and measured by `vllm bench serve` (random dataset,
# ISL 1k/8k/32k/128k x OSL 256 x concurrency 1/8/32) per side, in one device call per install
# (after `bash .gpu/recv.sh install && . /tmp/gpu-env.sh`, ../shared/gpu/README.md):
#
#   SIDES=B,A bash ci/gpu_serve_matrix.sh   # the series' v0.26.0 wheel: B = VLLM_MINIMAX_M3_MSA=series,
#                                           # A = =upstream (B first: A's crashes cost B nothing)
#   SIDES=C   bash ci/gpu_serve_matrix.sh   # the series' v0.23.0 wheel
#
# then, here, join the calls' side files into one table with B/A and C/A per row:
#   python -m benchmarks.serving.matrix report CALL1/serve_matrix/side-*.json \
#       CALL2/serve_matrix/side-C.json --out DIR
#
# Writes $OUT/serve_matrix/{side-<S>.json, matrix.md, env.md, logs.tgz} (logs.tgz: serve.log,
# bench.log, bench/*.json, matrix.json, run.out; PACK=0 leaves them unpacked). For A/B the v0.26.0 extras in $EXTRA/wheels (flashinfer-python
# 0.6.14, nvidia-cutlass-dsl 4.6.0 + libs, ...: ci/gpu_engine_ab.sh; vLLM 0.26 also pins
# fastapi < 0.137, so add fastapi 0.136.x there when the bundle's is newer) go to /tmp/site26x,
# ahead on PYTHONPATH; C runs without them. E2E_WHEELS (default $EXTRA/e2e-wheels, from
# ci/gpu_extra_wheels.sh): uvicorn and the other `vllm serve` imports the image lacks.
# Knobs: BUDGET_S (560: the job's wall, report included), ISLS, CONCURRENCY, NUM_PROMPTS
# (e.g. 1=4,8=8,32=32,128kx1=2), LAYERS (4), MATRIX_ARGS (more flags for `matrix run`,
# e.g. "--on-crash skip-higher-concurrency" or "--server-env VLLM_USE_BREAKABLE_CUDAGRAPH=0").
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/gpu_lib.sh
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
SIDES=${SIDES:-B,A}
OUT=${OUT:-out}; dir="$OUT/serve_matrix"; mkdir -p "$dir"
EXTRA=${EXTRA:-/tmp/gpu-extra}
E2E_WHEELS=${E2E_WHEELS:-$EXTRA/e2e-wheels}
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
case ",$SIDES," in
  *,C,*) [ "$SIDES" = C ] || { echo "SIDES=$SIDES: C runs on the v0.23.0 install, A and B on the v0.26.0 one; one call each" >&2; exit 2; } ;;
  *) install_wheels_once "$EXTRA/wheels" /tmp/site26x "$dir/extra_wheels.log" \
       || echo "extra wheels: pip failed, see extra_wheels.log"
     [ -d /tmp/site26x ] && export PYTHONPATH=/tmp/site26x${PYTHONPATH:+:$PYTHONPATH} ;;
esac
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
{
  gpu_env_lines
  echo "sides: $SIDES"
  python3 -c "import fastapi; print('fastapi', fastapi.__version__)"
  echo "PYTHONPATH: ${PYTHONPATH:-}"
  echo "VLLM_USE_BREAKABLE_CUDAGRAPH: ${VLLM_USE_BREAKABLE_CUDAGRAPH-unset}"
} 2>&1 | tee "$dir/env.md"
left=$(( BUDGET_S - ($(date +%s) - T0) ))
# rows and server starts stop at the deadline; the TERM a little later is the backstop
timeout -k 10 -s TERM $(( left - 5 )) python3 -m benchmarks.serving.matrix run --sides "$SIDES" \
  --out "$dir" --wheels "$E2E_WHEELS" --deadline $(( left - 25 )) --layers "${LAYERS:-4}" \
  ${ISLS:+--isl "$ISLS"} ${CONCURRENCY:+--concurrency "$CONCURRENCY"} \
  ${NUM_PROMPTS:+--num-prompts "$NUM_PROMPTS"} ${MATRIX_ARGS:-} > "$dir/run.out" 2>&1
rc=$?
tail -5 "$dir/run.out"
cat "$dir/matrix.md" 2>/dev/null || echo "no matrix.md; see $dir/run.out"
if [ "${PACK:-1}" = 1 ]; then  # few files come back from a device call: logs in one tarball
  ( cd "$dir" && tar -czf logs.tgz --remove-files serve.log bench.log bench matrix.json run.out 2>/dev/null )
fi
exit $rc
