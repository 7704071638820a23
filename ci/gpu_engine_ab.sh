#!/usr/bin/env bash
# GPU job: the v0.26.0 flavor's engine A/B (benchmarks/engine_ab: upstream's MSA kernels
# against the series' on one install), in one call, on the GPU machine after
#   bash .gpu/recv.sh install && . /tmp/gpu-env.sh
# with the flavor's CUDA wheel packed by ../shared/gpu/pack.sh and, as its extra folder,
# a wheels/ folder of what v0.26.0 needs beyond the bundle (flashinfer-python 0.6.14,
# nvidia-cutlass-dsl 4.6.0 + libs, quack-kernels, cuda-tile, cudnn-frontend,
# torch-c-dlpack-ext, nvtx, humming-kernels, ninja: ci/gpu_v026_wheels.sh DIR).
# Writes $OUT/engine_ab/{engine_ab.json,engine_ab.md,logs.tgz} and $OUT/engine_ab/env.md
# (logs.tgz: side-*.log and the profiles' own JSON and logs; engine_ab.json holds every row
# and profile; PACK=0 leaves them unpacked);
# RUN_TESTS=1 first runs tests/upstream_m3/test_upstream_m3_gpu.py (A vs B tokens and
# logprobs) and test_upstream_m3_slot_mapping_warmup.py (entry 13) into
# $OUT/engine_ab/tests.log (TESTS_K=... passes -k: 'not fp8' skips the two FP8-KV engines);
# RUN_BENCH=0 skips the benchmark.
# PROFILE=graphs,eager adds a decode-step profile per side (benchmarks/engine_ab/step_profile.py:
# per kernel, kernel family and, eager, decoder layer, with the host's share), PROFILE_BATCH=1
# its batch and DECODE_CTX=8192 its context; PROFILE=prefill[,prefill-eager] profiles one prefill of PREFILL_CTX (32768) tokens
# the same way (a comma list, e.g. 1023,1024, profiles each length in one engine start, each
# after PREFILL_REPEATS (10) unprofiled prefills whose median wall time the report compares);
# NO_ROWS=1 profiles only; SERVING_LIMITS=1 profiles with the serving matrix's engine limits
# (max_model_len 132096, 32768 batched tokens). The tests run without -x: each of them places a
# difference between A and B (selection or arithmetic), so all of them report.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/engine_ab"
. "$(dirname "$0")/gpu_lib.sh"
EXTRA=${EXTRA:-/tmp/gpu-extra}
install_wheels_once "$EXTRA/wheels" /tmp/site26x "$OUT/engine_ab/extra_wheels.log" \
  || echo "extra wheels: pip failed, see extra_wheels.log"
export PYTHONPATH=/tmp/site26x${PYTHONPATH:+:$PYTHONPATH} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
gpu_env_lines | tee "$OUT/engine_ab/env.md"
if [ "${RUN_TESTS:-0}" = 1 ]; then   # A vs B correctness on a tiny checkpoint first
  python3 -m pytest -q -s tests/upstream_m3/test_upstream_m3_gpu.py tests/upstream_m3/test_upstream_m3_slot_mapping_warmup.py ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$OUT/engine_ab/tests.log" | tail -15
fi
[ "${RUN_BENCH:-1}" = 1 ] || exit 0
python3 -m benchmarks.engine_ab --out "$OUT/engine_ab" --layers "${LAYERS:-4}" \
  --sides "${SIDES:-A,B}" --timeout "${SIDE_TIMEOUT:-250}" \
  ${PROFILE:+--profile "$PROFILE" --profile-batch "${PROFILE_BATCH:-1}" --decode-ctx "${DECODE_CTX:-8192}" --prefill-ctx "${PREFILL_CTX:-32768}" --prefill-repeats "${PREFILL_REPEATS:-10}"} ${NO_ROWS:+--no-rows} ${SERVING_LIMITS:+--serving-limits}
rc=$?
rm -rf "$OUT/engine_ab/model"   # the config-only model directory: rebuilt by every run
if [ "${PACK:-1}" = 1 ]; then     # a device call returns few files: logs and per-length JSONs in one
  ( cd "$OUT/engine_ab" && tar -czf logs.tgz --remove-files side-*.log profile-* 2>/dev/null )
fi
exit $rc
