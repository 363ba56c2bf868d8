#!/usr/bin/env bash
# Downloads into ./.whl (git-ignored) the wheels a GPU machine with no package index needs to run this
# project at its pins: kernels, transformers and huggingface_hub at the versions requirements/constraints.txt
# names, with what huggingface_hub 2.x brings that such a machine (torch 2.11, transformers 5.17,
# huggingface_hub 1.33, Python 3.12) lacks, plus Liger (the benchmark's baseline), accelerate (the
# tensor-parallel test), kernel-abi-check (the builder's portability check) and the CUTLASS headers the
# CUDA build uses. One version of each: a second copy of a package stops `pip install --target`.
# benchmarks/h200_session.sh installs them there.
# Usage: bash benchmarks/device_wheels.sh [extra NAME==VERSION ...]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
pin() { grep -i "^$1==" requirements/constraints.txt || { echo "no pin for $1 in requirements/constraints.txt" >&2; exit 1; }; }
wheels=("$(pin kernels)" "$(pin transformers)" "$(pin huggingface_hub)" "$(pin httpx2)" "$(pin httpcore2)"
        "$(pin truststore)" "$(pin click)" "$(pin hf-xet)" "$(pin accelerate)" "$(pin kernel-abi-check)"
        liger-kernel==0.8.5 nvidia-cutlass==4.2.0.0 "$@")
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${wheels[@]}"
ls -la .whl
