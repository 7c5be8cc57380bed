#!/usr/bin/env bash
# torch comparisons on the GPU machine, one command (issues 14 and 13), at most 7 minutes:
#  1. bench/bench_torch_precision.py: AdamW with bf16 parameters and fp32 masters, torch's best
#     ways (fused AdamW on the masters + _foreach_copy_, one CUDA graph; with bf16 gradients
#     upcast first; with GradScaler's found_inf check; fused AdamW on bf16) against bench_step
#     --precision bf16 (--grad-dtype model|fp32, nearest and stochastic), resnet50, bert_base,
#     gpt2_small, the same timing (events, steps enqueued, medians), two rounds (JSON after each);
#  2. bench/bench_torch_step.py --phases --profile: the step inside a training step (its table),
#     then zero_grad / forward / backward / step of the whole iteration for torch fused
#     (set_to_none True and False) and renaissance.torch (its default zero_grad(): grads set to None,
#     copied in by step(); and set_to_none=False, zeroed in place),
#     interleaved, resnet50 (batch 32, then 64) and GPT-2 small, and the kernels that differ.
# One CMake build (Release, CUDA, deps from the carried .deps/ as scripts/gpu_bench.sh) makes both
# bench_step and the Python extension; the package is laid out in $BUILD/site from python/renaissance
# and the extension (what `pip install .` installs, without building the library a second time).
# Writes $OUT (default ./gpu-torchbench-out): build.log, precision.log, precision.json, step.log,
# step.json; prints short tables last.
#
#   scripts/gpu_torchbench.sh         (the lead, through the device tool with carry [".deps"])
#   TORCHBENCH_CUDA=OFF PYTHON=venv/bin/python scripts/gpu_torchbench.sh   (a dry run without a GPU:
#   CPU build, both scripts with --quick; PYTHON needs torch and nanobind)
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-torchbench-out}
BUILD=${BUILD:-$ROOT/build-gpu-torchbench}
DEPS=$ROOT/.deps
CUDA=${TORCHBENCH_CUDA:-ON}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
PY=$(command -v "${PYTHON:-python3}")
QUICK=()
[ "$CUDA" = ON ] || QUICK=(--quick)
declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-10s %s' "$1" "$2")"); }
status_of() { case $1 in 0) echo ok ;; 124|137) echo TIMEOUT ;; *) echo "FAILED (rc $1)" ;; esac; }
start=$SECONDS

t0=$SECONDS
{
  date -u
  git log -1 --oneline 2>/dev/null || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
  deps=()
  [ -d "$DEPS" ] && deps=(-DRENAISSANCE_DEPS_DIR="$DEPS" -DCMAKE_PREFIX_PATH="$DEPS")
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA="$CUDA" \
    -DRENAISSANCE_BUILD_PYTHON=ON -DRENAISSANCE_BUILD_BENCH=ON -DRENAISSANCE_BUILD_TESTS=OFF \
    -DRENAISSANCE_BUILD_CLI=OFF -DRENAISSANCE_BUILD_FUZZ=OFF -DRENAISSANCE_MPI=OFF \
    -DPython_EXECUTABLE="$PY" "${deps[@]}" &&
    timeout 170 cmake --build "$BUILD" --target bench_step _core --parallel "$(nproc)" &&
    rm -rf "$BUILD/site" && mkdir -p "$BUILD/site/renaissance" &&
    cp python/renaissance/*.py "$BUILD/site/renaissance/" &&
    cp "$BUILD"/python/_core*.so "$BUILD/site/renaissance/"
} > "$OUT/build.log" 2>&1
rc=$?
note build "$(status_of $rc) in $((SECONDS - t0)) s"
if [ $rc -ne 0 ]; then
  grep -E "error|Error|FAILED" "$OUT/build.log" | head -30
  printf '%s\n' "${SUMMARY[@]}"
  exit 1
fi
export PYTHONPATH="$BUILD/site"

t0=$SECONDS
PYTHONUNBUFFERED=1 timeout 100 "$PY" bench/bench_torch_precision.py --build "$BUILD" --rounds 2 --replays 100 \
  --layouts resnet50,bert_base,gpt2_small --json-out "$OUT/precision.json" "${QUICK[@]}" > "$OUT/precision.log" 2>&1
rc=$?
note precision "$(status_of $rc) in $((SECONDS - t0)) s"

t0=$SECONDS
# What is left of the 7 minutes (about 150 s needed: resnet50 and GPT-2 first; the JSON is written
# after each model, so a cut keeps them).
left=$((420 - (SECONDS - start) - 10))
PYTHONUNBUFFERED=1 timeout "$left" "$PY" bench/bench_torch_step.py --phases --profile --rounds 4 --phase-iters 10 \
  --phase-models resnet50,gpt2_small,resnet50:64 --json-out "$OUT/step.json" "${QUICK[@]}" > "$OUT/step.log" 2>&1
rc=$?
note step "$(status_of $rc) in $((SECONDS - t0)) s (limit $left s)"

echo
echo "== gpu_torchbench, files in $OUT =="
[ -s "$OUT/precision.json" ] && "$PY" bench/bench_torch_precision.py --from-json "$OUT/precision.json"
"$PY" - "$OUT/step.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit("step.json: %s" % e)
print("\nstep inside a training step (ms, medians):")
for x in r["results"]:
    print("  %-26s %-40s step %7.3f  iteration %8.3f" % (x["model"], x["optimizer"], x["step_ms"], x["iter_ms"]))
for ph in r["phases"]:
    print("\n%s: phases, device ms (medians) | host ms to enqueue the iteration" % ph["model"])
    for mode in ("enqueued", "synced"):
        base = None
        for name, v in ph["variants"].items():
            m = v[mode]
            base = base or m["iteration"]
            print("  %-8s %-32s zero %6.3f fwd %7.3f bwd %7.3f step %6.3f | iter %8.3f (%+5.2f %%) | host %8.3f" % (
                mode, name, m["zero_grad"], m["forward"], m["backward"], m["step"], m["iteration"],
                100 * (m["iteration"] / base - 1), m["host_iteration"]))
    if "profile_error" in ph:
        print("  profile FAILED: " + ph["profile_error"])
PY
printf '%s\n' "${SUMMARY[@]}"
echo "gpu_torchbench: $((SECONDS - start)) s in all"
