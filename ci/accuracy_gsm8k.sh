#!/usr/bin/env bash
# Accuracy job (the seeds' check): GSM8K with lm-eval against `vllm serve` of a MiniMax-M3 checkpoint.
#
#   ci/accuracy_gsm8k.sh MODEL [extra vllm serve args...]
#
# 1. starts `vllm serve MODEL` on 127.0.0.1:$PORT with the seeds' flags (or $SERVE_FLAGS) plus the
#    extra args, and waits for /health;
# 2. runs lm-eval's `local-completions` model against http://127.0.0.1:$PORT/v1/completions
#    (tokenizer from the model dir, num_concurrent, max_retries), gsm8k 8-shot by default,
#    reporting exact_match under the strict-match and flexible-extract filters;
# 3. stops the server (SIGINT, then the whole process group if it lingers; also on error or Ctrl-C);
# 4. writes $OUT/accuracy.md: the metrics table and the exact commands. Logs, lm-eval's results
#    JSON and per-sample outputs stay in $OUT.
#
# The client needs lm-eval (requirements/accuracy.txt); it can live in another venv than vLLM:
#   python3 -m venv /tmp/lmeval-venv && /tmp/lmeval-venv/bin/pip install -r requirements/accuracy.txt
#   LM_EVAL=/tmp/lmeval-venv/bin/lm_eval ci/accuracy_gsm8k.sh /models/MiniMax-M3-MXFP8
#
# Environment knobs:
#   PORT=8001            server port (bound to 127.0.0.1)
#   TASK=gsm8k           an lm-eval task name, or a task directory (then passed as --include_path and
#                        its tasks are the `task:` names of its yaml files), e.g. benchmarks/accuracy/gsm8k_local
#   NUM_FEWSHOT=8        LIMIT= (examples per task; empty = the whole test split)
#   OUT=out/accuracy     report directory
#   TP=4                 --tensor-parallel-size in the default serve flags
#   KV_CACHE_DTYPE=fp8   --kv-cache-dtype in the default serve flags (auto: the seeds' runs without FP8 KV)
#   SERVE_FLAGS='...'    replaces the default serve flags (one shell-quoted string), e.g. for CPU
#   VLLM=vllm            server command       LM_EVAL=lm_eval   client command
#   NUM_CONCURRENT=32 MAX_RETRIES=3 MAX_GEN_TOKS=256 MAX_LENGTH=32768 REQUEST_TIMEOUT=600
#                        lm-eval local-completions model args
#   STARTUP_TIMEOUT=1800 seconds to wait for /health     STOP_TIMEOUT=120 seconds to wait after SIGINT
#   NOTE='...'           a sentence added to the report     PYTHON=python3 (report helper, stdlib only)
set -uo pipefail

if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
MODEL=$1; shift
EXTRA_ARGS=("$@")

PORT=${PORT:-8001}
HOST=127.0.0.1
TASK=${TASK:-gsm8k}
NUM_FEWSHOT=${NUM_FEWSHOT:-8}
LIMIT=${LIMIT:-}
OUT=${OUT:-out/accuracy}
TP=${TP:-4}
KV_CACHE_DTYPE=${KV_CACHE_DTYPE:-fp8}
VLLM=${VLLM:-vllm}
LM_EVAL=${LM_EVAL:-lm_eval}
PYTHON=${PYTHON:-python3}
NUM_CONCURRENT=${NUM_CONCURRENT:-32}
MAX_RETRIES=${MAX_RETRIES:-3}
MAX_GEN_TOKS=${MAX_GEN_TOKS:-256}
MAX_LENGTH=${MAX_LENGTH:-32768}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-600}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-1800}
STOP_TIMEOUT=${STOP_TIMEOUT:-120}
URL="http://$HOST:$PORT"

# The seeds' serve flags (MiniMax-M3-MXFP8 / -MXFP4 on 4 GPUs); host and port are added below.
DEFAULT_SERVE_FLAGS=(
  --tensor-parallel-size "$TP"
  --dtype auto --load-format auto
  --gpu-memory-utilization 0.85
  --max-model-len 32768 --max-num-batched-tokens 32768
  --block-size 128 --kv-cache-dtype "$KV_CACHE_DTYPE"
  --no-enable-prefix-caching --enable-chunked-prefill
  --language-model-only --no-trust-remote-code
  --compilation-config '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'
)
if [ -n "${SERVE_FLAGS+set}" ]; then  # split like a shell would (quotes kept), without eval
  mapfile -d '' -t SERVE_ARGS < <("$PYTHON" -c \
    'import shlex, sys; sys.stdout.write("".join(a + "\0" for a in shlex.split(sys.argv[1])))' \
    "$SERVE_FLAGS") || { echo "cannot parse SERVE_FLAGS" >&2; exit 2; }
else
  SERVE_ARGS=("${DEFAULT_SERVE_FLAGS[@]}")
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SERVER_LOG=$OUT/server.log
EVAL_LOG=$OUT/lm_eval.log
REPORT=$OUT/accuracy.md

