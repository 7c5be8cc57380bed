#!/usr/bin/env bash
# Issue 14's checks on the GPU machine, by phase, so that one device call (10 minutes at most)
# runs what fits and a second call on the still-warm machine reuses the build:
#   build   this tree with CUDA (tests, conformance suite, CLI, bench_step) into build-gpu14
#   test    the bitwise checks: every conformance cell of the small tier (each kind x precision x
#           rounding x gradient dtype, CPU == CUDA) against the golden fingerprints, and the CUDA
#           gtests of the model copy, mixed precision, model-dtype gradients, the tensor mask
#           and the gradient table (CPU == CUDA per cell), and the CPU scans and fused loop under
#           every Highway target of the host; fails on any failure or skipped CUDA cell
#   bench   the CUDA step A/B of scripts/gpu_precision_bench.sh (this tree against BEFORE_TREE)
#   cpu     the CPU step at 2 threads, this tree against BEFORE_TREE (bench/step_ab.py: resnet50
#           adamw, interleaved rounds): ms per step and the share of the same-traffic limit; then
#           this tree's bf16/fp16 rows at 2, 4, 8 and 16 threads (where stochastic rounding stops
#           being bound by its arithmetic). BEFORE_TREE's CPU build starts in the background
#           when the script starts, beside the CUDA build.
#   python  scripts/gpu_python.sh: the Python package built with CUDA and its tests on the device
# BEFORE_TREE (default before_tree): a whole source tree to compare with, e.g. in the repository
# root `mkdir before_tree && git archive main | tar -x -C before_tree` (git-ignored; carry it).
# Logs under $OUT (or gpu-issue14-out/); a short summary is printed last. BENCH_TIMEOUT and
# CPU_TIMEOUT (seconds, default 330 and 240) bound those phases.
#   scripts/gpu_issue14.sh build test bench cpu
set -u -o pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT=${OUT:-$root/gpu-issue14-out}
mkdir -p "$OUT"
build=$root/build-gpu14
before=${BEFORE_TREE:-before_tree}
deps=()
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$root/.deps" -DCMAKE_PREFIX_PATH="$root/.deps")
  export LD_LIBRARY_PATH="$root/.deps/lib:$root/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
declare -a summary
note() { summary+=("$(printf '%-6s %s' "$1" "$2")"); }
verdict() { [ "$1" -eq 0 ] && echo ok || echo "FAILED (rc $1)"; }
fail=0

# The CPU phase's BEFORE_TREE build does not wait for the phases before it (nvcc leaves cores idle).
before_bench=$before/build-cpu/bench/bench_step
before_build_pid=
if [[ " $* " == *" cpu "* && ! -x $before_bench ]]; then
  { cmake -S "$before" -B "$before/build-cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=OFF \
      -DRENAISSANCE_BUILD_TESTS=OFF "${deps[@]}" && cmake --build "$before/build-cpu" --parallel 4 --target bench_step
  } > "$OUT/cpu-build.log" 2>&1 &
  before_build_pid=$!
fi

