#!/usr/bin/env bash
# The norm kinds' micro-benchmark on the GPU machine: % of the floor of LARS,
# LARS-Nesterov and LAMB (AdamW beside them as the element-wise reference) on resnet50, bert_base
# and gpt2_small, check on and off, from bench_step (enqueued timing; floor = the kind's ideal
# bytes / the same-traffic limit measured in the same run over the task's own arena).
#
#   scripts/norm_bench.sh            (about 30 s once built; builds bench_step first if needed)
#   BUILD=build-gpu-bench KINDS=lars,lamb LAYOUTS=gpt2_small REPLAYS=100 scripts/norm_bench.sh
#
# Targets: lars, lars_nesterov >= 95 %, lamb >= 90 % of the floor.
set -eu -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build-gpu-bench}
DEPS=$ROOT/.deps
KINDS=${KINDS:-lars,lars_nesterov,lamb,adamw}
LAYOUTS=${LAYOUTS:-resnet50,bert_base,gpt2_small}
REPLAYS=${REPLAYS:-50}
BACKEND=${BACKEND:-cuda}  # cpu: to try the script without a GPU
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
if [ ! -x "$BUILD/bench/bench_step" ] || [ -n "${REBUILD:-}" ]; then
  deps=()
  [ -d "$DEPS" ] && deps=(-DRENAISSANCE_DEPS_DIR="$DEPS" -DCMAKE_PREFIX_PATH="$DEPS")
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON "${deps[@]}" > /dev/null
fi
TABLE=$(cat <<'PY'
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
cell = {(r["layout"], r["optimizer"], r["check_finite"]): r for r in rows}
print(rows[0]["backend"] if rows else "no rows")
print("%11s %14s | %12s %7s %7s | %12s %7s %7s | %s" % ("layout", "kind", "check on: ms", "floor", "%floor",
                                                          "check off: ms", "floor", "%floor", "limit GB/s"))
def part(r):
    if r is None:
        return "%29s" % ""
    return "%12.4f %7.4f %6.1f%%" % (r["ms_per_step"], r["floor_ms"], 100 * r["floor_ms"] / r["ms_per_step"])
for (layout, kind, on), r in cell.items():
    if on:
        print("%11s %14s | %s | %s | %.0f" % (layout, kind, part(r), part(cell.get((layout, kind, False))),
                                              r["limit_gb_per_s"]))
PY
)
# Always bring bench_step up to date with the tree (a no-op when nothing changed).
ninja -C "$BUILD" -j"$(nproc)" bench_step > /dev/null
"$BUILD/bench/bench_step" --backend "$BACKEND" --layouts "$LAYOUTS" --kinds "$KINDS" --check both \
  --timing enqueued --replays "$REPLAYS" | python3 -c "$TABLE"
