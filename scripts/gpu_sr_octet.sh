#!/usr/bin/env bash
# Stochastic rounding with one Philox call per 8 elements (issue 14, speed; docs/math.md "The
# random draw"), on the GPU machine in one call: builds bench_step and renaissance_cli with CUDA,
# checks that CUDA gives the CPU's fingerprint for bf16 and fp16 stochastic rounding on resnet50
# and on an odd layout (tensors of 7, 13x1021, 5 and 301x67 elements: octets shifted against the
# tensors' 8-element blocks, octets across tensor boundaries, LARS/LAMB tile heads and tails),
# then times adamw nearest vs stochastic in 3 interleaved rounds (bf16, fp32 and model-dtype
# gradients) and prints the table last: median ms and the ratio stochastic / nearest (target
# <= 1.03), plus the CPU at 2 threads against its same-traffic limit.
# Success: "FINGERPRINTS OK" and every CUDA ratio <= 1.03 in the last table.
#   scripts/gpu_sr_octet.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
build="${1:-build-gpu-sr-octet}"
deps=()
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$root/.deps" -DCMAKE_PREFIX_PATH="$root/.deps")
  export LD_LIBRARY_PATH="$root/.deps/lib:$root/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_BUILD_TESTS=OFF \
  "${deps[@]}" >/dev/null
cmake --build "$build" --target bench_step renaissance_cli --parallel "$(nproc)" >/dev/null
cli="$build/cli/renaissance"
bench="$build/bench/bench_step"

odd="$build/sr_octet_layout.json"
cat > "$odd" <<'EOF'
{"name": "sr_octet_odd", "params": [
 {"name": "a.bias", "shape": [7], "role": "fc_bias"},
 {"name": "b.weight", "shape": [13, 1021], "role": "deep_conv"},
 {"name": "c.weight", "shape": [5], "role": "bn_weight"},
 {"name": "d.weight", "shape": [301, 67], "role": "fc_weight"}
]}
EOF

fp() {  # fp BACKEND ARGS...: the fingerprint of a 4-step run with a skipped step
  "$cli" run --steps 4 --nan-at 1 --backend "$@" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])'
}
bad=0
same() {  # same LABEL ARGS...: the CPU and CUDA fingerprints of one run must be equal
  local label=$1; shift
  local cpu gpu ok=ok
  cpu=$(fp cpu "$@")
  gpu=$(fp cuda "$@")
  [ "$cpu" = "$gpu" ] || { ok=DIFFER; bad=1; }
  echo "$label: cpu $cpu cuda $gpu $ok"
}
for kind in adamw lars lamb; do
  for p in bf16 fp16; do
    same "resnet50 $kind $p stochastic" --model resnet50 --optimizer "$kind" --precision "$p" --stochastic-rounding
  done
done
same "resnet50 adamw bf16 stochastic grads model" --model resnet50 --optimizer adamw --precision bf16 \
  --stochastic-rounding --grad-dtype model
for kind in adamw lars lamb lion sgd_momentum; do
  for p in bf16 fp16; do
    for g in fp32 model; do
      same "odd $kind $p stochastic grads $g" --model "$odd" --optimizer "$kind" --precision "$p" --stochastic-rounding \
        --grad-dtype "$g"
    done
  done
done
# Sharded (docs/distributed.md, "The model copy"): cuts inside 8-element Philox blocks.
for kind in adamw lars lamb; do
  for k in 2 3; do
    same "odd $kind bf16 stochastic --simulate-ranks $k" --model "$odd" --optimizer "$kind" --precision bf16 \
      --stochastic-rounding --simulate-ranks "$k"
  done
done
[ "$bad" = 0 ] && echo "FINGERPRINTS OK" || echo "FINGERPRINTS DIFFER (see above)"

out="$build/sr-octet-bench.jsonl"
: > "$out"
for round in 1 2 3; do
  for g in fp32 model; do
    for sr in "" "--stochastic-rounding"; do
      # shellcheck disable=SC2086
      "$bench" --backend cuda --kinds adamw --layouts resnet50,bert_base,gpt2_small --timing enqueued --replays 100 \
        --check on --precision bf16 $sr --grad-dtype "$g" | sed "s/^{/{\"be\":\"cuda\",\"round\":$round,/" >> "$out"
    done
  done
  for sr in "" "--stochastic-rounding"; do
    # shellcheck disable=SC2086
    "$bench" --backend cpu --threads 2 --kinds adamw --layouts resnet50 --timing enqueued --replays 5 --warmup 1 \
      --check on --precision bf16 $sr | sed "s/^{/{\"be\":\"cpu\",\"round\":$round,/" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms, lim = {}, {}
for r in rows:
    k = (r["be"], r["layout"], r["grad_dtype"])
    ms.setdefault(k + (r["rounding"],), []).append(r["ms_per_step"])
    lim.setdefault(k + (r["rounding"],), []).append(r["share_of_limit"])
print(f'\n{"backend":7} {"layout":11} {"grads":5} {"nearest ms":>10} {"stoch ms":>9} {"ratio":>6} '
      f'{"near %lim":>9} {"stoch %lim":>10}')
for k in sorted({k[:3] for k in ms}):
    n, s = ms.get(k + ("nearest",)), ms.get(k + ("stochastic",))
    if not n or not s:
        continue
    mn, mx = statistics.median(n), statistics.median(s)
    ln, ls = statistics.median(lim[k + ("nearest",)]), statistics.median(lim[k + ("stochastic",)])
    flag = "" if k[0] == "cpu" or mx / mn <= 1.03 else "  > 1.03"
    print(f'{k[0]:7} {k[1]:11} {k[2]:5} {mn:10.4f} {mx:9.4f} {mx / mn:6.3f} {100 * ln:8.1f}% {100 * ls:9.1f}%{flag}')
PY
