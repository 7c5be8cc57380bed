#!/usr/bin/env bash
# The per-tensor mask's two programs on the GPU machine (issue 13; docs/design.md, "Two
# programs"): builds this tree with CUDA, runs the mask tests on the device (the CUDA variants:
# the unmasked program's bits against the masked program's, the switch to the second graph,
# LAMB's masked tiles against one-tensor tasks), then times bench_step for adamw with the check on
# (what renaissance.torch's Task runs) three ways: --tensor-mask none (no mask), clear (the mask,
# nothing masked: the unmasked program) and set (the masked program over a mask of zeros: what
# every renaissance.torch step cost before). Success: the tests pass with no CUDA case skipped,
# and clear is within noise (~1 %) of none while set is the slower one.
#   scripts/gpu_mask_programs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
deps=()
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$root/.deps" -DCMAKE_PREFIX_PATH="$root/.deps")
  export LD_LIBRARY_PATH="$root/.deps/lib:$root/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
build="$root/build-gpu-mask"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON "${deps[@]}" >/dev/null
cmake --build "$build" --target renaissance_tests bench_step --parallel "$(nproc)" >/dev/null
"$build/tests/renaissance_tests" --gtest_filter='*TensorMask*cuda*:TensorMask*'
for round in 1 2 3; do  # interleaved rounds: the three variants see the same machine
  for mask in none clear set; do
    "$build/bench/bench_step" --backend cuda --layouts resnet50,gpt2_small --kinds adamw --check on \
        --replays 200 --timing enqueued --tensor-mask "$mask" |
      python3 -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("round '"$round"'", r["layout"], "tensor_mask=" + r["tensor_mask"], "%.4f ms" % r["ms_per_step"],
          "%.1f %% of limit" % (100 * r["share_of_limit"]), "launches", r["launches_per_step"])'
  done
done
