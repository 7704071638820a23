#!/usr/bin/env bash
# GPU job: the series' GPU-relevant test suites on the patched CUDA wheel, in one call.
# The suites are the table SUITE_TABLE below.
# DEADLINE_EPOCH (seconds since the epoch): suites are cut to end before it, or skipped.
# Run on the GPU machine after `bash .gpu/recv.sh install && . /tmp/gpu-env.sh`
# (docs/gpu-validation.md; `make gpu-validate` runs this through ci/gpu_validate.sh).
# RUN_SUITES="models" runs a subset, one suite after another with every GPU visible; then
# LANES="graphs models_graphs;fp8ckpt kernels" runs lane i on GPU i (CUDA_VISIBLE_DEVICES=i),
# the lanes side by side, each lane's suites one after another. Writes $OUT/gpu_tests.md
# (dated table), junit XML and logs per suite.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
# The suites, one a line: name | environment | pytest arguments (a -k expression may be
# quoted) | what it checks. "BM4" = VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR=4 (block-major
# forced: the test prompts are shorter than the 1024 prefill tokens from which the
# engine picks it), "DP16" = VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS=16 (the test prompts'
# tokens below top-k x block attended by SDPA on the side stream).
SUITE_TABLE='
kernels               | -                                       | tests/kernels vllm_overlay/tests | Triton MSA kernels, bf16/fp8, real shapes
fixes                 | -                                       | tests/fixes/test_51632_fused_shared_expert.py | vllm#51632 fused shared expert (#51585 is CPU-only)
models                | -                                       | tests/models | MiniMax-M3 vs transformers (Triton sparse backend on CUDA)
parity                | -                                       | tests/models/test_minimax_m3.py | the engine parity tests, eager
graphs                | -                                       | tests/models/test_minimax_m3_gpu.py -k cudagraphs | CUDA graphs change no token
tp2                   | -                                       | tests/models/test_minimax_m3_gpu.py -k tp2 | TP2 == TP1 (two GPUs)
graphs_fp32           | -                                       | tests/models/test_minimax_m3_gpu.py -k "cudagraphs and float32" | graphs == eager in fp32, default paths
graphs_bf16           | -                                       | tests/models/test_minimax_m3_gpu.py -k "cudagraphs and bfloat16" | bf16 FULL_AND_PIECEWISE == PIECEWISE, all-sparse checkpoint
graphs_bf16_nopdl     | VLLM_MINIMAX_M3_PDL=0                   | tests/models/test_minimax_m3_gpu.py -k "cudagraphs and bfloat16" | the same without PDL (bisects a FULL-graph difference)
graphs_one_launch     | VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE=1     | tests/models/test_minimax_m3_gpu.py -k "cudagraphs and float32" | graphs == eager, one-launch decode
graphs_token_tile     | VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE=4    | tests/models/test_minimax_m3_gpu.py -k "cudagraphs and float32" | graphs == eager, token-tiled prefill
graphs_block_major    | VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR=4   | tests/models/test_minimax_m3_gpu.py -k "cudagraphs and float32" | graphs == eager, BM4
parity_block_major    | VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR=4   | tests/models/test_minimax_m3.py -k "bf16_teacher or chunked_prefill" | bf16 parity with transformers, BM4
fp8kv_block_major     | VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR=4   | tests/models/test_minimax_m3_fp8_kv.py | FP8 KV engines, BM4
parity_dense_prefix   | VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS=16 | tests/models/test_minimax_m3.py -k "chunked_prefill or preemption" | parity (chunked prefill, preemption), DP16
graphs_dense_prefix   | VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS=16 | tests/models/test_minimax_m3_gpu.py -k "cudagraphs and float32" | graphs == eager (fp32), DP16
fp8kv_dense_prefix    | VLLM_MINIMAX_M3_DENSE_PREFIX_MIN_TOKENS=16 | tests/models/test_minimax_m3_fp8_kv.py | FP8 KV engines, DP16
fp8kv                 | -                                       | tests/models/test_minimax_m3_fp8_kv.py | per-token-head / scalar FP8 KV engines
fp8index              | -                                       | tests/models/test_minimax_m3_fp8_index.py | optional FP8 index-key cache
fp8ckpt               | -                                       | tests/models/test_minimax_m3_fp8_dynamic.py | compressed-tensors FP8-dynamic checkpoints
mxfp8ckpt             | -                                       | tests/models/test_minimax_m3_mxfp8.py tests/models/test_minimax_m3_mxfp4.py | MiniMax-M3-MXFP8 format: Marlin parity, FP8 KV off and on; Quark MXFP4 detection and the weights-only MXFP4 path (VLLM_MINIMAX_M3_MXFP4=bf16)
production_heads      | -                                       | tests/models/test_minimax_m3_production_heads.py | one TP4 rank head shapes: bf16 and fp8 KV through the sm_90 kernels
production_heads_bf16 | -                                       | tests/models/test_minimax_m3_production_heads.py -k bf16_block_major | its bf16 test only
models_graphs         | M3_TEST_GRAPHS=1                        | tests/models/test_minimax_m3.py -k "chunked_prefill or preemption or fused_shared or bf16_teacher" | parity with graphs (FULL_AND_PIECEWISE)
warmup                | -                                       | tests/models/test_minimax_m3_sparse_impl_warmup.py | start-up warm-up: requests compile no Triton kernel
fused_graphs          | M3_TEST_GRAPHS=1                        | tests/models/test_minimax_m3.py -k "fused_shared or bf16_teacher" | fused shared expert and bf16 parity, graphs
'
declare -A SUITES=() SUITE_ENV=()
while IFS='|' read -r name env args _what; do
  name=$(echo $name)
  [ -n "$name" ] || continue
  env=$(echo $env); [ "$env" = - ] && env=""
  SUITES[$name]=$(echo $args); SUITE_ENV[$name]=$env