for phase in "$@"; do
  t0=$SECONDS
  case $phase in
    build)
      { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON "${deps[@]}" &&
          cmake --build "$build" --parallel "$(nproc)" --target renaissance_tests conformance_suite renaissance_cli bench_step
      } > "$OUT/build.log" 2>&1
      rc=$?
      [ $rc -ne 0 ] && grep -E "error|FAILED" "$OUT/build.log" | head -20
      note build "$(verdict $rc) in $((SECONDS - t0)) s"
      [ $rc -ne 0 ] && fail=1 && break
      ;;
    test)
      "$build/conformance/conformance_suite" --gtest_filter='Golden.*:Small/*' > "$OUT/conformance.log" 2>&1
      rc=$?
      note conf "$(verdict $rc): $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/conformance.log" | head -2 | tr '\n' ' ')in $((SECONDS - t0)) s"
      [ $rc -ne 0 ] && fail=1
      t0=$SECONDS
      "$build/tests/renaissance_tests" \
        --gtest_filter='*ModelCopy*:*MixedPrecision*:*ModelDtype*:Precision*:*TensorMask*:*GradientTable*:GradTableLookup*:*CudaBackend*:*HyperGroup*:*WidenGrad*:*NonFinite*:FusedUpdate*' \
        > "$OUT/gtest.log" 2>&1
      rc=$?
      # A skipped CUDA cell means no device.
      grep -qiE '^\[  SKIPPED \].*cuda' "$OUT/gtest.log" && rc=1 && echo "FAIL: CUDA cells skipped"
      note gtest "$(verdict $rc): $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/gtest.log" | head -2 | tr '\n' ' ')in $((SECONDS - t0)) s"
      [ $rc -ne 0 ] && fail=1 && grep -E '^\[  FAILED  \]' "$OUT/gtest.log" | head -10
      ;;
    bench)
      # Rows land in $OUT as they are measured, so a phase cut by BENCH_TIMEOUT still brings them back.
      PRECISION_BENCH_BUILD=$build PRECISION_BENCH_OUT="$OUT/precision-bench.jsonl" \
        PRECISION_BENCH_ROUNDS=${PRECISION_BENCH_ROUNDS:-2} timeout "${BENCH_TIMEOUT:-330}" \
        bash scripts/gpu_precision_bench.sh "$before" > "$OUT/bench.log" 2>&1
      rc=$?
      note bench "$(verdict $rc) in $((SECONDS - t0)) s"
      [ $rc -ne 0 ] && fail=1
      ;;
    cpu)
      if [ -n "$before_build_pid" ] && ! wait "$before_build_pid"; then
        note cpu "FAILED: BEFORE_TREE's CPU build (cpu-build.log)"
        fail=1
        continue
      fi
      # bench/step_ab.py: the interleaved rounds, fastest and median ms and shares per build.
      timeout "${CPU_TIMEOUT:-240}" python3 bench/step_ab.py "$before_bench" "$build/bench/bench_step" \
        "${CPU_ROUNDS:-3}" adamw > "$OUT/cpu.txt" 2>> "$OUT/cpu-build.log"
      rc=$?
      # This tree alone by thread count: one JSON row per (threads, configuration, check).
      for threads in 2 4 8 16; do
        for p in "bf16" "bf16 --stochastic-rounding" "fp16" "fp16 --stochastic-rounding"; do
          # shellcheck disable=SC2086
          timeout 60 "$build/bench/bench_step" --backend cpu --threads $threads --layouts resnet50 --kinds adamw \
            --replays 10 --grad-dtype model --precision $p | grep '^{' >> "$OUT/cpu-threads.jsonl"
        done
      done
      note cpu "$(verdict $rc) in $((SECONDS - t0)) s"
      [ $rc -ne 0 ] && fail=1
      ;;
    python)
      OUT=$OUT/python bash scripts/gpu_python.sh > "$OUT/python.log" 2>&1
      rc=$?
      note python "$(verdict $rc): $(tail -1 "$OUT/python.log")"
      [ $rc -ne 0 ] && fail=1
      ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
done

[ -f "$OUT/bench.log" ] && sed -n '/^layout/,$p' "$OUT/bench.log"
[ -f "$OUT/cpu.txt" ] && { echo; echo "CPU, 2 threads, ${CPU_ROUNDS:-3} interleaved rounds (bench/step_ab.py):"; cat "$OUT/cpu.txt"; }
[ -f "$OUT/cpu-threads.jsonl" ] && { echo; echo "CPU by threads (this tree; ms per step, share of the same-traffic limit):"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print("{:24} {:5} {:10} check {:d} {:8.2f} ms {:6.3f}".format(r["backend"], r["precision"], r["rounding"], int(r["check_finite"]), r["ms_per_step"], r["share_of_limit"]))
' "$OUT/cpu-threads.jsonl"; }
echo
printf '%s\n' "${summary[@]}"
[ $fail -eq 0 ] && echo "gpu_issue14: all phases passed" || echo "gpu_issue14: FAILED"
exit $fail
