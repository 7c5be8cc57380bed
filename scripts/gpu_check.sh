#!/usr/bin/env bash
# The one command for the GPU machine: configure and build (Release, CUDA on, deps from the
# carried .deps/), run the whole ctest suite, compute-sanitizer memcheck and racecheck on the
# CUDA tests, the CUDA step timing, the CLI on the CUDA backend, the side-by-side comparison with
# torch (bench/compare_torch.py) and the golden-fingerprint recording of the conformance suite.
# Logs go to $OUT (or gpu-check-out/), a short table is printed last. The device tool brings back
# at most 8 files from $OUT, so choose phases accordingly.
#
#   scripts/gpu_check.sh [all|build|test|sanitize|time|cli|compare|golden]...   (default: all but
#   compare and golden, which write files meant to be committed)
#
# Each phase has its own time limit so that one call finishes well inside the device tool's
# 10 minutes; a phase that runs out is reported as TIMEOUT in the table.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
BUILD=${BUILD:-$ROOT/build-gpu}
# BUILD_TARGETS (optional): ninja targets to build instead of everything; CTEST_ARGS: extra
# ctest arguments (e.g. -LE conformance when the golden phase runs the suite anyway).
DEPS=$ROOT/.deps
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=(all)
want() {
  local p
  for p in "${PHASES[@]}"; do
    { [ "$p" = "$1" ] || { [ "$p" = all ] && [ "$1" != compare ] && [ "$1" != golden ]; }; } && return 0
  done
  return 1
}

declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-10s %s' "$1" "$2")"); }
status_of() { case $1 in 0) echo ok ;; 124|137) echo TIMEOUT ;; *) echo "FAILED (rc $1)" ;; esac; }

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
      -DRENAISSANCE_DEPS_DIR="$DEPS" -DCMAKE_PREFIX_PATH="$DEPS" &&
      timeout 240 ninja -C "$BUILD" -j"$(nproc)" ${BUILD_TARGETS:-}
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
  timeout 240 ctest --test-dir "$BUILD" --output-on-failure --parallel 4 --timeout 200 ${CTEST_ARGS:-} > "$OUT/ctest.log" 2>&1
  rc=$?
  line=$(grep -E "tests passed|tests failed" "$OUT/ctest.log" | tail -1)
  note ctest "$(status_of $rc) in $((SECONDS - t0)) s: ${line:-no summary}"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Subprocess)" "$OUT/ctest.log" | head -20
  skipped=$(grep -cE "Test +#[0-9]+: .* +(\*\*\*)?Skipped" "$OUT/ctest.log")
  note skipped "$skipped ctest entries skipped (see ctest.log)"
fi

if want time; then
  t0=$SECONDS
  timeout 120 "$BUILD/bench/bench_step" --backend cuda --layouts resnet50,gpt2_small \
    --kinds adamw,sgd_momentum,lars --replays 200 > "$OUT/timing.log" 2>&1
  note timing "$(status_of $?) in $((SECONDS - t0)) s"
fi

if want cli; then
  t0=$SECONDS
  CLI="$BUILD/cli/renaissance"
  {
    echo "== renaissance replay --backend cuda, every case of testdata/replay"
    passed=0 failed=0
    for case in "$ROOT"/testdata/replay/*/; do
      if "$CLI" replay "$case" --backend cuda; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    done
    echo "replay on cuda: $passed passed, $failed failed"
    echo "== renaissance audit"
    "$CLI" audit
    echo "== renaissance run --backend cuda --json"
    "$CLI" run --backend cuda --steps 50 --json
    echo "== renaissance run --backend cuda --model gpt2_small --nan-at 3,7 --json"
    "$CLI" run --backend cuda --model gpt2_small --steps 50 --nan-at 3,7 --json
    echo "== renaissance run --backend cpu --threads 16 --nan-at 3,7 --model gpt2_small --steps 50 --json"
    "$CLI" run --backend cpu --threads 16 --model gpt2_small --steps 50 --nan-at 3,7 --json
  } > "$OUT/cli.log" 2>&1
  note cli "$(status_of $?) in $((SECONDS - t0)) s: $(grep -E 'passed, .* failed' "$OUT/cli.log" | tr '\n' ' ')"
fi

if want compare; then
  t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/compare_torch.py --build "$BUILD" --out "$OUT/RESULTS.md" \
    --plot "$OUT/results.png" --json-out "$OUT/compare.json" > "$OUT/compare.log" 2>&1
  note compare "$(status_of $?) in $((SECONDS - t0)) s"
fi

if want golden; then
  t0=$SECONDS
  timeout 380 scripts/record_golden.sh "$BUILD" > "$OUT/golden.log" 2>&1
  note golden "$(status_of $?) in $((SECONDS - t0)) s"
  cp audit/golden/fingerprints.json conformance/REPORT.md "$OUT/" 2>/dev/null
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
[ -f "$OUT/timing.log" ] && python3 - "$OUT/timing.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"{r['layout']:>11} {r['optimizer']:>13} check={str(r['check_finite']):5} {r['ms_per_step']:.4f} ms "
              f"floor {r['floor_ms']:.4f} ms  {100 * r['floor_ms'] / r['ms_per_step']:.0f}% of floor  "
              f"launches {r['launches_per_step']}")
PY
[ -f "$OUT/cli.log" ] && grep -E "^(ok|FAIL)|passed|MATCH|DIFFERS|agree" "$OUT/cli.log" | head -30
[ -f "$OUT/compare.log" ] && tail -n 5 "$OUT/compare.log"
printf '%s\n' "${SUMMARY[@]}"
