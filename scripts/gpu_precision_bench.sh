#!/usr/bin/env bash
# Step time of the bf16/fp16 model copy on the GPU machine (issue 14), before and after the CUDA
# copy kernel drew one Philox block per four elements (commit 0210e1e): bench_step --backend cuda
# for adamw on resnet50, bert_base, gpt2_small with the check on and off, fp32 and
# {bf16, fp16} x {nearest, stochastic}. "after" builds this tree; "before" builds a copy of it
# whose backend_cuda/kernels_model_copy.cu is replaced by BEFORE_KERNEL (the file at 0210e1e~1:
#   git show 0210e1e~1:backend_cuda/kernels_model_copy.cu > before_kernels_model_copy.cu
# in the repository root, before the tree is copied to the GPU machine). Without it, only "after".
# Prints one line per configuration and a table; the bits are unchanged (scripts/gpu_precision.sh).
#   scripts/gpu_precision_bench.sh [BEFORE_KERNEL]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
before_kernel="${1:-before_kernels_model_copy.cu}"
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
build "$root" "$root/build-gpu-precision-bench"
if [ -f "$before_kernel" ]; then
  src=/tmp/rn-precision-before
  rm -rf "$src" && mkdir -p "$src"
  tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C "$src"
  cp "$before_kernel" "$src/backend_cuda/kernels_model_copy.cu"
  build "$src" "$src/build"
  variants=(before after)
else
  echo "(no $before_kernel: measuring the current kernel only)"
fi
out="$root/build-gpu-precision-bench/precision-bench.jsonl"
: > "$out"
for round in 1 2; do
  for v in "${variants[@]}"; do
    bin="$root/build-gpu-precision-bench/bench/bench_step"
    [ "$v" = before ] && bin=/tmp/rn-precision-before/build/bench/bench_step
    for p in "fp32" "bf16" "fp16" "bf16 --stochastic-rounding" "fp16 --stochastic-rounding"; do
      # shellcheck disable=SC2086
      "$bin" --backend cuda --layouts resnet50,bert_base,gpt2_small --kinds adamw --replays 200 --timing enqueued \
        --precision $p | sed "s/^{/{\"variant\":\"$v\",\"round\":$round,/" >> "$out"
    done
  done
done
python3 - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = {}
for r in rows:  # the faster of the two rounds of each configuration
    k = (r["layout"], r["check_finite"], r["precision"], r["rounding"], r["variant"])
    best[k] = min(best.get(k, 1e9), r["ms_per_step"])
    best[k + ("floor",)] = r["floor_ms"]
print(f'{"layout":11} {"check":5} {"precision":17} {"before ms":>9} {"after ms":>9} {"floor ms":>9} {"% floor":>8}')
for k in sorted({k[:4] for k in best if len(k) == 5}):
    b, a, f = best.get(k + ("before",)), best.get(k + ("after",)), best.get(k + ("after", "floor"))
    print(f'{k[0]:11} {str(k[1]):5} {k[2] + " " + k[3]:17} {b if b is None else round(b, 4)!s:>9} {a:9.4f} {f:9.4f} {100 * f / a:7.1f}%')
EOF
echo "PRECISION BENCH DONE ($out)"
