#!/usr/bin/env bash
# ASan + UBSan run of the whole CPU test suite, as CI runs it: configures a separate
# build folder with the sanitizers on (CUDA and benchmarks off), builds everything, runs every
# ctest test, and exits non-zero on any failing test or any sanitizer report, including reports
# from child processes that no test looked at (the checkpoint tests fork and exec themselves).
#
#   scripts/sanitize.sh [BUILD_DIR]        (default: build-sanitize)
#
# The CPU kernels are built for this machine's SIMD target and the baseline only
# (RENAISSANCE_SIMD_TARGETS=native, ~3x faster to build under the sanitizers); every target
# computes the same bits and the unsanitized build tests them all. SANITIZE_SIMD_TARGETS=attainable
# builds every target.
# SANITIZE_JOBS sets the build and ctest parallelism (default: all cores). SANITIZE_CTEST_ARGS
# adds ctest arguments, e.g. SANITIZE_CTEST_ARGS="-E conformance_big" where a CI job cannot
# afford the biggest conformance tier, which runs several times slower under ASan.
#
# The top-level CMakeLists.txt is left alone: the flags go in through CMAKE_CXX_FLAGS and the
# linker flags, so every object of the library, the tests and the CLI is instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-sanitize}"
jobs="${SANITIZE_JOBS:-$(nproc)}"
# OpenMP's passive waits under ctest's oversubscription, as scripts/test.sh says why.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

# -O1 keeps the suite fast enough and the stacks readable; -fno-sanitize-recover makes every
# UBSan finding fatal (by default UBSan prints and carries on).
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# MPI off: the mpirun tests run in the normal build (scripts/test.sh); the sharded step's code
# runs here through its one-rank tests (ShardedStep.*, ShardLayout.*).
source scripts/sanitized_build.sh
configure_sanitized "$build" "$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" \
  -DCMAKE_SHARED_LINKER_FLAGS="$san" \
  -DRENAISSANCE_MPI=OFF \
  -DRENAISSANCE_SIMD_TARGETS="${SANITIZE_SIMD_TARGETS:-native}"

# Reports go to files as well as failing the process, so a report from a process whose exit
# status nobody checks is still found below.
logs="$(cd "$build" && pwd)/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"

# detect_leaks=1: LeakSanitizer stays on (the soak test relies on it). halt_on_error=1 and
# -fno-sanitize-recover: the first finding ends the process with a non-zero status.
# OpenMP (libgomp) is not instrumented; its worker threads are joined at exit and hold no
# leaked memory, so no suppressions are needed.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0:exitcode=86:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=$logs/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1:exitcode=87:log_path=$logs/ubsan"
export LSAN_OPTIONS="exitcode=88"

# The build runs the test binary once (gtest test discovery), so it runs with the options above.
cmake --build "$build" --parallel "$jobs"

status=0
# shellcheck disable=SC2086  # SANITIZE_CTEST_ARGS is a list of arguments
ctest --test-dir "$build" --output-on-failure --parallel "$jobs" --timeout 1500 ${SANITIZE_CTEST_ARGS:-} || status=$?

shopt -s nullglob
reports=("$logs"/*)
if ((${#reports[@]} > 0)); then
  echo "sanitize.sh: ${#reports[@]} sanitizer report file(s):" >&2
  for r in "${reports[@]}"; do
    echo "==== $r" >&2
    cat "$r" >&2
  done
  status=1
fi
if ((status != 0)); then
  echo "sanitize.sh: FAILED (ctest status or sanitizer reports above)" >&2
  exit "$status"
fi
echo "sanitize.sh: ASan + UBSan + LeakSanitizer: whole suite passed, no reports"
