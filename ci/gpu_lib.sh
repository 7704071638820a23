# Sourced by the GPU jobs (ci/gpu_engine_ab.sh, ci/gpu_serve_matrix.sh, ci/gpu_quant_bench.sh):
# the steps they share. Bash; no `set -e` assumptions.

# gpu_env_lines: what a result file needs to say where it came from (stdout): UTC time,
# GPU and driver, repo commit (GIT_COMMIT, else git), vllm / torch / triton versions.
gpu_env_lines() {
  echo "date: $(date -u +%FT%TZ)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
  echo "commit: ${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  python3 -c "import vllm, torch, triton; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tail -1
}

# install_wheels_once DIR TARGET [LOG]: pip-install DIR/*.whl (no index, no dependencies)
# into TARGET, once per machine (a marker in TARGET remembers DIR). Returns 1 when pip
# fails (its output in LOG, default /dev/null), 0 when DIR has no wheels.
install_wheels_once() {
  local dir=$1 target=$2 log=${3:-/dev/null} mark
  mark="$target/.installed-$(echo "$dir" | tr '/' '_')"
  ls "$dir"/*.whl > /dev/null 2>&1 || return 0
  [ -f "$mark" ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$target" "$dir"/*.whl \
    > "$log" 2>&1 && touch "$mark"
}
