#!/usr/bin/env bash
# What the v0.26.0 flavor's CUDA wheel needs on the GPU machine beyond its image and the
# bundle pack.sh makes (Python 3.12, manylinux x86_64), fetched without dependencies:
#
#   ci/gpu_v026_wheels.sh DIR     -> DIR/wheels (these) and DIR/e2e-wheels (ci/gpu_extra_wheels.sh)
#   ../shared/gpu/pack.sh dist/<v0.26.0 cuda wheel> DIR/wheels DIR/e2e-wheels
#
# ci/gpu_engine_ab.sh and ci/gpu_serve_matrix.sh install DIR/wheels into a site folder ahead
# of the image's. Versions: those vLLM 0.26.0 was seen working with on the H200 (2026-12-04);
# the unpinned ones of that run are pinned to what the index served on 2026-12-07.
# apache-tvm-ffi is left out on purpose: the image's 0.1.15 must stay (0.1.10 breaks xgrammar).
# cuda-tile publishes only manylinux2014 wheels, hence that platform tag too.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
out=$1
here=$(cd "$(dirname "$0")" && pwd)
WHEELS="flashinfer-python==0.6.14 nvidia-cutlass-dsl==4.6.0 nvidia-cutlass-dsl-libs-base==4.6.0
nvidia-cutlass-dsl-libs-cu13==4.6.0 quack-kernels==0.4.0 cuda-tile==1.7.0
nvidia-cudnn-frontend==1.32.0 torch-c-dlpack-ext==0.1.5 nvtx==0.2.15 humming-kernels==0.1.10
ninja==1.13.2 fastapi==0.136.3"
platforms=(--platform any --platform manylinux2014_x86_64)
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
mkdir -p "$out/wheels"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  "${platforms[@]}" -d "$out/wheels" $WHEELS
n=$(ls "$out/wheels"/*.whl | wc -l)
[ "$n" -ge 12 ] || { echo "$0: expected 12 wheels in $out/wheels, found $n" >&2; exit 1; }
bash "$here/gpu_extra_wheels.sh" "$out/e2e-wheels"
echo "v0.26.0 extra wheels in $out/wheels: $n wheels, $(du -sh "$out/wheels" | cut -f1)"
