#!/usr/bin/env bash
# The one command for the GPU machine (issue 4): configure and build (Release, CUDA on, deps from
# the carried .deps/), run the whole ctest suite, compute-sanitizer memcheck and racecheck on the
# CUDA tests, the CUDA step timing and (when torch is there) torch's fused optimizers on the same
# layouts. Logs go to $OUT (or gpu-check-out/), a short table is printed last.
#
#   scripts/gpu_check.sh [all|build|test|sanitize|time]...      (default: all)
#
# Each phase has its own time limit so that one call finishes well inside the device tool's
# 10 minutes; a phase that runs out is reported as TIMEOUT in the table.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
BUILD=${BUILD:-$ROOT/build-gpu}
DEPS=$ROOT/.deps
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=(all)
want() { local p; for p in "${PHASES[@]}"; do [ "$p" = all ] || [ "$p" = "$1" ] && return 0; done; return 1; }

declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-10s %s' "$1" "$2")"); }
status_of() { case $1 in 0) echo ok ;; 124|137) echo TIMEOUT ;; *) echo "FAILED (rc $1)" ;; esac; }

# The tests read ../shared (layouts, replay cases); it does not travel, .shared_copy does.
if [ ! -d "$ROOT/../shared/layouts" ]; then
  if [ -d "$ROOT/.shared_copy/layouts" ]; then
    ln -sfn "$ROOT/.shared_copy" "$ROOT/../shared" 2>/dev/null || cp -r "$ROOT/.shared_copy" "$ROOT/../shared"
  else
    echo "warning: no ../shared and no .shared_copy: layout tests will fail" >&2
  fi
fi

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  cmake --version | head -1
} > "$OUT/env.log" 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

if want build; then
  t0=$SECONDS
  {
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON \
      -DRENAISSANCE_DEPS_DIR="$DEPS" -DCMAKE_PREFIX_PATH="$DEPS" -DRENAISSANCE_BUILD_BENCH=OFF &&
      timeout 240 ninja -C "$BUILD" -j"$(nproc)"
  } > "$OUT/build.log" 2>&1
  rc=$?
  note build "$(status_of $rc) in $((SECONDS - t0)) s"
  if [ $rc -ne 0 ]; then
    grep -E "error|Error|FAILED" "$OUT/build.log" | head -30
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
  fi
fi

TESTS="$BUILD/tests/renaissance_tests"
CUDA_FILTER='CudaBackend.*:AllKinds/CudaMatchesCpu.*'

if want test; then
  t0=$SECONDS
  # Tests share one GPU and each CPU test uses every core: a few at a time.
  timeout 240 ctest --test-dir "$BUILD" --output-on-failure --parallel 4 --timeout 200 > "$OUT/ctest.log" 2>&1
  rc=$?
  line=$(grep -E "tests passed|tests failed" "$OUT/ctest.log" | tail -1)
  note ctest "$(status_of $rc) in $((SECONDS - t0)) s: ${line:-no summary}"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Subprocess)" "$OUT/ctest.log" | head -20
  skipped=$(grep -cE "Test +#[0-9]+: .* +(\*\*\*)?Skipped" "$OUT/ctest.log")
  note skipped "$skipped ctest entries skipped (see ctest.log)"
fi

if want time; then
  t0=$SECONDS
  timeout 90 "$BUILD/backend_cuda/cuda_step_timing" "$ROOT/../shared/layouts" 200 > "$OUT/timing.log" 2>&1
  rc=$?
  note timing "$([ $rc -eq 2 ] && echo 'ran (a target MISSED)' || status_of $rc) in $((SECONDS - t0)) s"
  if command -v python3 > /dev/null && python3 -c "import torch; assert torch.cuda.is_available()" 2> /dev/null; then
    t0=$SECONDS
    PYTHONUNBUFFERED=1 timeout 60 python3 backend_cuda/tools/torch_step_timing.py "$ROOT/../shared/layouts" \
      > "$OUT/torch.log" 2>&1
    note torch "$(status_of $?) in $((SECONDS - t0)) s"
  fi
fi

if want sanitize; then
  # The >2^31 tensor and the resnet50 layout are left out: they test sizes, not memory safety,
  # and take minutes under the sanitizer.
  MEM_FILTER="$CUDA_FILTER:-CudaBackend.TensorOfMoreThan2To31Elements:AllKinds/CudaMatchesCpu.Resnet50Layout/*"
  t0=$SECONDS
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$TESTS" --gtest_filter="$MEM_FILTER" \
    > "$OUT/memcheck.log" 2>&1
  rc=$?
  note memcheck "$(status_of $rc) in $((SECONDS - t0)) s: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED)' "$OUT/memcheck.log" | tr '\n' ' ')"
  # racecheck: the kernels with shared memory (LARS norms and ratios, the check's block vote).
  RACE_FILTER='AllKinds/CudaMatchesCpu.OddSizes*/lars*:AllKinds/CudaMatchesCpu.HundredsOfTinyTensors/lars:CudaBackend.GraphReplayEqualsDirectExecution'
  t0=$SECONDS
  timeout 90 compute-sanitizer --tool racecheck --error-exitcode 3 "$TESTS" --gtest_filter="$RACE_FILTER" \
    > "$OUT/racecheck.log" 2>&1
  rc=$?
  note racecheck "$(status_of $rc) in $((SECONDS - t0)) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED)' "$OUT/racecheck.log" | tr '\n' ' ')"
fi

echo
echo "== gpu_check on ${GPU:-unknown GPU}, logs in $OUT =="
[ -f "$OUT/timing.log" ] && sed -n '/device copy bandwidth/,$p' "$OUT/timing.log"
[ -f "$OUT/torch.log" ] && tail -n 12 "$OUT/torch.log"
printf '%s\n' "${SUMMARY[@]}"