quote() { "$PYTHON" -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "$@"; }
log() { echo "[accuracy $(date -u +%H:%M:%S)] $*"; }
healthy() { curl -sf -o /dev/null --max-time 5 "$URL/health"; }

# ---------------------------------------------------------------- task
TASK_ARGS=()
if [ -d "$TASK" ]; then
  TASK_DIR=$(cd "$TASK" && pwd)
  TASK_NAMES=$(sed -n 's/^task:[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$TASK_DIR"/*.yaml | paste -sd, -)
  [ -n "$TASK_NAMES" ] || { echo "no 'task:' in $TASK_DIR/*.yaml" >&2; exit 2; }
  TASK_ARGS=(--include_path "$TASK_DIR")
else
  TASK_NAMES=$TASK
fi

# ---------------------------------------------------------------- server
for tool in "$VLLM" "$LM_EVAL" "$PYTHON" curl setsid; do  # fail before the (long) server start
  command -v "$tool" > /dev/null || { echo "not found: $tool (see VLLM, LM_EVAL, PYTHON)" >&2; exit 2; }
done
if healthy; then
  echo "something already answers on $URL/health; pick another PORT" >&2
  exit 2
fi
SERVE_CMD=("$VLLM" serve "$MODEL" --host "$HOST" --port "$PORT" "${SERVE_ARGS[@]}" "${EXTRA_ARGS[@]}")
SERVER_PID=
SERVER_RC=
STOPPED_BY=
HEALTHY=0

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    log "stopping the server (SIGINT to pid $SERVER_PID)"
    kill -INT "$SERVER_PID" 2>/dev/null
    # a server still starting up may not act on SIGINT: give it only a short while
    local t=0 limit=$STOP_TIMEOUT
    [ "$HEALTHY" = 1 ] || limit=10
    while kill -0 "$SERVER_PID" 2>/dev/null && [ "$t" -lt "$limit" ]; do sleep 1; t=$((t + 1)); done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      log "server still up ${limit}s after SIGINT: SIGTERM, then SIGKILL, to its process group"
      kill -TERM -- "-$SERVER_PID" 2>/dev/null; sleep 10
      kill -KILL -- "-$SERVER_PID" 2>/dev/null
      STOPPED_BY="SIGTERM/SIGKILL to its process group, ${limit}s after SIGINT"
    else
      STOPPED_BY="SIGINT, exited after ${t}s"
    fi
  else
    STOPPED_BY="had already exited"
  fi
  wait "$SERVER_PID" 2>/dev/null; SERVER_RC=$?
  # engine-core / worker / resource-tracker processes of the server's process group: a grace
  # period to finish their own clean-up, then they are killed
  local g=0
  while kill -0 -- "-$SERVER_PID" 2>/dev/null && [ "$g" -lt 30 ]; do sleep 1; g=$((g + 1)); done
  if kill -0 -- "-$SERVER_PID" 2>/dev/null; then
    kill -KILL -- "-$SERVER_PID" 2>/dev/null
    STOPPED_BY="$STOPPED_BY; processes of its group still up 30s later were killed"
  fi
  log "server stopped ($STOPPED_BY), exit code $SERVER_RC"
  SERVER_PID=
}
trap stop_server EXIT
trap 'exit 130' INT TERM

log "server: $(quote "${SERVE_CMD[@]}")"
log "server log: $SERVER_LOG"
T0=$(date +%s)
# own session and process group, so that the whole server can be stopped by its id
setsid "${SERVE_CMD[@]}" > "$SERVER_LOG" 2>&1 &
SERVER_PID=$!
until healthy; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    wait "$SERVER_PID"; rc=$?; SERVER_PID=
    echo "server exited (code $rc) before becoming healthy; last lines of $SERVER_LOG:" >&2
    tail -40 "$SERVER_LOG" >&2
    exit 1
  fi
  if [ $(( $(date +%s) - T0 )) -ge "$STARTUP_TIMEOUT" ]; then
    echo "server not healthy after ${STARTUP_TIMEOUT}s; last lines of $SERVER_LOG:" >&2
    tail -40 "$SERVER_LOG" >&2
    exit 1
  fi
  sleep 5
done
HEALTHY=1
STARTUP_S=$(( $(date +%s) - T0 ))
VLLM_VERSION=$(curl -sf --max-time 5 "$URL/version" \
  | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin).get("version", "?"))' 2>/dev/null || echo "?")
log "server healthy after ${STARTUP_S}s (vllm $VLLM_VERSION)"

# ---------------------------------------------------------------- client
MODEL_ARGS="model=$MODEL,base_url=$URL/v1/completions,tokenizer=$MODEL,tokenizer_backend=huggingface"
MODEL_ARGS+=",tokenized_requests=False,num_concurrent=$NUM_CONCURRENT,max_retries=$MAX_RETRIES"
MODEL_ARGS+=",max_gen_toks=$MAX_GEN_TOKS,max_length=$MAX_LENGTH,timeout=$REQUEST_TIMEOUT"
EVAL_CMD=("$LM_EVAL" run --model local-completions --model_args "$MODEL_ARGS"
          --tasks "$TASK_NAMES" --num_fewshot "$NUM_FEWSHOT" "${TASK_ARGS[@]}"
          --output_path "$OUT/lm_eval" --log_samples)
