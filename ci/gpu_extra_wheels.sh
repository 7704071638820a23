#!/usr/bin/env bash
# Wheels that `vllm serve` and `vllm bench serve` need on the GPU machine and
# that neither its image nor ../shared/gpu/deps-py312.txt (the bundle pack.sh
# ships) provides, for its Python 3.12 / manylinux x86_64.
#
#   ci/gpu_extra_wheels.sh OUTDIR        then ship OUTDIR with pack.sh as an EXTRA_DIR
#   (PYVER=3.11 fetches the same set for another Python, e.g. to rehearse here)
#
# Roots: the requirements of vLLM's requirements/common.txt that are missing
# there: uvicorn (from fastapi[standard]; imported by vllm.entrypoints.launcher),
# model-hosting-container-standards (imported by the OpenAI API server),
# anthropic and mcp (declared, imported lazily); and for quantized checkpoints
# (compressed-tensors FP8), fetched without their dependencies (NODEPS; a
# resolve would pull a second torch): loguru (compressed-tensors' logger) and
# humming-kernels + pyelftools (vllm.model_executor.layers.quantization imports
# humming on CUDA) -- found missing on the H200 on 2026-11-29. The ROOTS' transitive dependencies
# come from a normal resolve, pinned to deps-py312.txt where it names them;
# then only the wheels of projects the GPU machine lacks are kept.
# python -m benchmarks.serving --wheels OUTDIR installs them there (and skips any project that
# is already installed).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$1
here=$(cd "$(dirname "$0")" && pwd)
deps=${GPU_DEPS:-$here/../../shared/gpu/deps-py312.txt}
[ -f "$deps" ] || { echo "$0: no $deps (set GPU_DEPS)" >&2; exit 2; }
ROOTS=${ROOTS:-"uvicorn model-hosting-container-standards anthropic mcp"}
NODEPS=${NODEPS:-"loguru humming-kernels==0.1.4 pyelftools"}

# Projects the GPU machine's image already has (read there, 2026-11-17; the
# ones a resolve of ROOTS can reach). deps-py312.txt is added below.
GPU_IMAGE="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click filelock frozenlist fsspec h11 httpcore httpx idna jinja2
markdown-it-py markupsafe mdurl multidict numpy packaging pillow pip prometheus-client
propcache protobuf psutil pygments pyyaml regex requests rich setuptools shellingham
six typer typing-extensions urllib3 uvloop wheel yarl zipp grpcio"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)

python3 -m pip download -q --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp \
  "${platforms[@]}" -c "$deps" -d "$tmp" $ROOTS 2>&1 | grep -v '^WARNING: Location' || true
[ -z "$NODEPS" ] || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version "${PYVER:-3.12}" --implementation cp "${platforms[@]}" -d "$tmp" $NODEPS 2>&1 \
  | grep -v '^WARNING: Location' || true

norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
have=" "
for n in $GPU_IMAGE; do have+="$(norm "$n") "; done
while IFS= read -r line; do
  n=${line%%==*}; [ -n "$n" ] && have+="$(norm "$n") "
done < "$deps"

mkdir -p "$out"; rm -f "$out"/*.whl  # one version of each project
kept=()
for w in "$tmp"/*.whl; do
  name=$(norm "$(basename "$w" | cut -d- -f1)")
  case "$have" in *" $name "*) continue ;; esac
  cp "$w" "$out/"; kept+=("$(basename "$w")")
done
[ ${#kept[@]} -gt 0 ] || { echo "$0: nothing downloaded for: $ROOTS" >&2; exit 1; }
printf '%s\n' "${kept[@]}" > "$out/WHEELS.txt"
echo "gpu extra wheels in $out: ${#kept[@]} wheels, $(du -sh "$out" | cut -f1)"
printf '  %s\n' "${kept[@]}"
