#!/usr/bin/env bash
# GPU machine: builds the Python package with CUDA (`pip install .`, deps from the carried .deps/,
# nanobind and scikit-build-core from the machine: no network, no build isolation) into
# $BUILD/site, then runs the torch adapter's tests on the device: tests/python/test_torch_cuda.py
# (CPU == CUDA fingerprints, GradScaler with an injected inf, stream ordering), None gradients on
# the device mask (tests/python/test_torch_none_grad.py and, with bf16/fp16 parameters,
# test_torch_none_grad_dtype.py; cpu and cuda), bf16/fp16 parameters
# (tests/python/test_torch_precision.py, cpu and cuda), the Recorder with None gradients
# (tests/python/test_recorder_none_grad.py) and the CPU-side
# tests/python/test_torch_api.py on the same install (with pytest when the machine has it).
# Logs go to $OUT (or gpu-python-out/); the last line is the one-line summary.
#
#   scripts/gpu_python.sh         (the lead runs it through the device tool with carry [".deps"])
#   GPU_PYTHON_CUDA=OFF PYTHON=venv/bin/python scripts/gpu_python.sh   (a dry run of the script
#   on a machine without a GPU: the CUDA tests skip)
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-python-out}
BUILD=${BUILD:-$ROOT/build-gpu-python}
DEPS=$ROOT/.deps
mkdir -p "$OUT" "$BUILD"
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
PY=${PYTHON:-python3}
t0=$SECONDS
# scikit-build-core reads its settings from the environment too (older pips lack -C).
SKBUILD_BUILD_DIR="$BUILD/skbuild" \
SKBUILD_CMAKE_DEFINE="RENAISSANCE_CUDA=${GPU_PYTHON_CUDA:-ON};RENAISSANCE_DEPS_DIR=$DEPS;CMAKE_PREFIX_PATH=$DEPS" \
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  timeout 420 "$PY" -m pip install --no-build-isolation --no-deps --no-index --upgrade --target "$BUILD/site" . \
  > "$OUT/pip.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  tail -30 "$OUT/pip.log"
  echo "gpu_python: pip install FAILED (rc $rc) after $((SECONDS - t0)) s (log: pip.log)"
  exit 1
fi
cd "$BUILD"
export PYTHONPATH="$BUILD/site"
"$PY" -c 'import renaissance, torch; print("renaissance", renaissance.__version__, "with_cuda", renaissance.with_cuda, "torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  2>&1 | tee "$OUT/versions.log"
if "$PY" -c 'import pytest' 2>/dev/null; then
  timeout 300 "$PY" -m pytest "$ROOT/tests/python/test_torch_cuda.py" "$ROOT/tests/python/test_torch_api.py" \
    "$ROOT/tests/python/test_torch_none_grad.py" "$ROOT/tests/python/test_torch_none_grad_dtype.py" "$ROOT/tests/python/test_torch_precision.py" "$ROOT/tests/python/test_recorder_none_grad.py" -q -rs -s \
    > "$OUT/pytest.log" 2>&1
  rc=$?
  tail -25 "$OUT/pytest.log"
  summary=$(tail -1 "$OUT/pytest.log")
else
  timeout 300 "$PY" "$ROOT/tests/python/test_torch_cuda.py" > "$OUT/pytest.log" 2>&1
  rc=$?
  cat "$OUT/pytest.log"
  summary="(no pytest: test_torch_cuda.py only) $(tail -1 "$OUT/pytest.log")"
fi
# BENCH=1: also the step-in-training benchmark (bench/bench_torch_step.py; needs torchvision
# and transformers on the machine), after the tests.
if [ "${BENCH:-0}" = 1 ]; then
  timeout 240 "$PY" "$ROOT/bench/bench_torch_step.py" --json-out "$OUT/bench_torch_step.json" 2>&1 | tee "$OUT/bench.log"
fi
if [ $rc -eq 0 ]; then verdict=PASS; else verdict="FAIL (rc $rc)"; fi
echo "gpu_python: $verdict in $((SECONDS - t0)) s: $summary"
exit $rc