[ -n "$LIMIT" ] && EVAL_CMD+=(--limit "$LIMIT")

log "client: $(quote "${EVAL_CMD[@]}")"
MARK=$OUT/.eval-start
touch "$MARK"
T1=$(date +%s)
"${EVAL_CMD[@]}" 2>&1 | tee "$EVAL_LOG"
EVAL_RC=${PIPESTATUS[0]}
EVAL_S=$(( $(date +%s) - T1 ))
log "lm-eval exited with code $EVAL_RC after ${EVAL_S}s"

stop_server

# ---------------------------------------------------------------- report
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then
  MACHINE="$(nvidia-smi -L | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
elif command -v rocm-smi > /dev/null 2>&1 && rocm-smi --showproductname > /dev/null 2>&1; then
  MACHINE="$(rocm-smi --showproductname | grep -c 'Card [Ss]eries') x $(rocm-smi --showproductname \
    | sed -n 's/.*Card [Ss]eries:[[:space:]]*//p' | head -1) (ROCm)"
else
  MACHINE="CPU ($(nproc) cores)"
fi
SET_ENV=$(env | grep -E '^(HF_[A-Z_]*OFFLINE|VLLM_[A-Z0-9_]+|CUDA_VISIBLE_DEVICES|HIP_VISIBLE_DEVICES|TRITON_[A-Z_]+)=' \
          | grep -v -E '^VLLM_(API_KEY|.*TOKEN)' | sort | tr '\n' ' ')

REPORT_MACHINE=$MACHINE REPORT_VLLM=$VLLM_VERSION REPORT_STARTUP=$STARTUP_S REPORT_EVAL_S=$EVAL_S \
REPORT_EVAL_RC=$EVAL_RC REPORT_SERVER_RC=$SERVER_RC REPORT_STOPPED_BY=$STOPPED_BY \
REPORT_SERVE_CMD=$(quote "${SERVE_CMD[@]}") REPORT_EVAL_CMD=$(quote "${EVAL_CMD[@]}") \
REPORT_ENV=$SET_ENV REPORT_NOTE=${NOTE:-} REPORT_MODEL=$MODEL REPORT_TASKS=$TASK_NAMES \
"$PYTHON" - "$OUT" "$MARK" "$REPORT" <<'PY'
import datetime, glob, json, os, sys

out, mark, report = sys.argv[1:4]
E = os.environ.get
files = [f for f in glob.glob(os.path.join(out, "lm_eval", "**", "results_*.json"), recursive=True)
         if os.path.getmtime(f) >= os.path.getmtime(mark)]
res = json.load(open(max(files, key=os.path.getmtime))) if files else None

L = ["# GSM8K accuracy (lm-eval against vllm serve)", "",
     f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
     f"- machine: {E('REPORT_MACHINE')}",
     f"- model: `{E('REPORT_MODEL')}`",
     f"- vllm (server `/version`): {E('REPORT_VLLM')}"]
if res:
    L.append(f"- lm-eval: {res.get('lm_eval_version', '?')}"
             f" (transformers {res.get('transformers_version', '?')})")
L += [f"- server: healthy after {E('REPORT_STARTUP')} s; stopped by {E('REPORT_STOPPED_BY')},"
      f" exit code {E('REPORT_SERVER_RC')}",
      f"- lm-eval: exit code {E('REPORT_EVAL_RC')}, {E('REPORT_EVAL_S')} s", ""]
if E("REPORT_NOTE"):
    L += [E("REPORT_NOTE"), ""]

L += ["## Metrics", ""]
if res:
    L += ["| task | filter | n-shot | samples | exact_match | stderr |", "|---|---|---|---|---|---|"]
    for task in E("REPORT_TASKS").split(","):
        r = res.get("results", {}).get(task, {})
        nshot = res.get("n-shot", {}).get(task, "?")
        n = res.get("n-samples", {}).get(task, {}).get("effective", "?")
        for flt in ("strict-match", "flexible-extract"):
            v = r.get(f"exact_match,{flt}")
            se = r.get(f"exact_match_stderr,{flt}")
            fmt = lambda x: f"{x:.4f}" if isinstance(x, (int, float)) else str(x)
            L.append(f"| {task} | {flt} | {nshot} | {n} | {fmt(v)} | {fmt(se)} |")
    L += ["", f"lm-eval results: `{os.path.relpath(max(files, key=os.path.getmtime), out)}` (in the report dir)"]
else:
    L.append("No lm-eval results were written: see lm_eval.log and server.log in the report dir.")

L += ["", "## Commands", ""]
if E("REPORT_ENV").strip():
    L += [f"Environment set: `{E('REPORT_ENV').strip()}`", ""]
L += ["Server:", "", "```bash", E("REPORT_SERVE_CMD"), "```", "",
      "Client:", "", "```bash", E("REPORT_EVAL_CMD"), "```", ""]
open(report, "w").write("\n".join(L))
print("\n".join(L))
PY
rm -f "$MARK"
log "report: $REPORT"
exit "$EVAL_RC"