done <<< "$SUITE_TABLE"
BUDGET=${SUITE_TIMEOUT:-400}
# EXTRA_WHEELS=DIR (from ci/gpu_extra_wheels.sh, shipped with pack.sh): projects the GPU
# image lacks (compressed-tensors' loguru, humming for vLLM's quantization registry, ...).
# Default: the folder pack.sh delivers them to, when it is there (without them fp8ckpt
# fails on "No module named 'loguru'").
if [ -z "${EXTRA_WHEELS+set}" ] && ls /tmp/gpu-extra/e2e-wheels/*.whl > /dev/null 2>&1; then
  EXTRA_WHEELS=/tmp/gpu-extra/e2e-wheels
  echo "extra wheels: $EXTRA_WHEELS (EXTRA_WHEELS= turns this off)"
fi
if [ -n "${EXTRA_WHEELS:-}" ]; then
  python -m pip install -q --no-index --no-deps --target "${EXTRA_SITE:-/tmp/site}" "$EXTRA_WHEELS"/*.whl \
    > "$OUT/extra_wheels.log" 2>&1 || echo "extra wheels: pip failed, see extra_wheels.log"
fi
run_suite() {  # run_suite NAME: one pytest run, its junit XML and log under $OUT
  local s=$1
  if [ -z "${SUITES[$s]:-}" ]; then echo "unknown suite '$s' (known: ${!SUITES[*]})"; return 2; fi
  local budget=$BUDGET
  if [ -n "${DEADLINE_EPOCH:-}" ]; then  # never run past the caller's deadline
    local rest=$(( DEADLINE_EPOCH - $(date +%s) - 5 ))
    if [ "$rest" -lt 30 ]; then echo "$s: skipped (deadline)" | tee -a "$OUT/exit_codes.txt"; return 0; fi
    [ "$rest" -lt "$budget" ] && budget=$rest
  fi
  eval "set -- ${SUITES[$s]}"  # a suite may quote a -k expression
  # SIGINT at the budget: pytest then reports where it was and what failed so far
  env ${SUITE_ENV[$s]:-} timeout -s INT -k 20 "$budget" python -m pytest -q -rfEP -p no:cacheprovider --junitxml="$OUT/$s.xml" "$@" \
    > "$OUT/$s.log" 2>&1
  echo "$s: exit $? ${CUDA_VISIBLE_DEVICES:+(GPU $CUDA_VISIBLE_DEVICES)}" | tee -a "$OUT/exit_codes.txt"
  tail -3 "$OUT/$s.log"
}
ALL_SUITES=""
for s in ${RUN_SUITES-kernels fixes models}; do run_suite "$s"; ALL_SUITES+=" $s"; done
if [ -n "${LANES:-}" ]; then
  IFS=';' read -ra lanes <<< "$LANES"
  for i in "${!lanes[@]}"; do
    ( export CUDA_VISIBLE_DEVICES=$i; for s in ${lanes[$i]}; do run_suite "$s"; done ) &
    ALL_SUITES+=" ${lanes[$i]}"
  done
  wait
fi
export ALL_SUITES
python - "$OUT" <<'PY'
import datetime, os, subprocess, sys, xml.etree.ElementTree as ET
out = sys.argv[1]
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()[0]
import vllm
lines = ["# Series tests on GPU", "",
         f"date: {datetime.date.today()} | GPU: {gpu} | vllm: {vllm.__version__} | "
         f"repo commit: {os.environ.get('GIT_COMMIT', 'unknown')}", "",
         "| suite | passed | failed | errors | skipped | time (s) |", "|---|---|---|---|---|---|"]
for s in os.environ["ALL_SUITES"].split():
    try:
        suite = ET.parse(f"{out}/{s}.xml").getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n, f, e, k = (int(suite.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
        lines.append(f"| {s} | {n - f - e - k} | {f} | {e} | {k} | {float(suite.get('time', 0)):.0f} |")
    except (FileNotFoundError, ET.ParseError):
        lines.append(f"| {s} | - | - | - | - | no result (timed out or crashed; see {s}.log) |")
    fails = [c.get("classname", "") + "::" + c.get("name") for c in ET.parse(f"{out}/{s}.xml").iter("testcase")
             if c.find("failure") is not None or c.find("error") is not None] if os.path.exists(f"{out}/{s}.xml") else []
    lines += [f"|  ↳ failed: {x} | | | | | |" for x in fails[:10]]
open(f"{out}/gpu_tests.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
