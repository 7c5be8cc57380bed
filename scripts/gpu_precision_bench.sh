#!/usr/bin/env bash
# Step time of the bf16/fp16 model copy on the GPU machine (issue 14) as a share of the
# same-traffic floor: bench_step --backend cuda for adamw on resnet50, bert_base, gpt2_small,
# check on and off, fp32 and {bf16, fp16} x {nearest, stochastic} with fp32 gradients, and bf16
# x {nearest, stochastic} with bf16 gradients (--grad-dtype model). "after" builds this tree.
# "before" (optional) builds a copy of this tree whose backend_cuda/ is replaced by the directory
# BEFORE_CUDA_DIR, e.g. the CUDA backend before the copy was fused into the update kernels:
#   mkdir before_backend_cuda && git archive c09f79b backend_cuda | tar -x --strip-components=1 -C before_backend_cuda
# in the repository root, before the tree is copied to the GPU machine. Without it, only "after".
# The bf16 model-dtype-gradient rows run twice more with --tensor-mask clear (the program
# renaissance.torch builds, whose update walks hyperparameter items: elementwise_items_kernel).
# Prints a table (the fastest of PRECISION_BENCH_ROUNDS rounds, default 2, the variants
# interleaved; % floor = floor / step time) and, per variant, layout, check, gradient dtype and
# mask, stochastic vs nearest. The bits are unchanged: scripts/gpu_precision.sh.
# BEFORE_CUDA_DIR may also be a whole source tree (it has a CMakeLists.txt), built as it is.
# PRECISION_BENCH_LAYOUTS (default resnet50,bert_base,gpt2_small) picks the layouts.
#   scripts/gpu_precision_bench.sh [BEFORE_CUDA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
before_dir="${1:-before_backend_cuda}"
deps=()
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$root/.deps" -DCMAKE_PREFIX_PATH="$root/.deps")
  export LD_LIBRARY_PATH="$root/.deps/lib:$root/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
build() {  # build SRC DIR: bench_step with CUDA
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_BUILD_TESTS=OFF "${deps[@]}" >/dev/null
  cmake --build "$2" --target bench_step --parallel "$(nproc)" >/dev/null
}
variants=(after)
# PRECISION_BENCH_BUILD: an existing CUDA build of this tree to take bench_step from.
after_build="${PRECISION_BENCH_BUILD:-$root/build-gpu-precision-bench}"
if [ -n "${PRECISION_BENCH_BUILD:-}" ]; then
  cmake --build "$after_build" --target bench_step --parallel "$(nproc)" >/dev/null
else
  build "$root" "$after_build"
fi
if [ -d "$before_dir" ]; then
  src=/tmp/rn-precision-before
  rm -rf "$src" && mkdir -p "$src"
  if [ -f "$before_dir/CMakeLists.txt" ]; then
    # A whole source tree (e.g. `git archive c09f79b | tar -x -C before_tree`): the CUDA backend
    # alone does not build against a core whose graph structures changed with it.
    cp -r "$before_dir/." "$src/"
  else
    tar --exclude='./build*' --exclude='./.git' --exclude="./$(basename "$before_dir")" -cf - . | tar -xf - -C "$src"
    rm -rf "$src/backend_cuda" && cp -r "$before_dir" "$src/backend_cuda"
  fi
  build "$src" "$src/build"
  variants=(before after)
else
  echo "(no $before_dir: measuring the current tree only)"
fi
out="${PRECISION_BENCH_OUT:-$after_build/precision-bench.jsonl}"  # one JSON row per measurement
: > "$out"
layouts="${PRECISION_BENCH_LAYOUTS:-resnet50,bert_base,gpt2_small}"
for round in $(seq "${PRECISION_BENCH_ROUNDS:-2}"); do
  for v in "${variants[@]}"; do
    bin="$after_build/bench/bench_step"
    [ "$v" = before ] && bin=/tmp/rn-precision-before/build/bench/bench_step
    for p in "fp32" "bf16" "bf16 --stochastic-rounding" "fp16" "fp16 --stochastic-rounding" \
             "bf16 --grad-dtype model" "bf16 --stochastic-rounding --grad-dtype model" \
             "bf16 --grad-dtype model --tensor-mask clear" "bf16 --stochastic-rounding --grad-dtype model --tensor-mask clear"; do
      # shellcheck disable=SC2086
      "$bin" --backend cuda --layouts "$layouts" --kinds adamw --replays 200 --timing enqueued \
        --precision $p | sed "s/^{/{\"variant\":\"$v\",\"round\":$round,/" >> "$out"
    done
  done
done
python3 - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best, floor = {}, {}
for r in rows:  # the faster of the two rounds of each configuration
    k = (r["layout"], r["check_finite"], r.get("grad_dtype", "fp32") + ("+mask" if r.get("tensor_mask", "none") != "none" else ""),
         r["precision"], r["rounding"])
    best[k + (r["variant"],)] = min(best.get(k + (r["variant"],), 1e9), r["ms_per_step"])
    if r["variant"] == "after":
        floor[k] = r["floor_ms"]
print(f'{"layout":11} {"check":5} {"grads":10} {"copy":15} {"before ms":>9} {"after ms":>9} {"floor ms":>9} '
      f'{"% before":>8} {"% after":>8}')
for k in sorted(floor):
    b, a, f = best.get(k + ("before",)), best[k + ("after",)], floor[k]
    pb = "-" if b is None else f"{100 * f / b:.1f}%"
    print(f'{k[0]:11} {str(k[1]):5} {k[2]:10} {k[3] + " " + k[4]:15} {"-" if b is None else round(b, 4)!s:>9} '
          f'{a:9.4f} {f:9.4f} {pb:>8} {100 * f / a:7.1f}%')
print("\nstochastic vs nearest (step-time ratio, target <= 1.03):")
for k in sorted(floor):
    if k[4] != "stochastic":
        continue
    cells = []
    for v in ("before", "after"):
        near, sr = best.get(k[:4] + ("nearest", v)), best.get(k + (v,))
        if near and sr:
            cells.append(f"{v} {sr / near:.3f}")
    print(f'  {k[0]:11} check={str(k[1]):5} grads={k[2]:10} {k[3]}: {", ".join(cells)}')
EOF
echo "PRECISION BENCH DONE ($out)"
