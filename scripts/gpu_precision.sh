#!/usr/bin/env bash
# The mixed-precision checks of issue 14 on the GPU machine: builds with CUDA, runs the
# precision unit tests (every kind x {bf16, fp16} x {nearest, stochastic} on CPU and CUDA, the
# CUDA fingerprint against the CPU's; with fp32 and with model-dtype gradients,
# MixedPrecisionModelDtypeGrads) and fails if a CUDA cell skipped, then compares
# `renaissance run` fingerprints of the model copy on cpu and cuda. Prints PRECISION OK at the end.
# Golden fingerprints of the new conformance cells: scripts/record_golden.sh afterwards.
#   scripts/gpu_precision.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-gpu-precision}"
deps=()
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$PWD/.deps" -DCMAKE_PREFIX_PATH="$PWD/.deps")
  export LD_LIBRARY_PATH="$PWD/.deps/lib:$PWD/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_BUILD_BENCH=OFF "${deps[@]}" >/dev/null
cmake --build "$build" --target renaissance_tests renaissance_cli --parallel "$(nproc)"
log="$build/precision-tests.log"
"$build/tests/renaissance_tests" --gtest_filter='*MixedPrecision*:Precision.*' 2>&1 | tee "$log" | tail -3
# A skipped CUDA cell means no device.
if grep -E '^\[  SKIPPED \].*_cuda' "$log"; then
  echo "FAIL: CUDA cells skipped (no device?)"; exit 1
fi
echo "precision tests: $(grep -c '^\[       OK \].*_cuda' "$log") CUDA cells passed"
grep -q '^\[  PASSED  \]' "$log" && ! grep -q '^\[  FAILED  \]' "$log" || { echo "FAIL: precision tests"; exit 1; }
for p in "bf16" "fp16" "bf16 --stochastic-rounding" "fp16 --stochastic-rounding" \
         "bf16 --grad-dtype model" "fp16 --grad-dtype model" "bf16 --stochastic-rounding --grad-dtype model" \
         "fp16 --stochastic-rounding --grad-dtype model"; do
  for kind in adamw lars lamb; do
    # shellcheck disable=SC2086
    cpu=$("$build/cli/renaissance" run --model resnet50 --optimizer $kind --steps 3 --nan-at 1 --backend cpu --precision $p --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])')
    # shellcheck disable=SC2086
    gpu=$("$build/cli/renaissance" run --model resnet50 --optimizer $kind --steps 3 --nan-at 1 --backend cuda --precision $p --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])')
    echo "$kind --precision $p: cpu $cpu cuda $gpu"
    [ "$cpu" = "$gpu" ] || { echo "FAIL: cpu and cuda differ"; exit 1; }
  done
done
echo "PRECISION OK"
