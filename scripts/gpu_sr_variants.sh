#!/usr/bin/env bash
# Which CUDA build of the stochastic-rounding update kernel to make the default (issue 14): the
# variants of backend_cuda/model_copy.cuh's SrVariant, picked per process by
# $RENAISSANCE_CUDA_SR_VARIANT, against nearest rounding. On the GPU machine:
#  1. builds bench_step and renaissance_cli with CUDA (tests off; deps from .deps if present);
#  2. bits: `renaissance run` fingerprints (adamw, 3 steps with a NaN step; bf16 stochastic on
#     resnet50, and bf16 stochastic and fp16 stochastic with fp16 gradients on a layout whose
#     tensors start off multiples of 4) under every variant must equal the CPU's; any difference
#     fails the script (SR VARIANTS FAIL), as does an unknown variant name being accepted;
#  3. speed: 3 interleaved rounds of bench_step --backend cuda --kinds adamw for nearest and each
#     variant, x {fp32, bf16} gradients, check on and off, on resnet50, bert_base, gpt2_small;
#  4. prints a table last: median ms per configuration and the ratio to nearest (target <= 1.03),
#     after checking that each row's backend names the variant it timed.
# SR_VARIANTS="default early" / SR_ROUNDS=2 narrow the run when device time is short.
# SR_TESTS=1 also builds renaissance_tests and runs the CUDA stochastic precision cells under each
# variant (several minutes of build: off by default). Ends with SR VARIANTS DONE.
#   scripts/gpu_sr_variants.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
# The build dir of scripts/gpu_precision_bench.sh (same options): on a warm machine that ran it,
# only what changed is rebuilt.
build="${1:-build-gpu-precision-bench}"
read -ra variants <<< "${SR_VARIANTS:-default bounds early cold_bounds}"
deps=()
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$root/.deps" -DCMAKE_PREFIX_PATH="$root/.deps")
  export LD_LIBRARY_PATH="$root/.deps/lib:$root/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
tests=OFF targets=(bench_step renaissance_cli)
if [ "${SR_TESTS:-0}" = 1 ]; then tests=ON targets+=(renaissance_tests); fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_BUILD_TESTS=$tests \
  "${deps[@]}" >/dev/null
cmake --build "$build" --target "${targets[@]}" --parallel "$(nproc)" >/dev/null
echo "built in ${SECONDS}s"
cli="$build/cli/renaissance" bench="$build/bench/bench_step"

# --- bits -------------------------------------------------------------------------------------
# Tensors of 7, 13, 1021, ... elements: quads that meet tensor boundaries (element by element)
# and tensors whose Philox block grid is shifted against the arena's (two blocks per quad).
odd="$build/sr_odd_layout.json"
cat > "$odd" <<'EOF'
{"name": "sr_odd", "params": [
 {"name": "a.weight", "shape": [7], "role": "bn_weight"},
 {"name": "b.weight", "shape": [13, 1021], "role": "deep_conv"},
 {"name": "c.bias", "shape": [5], "role": "fc_bias"},
 {"name": "d.weight", "shape": [301, 67], "role": "fc_weight"},
 {"name": "e.weight", "shape": [3, 3, 3, 11], "role": "first_conv"}
]}
EOF
# The fingerprint of a run, and on CUDA the variant its backend says it built ("-" for none).
fp() {
  "$cli" run "$@" --json | python3 -c 'import json,re,sys; j=json.load(sys.stdin)
m=re.search(r"sr_variant=(\w+)", j["backend_description"]); print(j["fingerprint"], m.group(1) if m else "-")'
}
bad=0 checked=0
# resnet50 at scale; the odd layout for the boundary and shifted-block paths, with both copy
# formats and both gradient readers.
for case in "resnet50|bf16 --stochastic-rounding" "$odd|bf16 --stochastic-rounding" \
            "$odd|fp16 --stochastic-rounding --grad-dtype model"; do
  model=${case%%|*} p=${case#*|}
  # shellcheck disable=SC2206
  args=(--model "$model" --optimizer adamw --steps 3 --nan-at 1 --precision $p)
  want=$(fp "${args[@]}" --backend cpu)
  want=${want% -}
  line="$(basename "$model") adamw $p: cpu $want"
  for v in "${variants[@]}"; do
    got=$(RENAISSANCE_CUDA_SR_VARIANT=$v fp "${args[@]}" --backend cuda)
    named=${got##* } got=${got% *}
    checked=$((checked + 1))
    if [ "$got" != "$want" ]; then line+=" | $v DIFFERS $got"; bad=1; fi
    if [ "$named" != "$([ "$v" = default ] && echo - || echo "$v")" ]; then line+=" | $v ran as $named"; bad=1; fi
  done
  echo "$line"
done
# A misspelt variant must fail rather than measure the default.
if RENAISSANCE_CUDA_SR_VARIANT=nonsense "$cli" run --model "$odd" --optimizer adamw --steps 1 --backend cuda \
     --precision bf16 --stochastic-rounding --json >/dev/null 2>&1; then
  echo "an unknown RENAISSANCE_CUDA_SR_VARIANT was accepted"; bad=1
fi
[ "$bad" = 0 ] || { echo "SR VARIANTS FAIL: a variant changed the bits"; exit 1; }
echo "bits: $checked cuda fingerprints under ${#variants[@]} variants equal the cpu's (${SECONDS}s)"

if [ "$tests" = ON ]; then
  for v in "${variants[@]}"; do
    log="$build/sr-tests-$v.log"
    RENAISSANCE_CUDA_SR_VARIANT=$v "$build/tests/renaissance_tests" --gtest_filter='*MixedPrecision*stochastic_cuda:-*HighwayTargets*' \
      >"$log" 2>&1 || { tail -20 "$log"; echo "SR VARIANTS FAIL: tests under $v"; exit 1; }
    if grep -q '^\[  SKIPPED \].*_cuda' "$log"; then echo "SR VARIANTS FAIL: CUDA cells skipped"; exit 1; fi
    ok=$(grep -c '^\[       OK \].*_cuda' "$log" || true)
    [ "$ok" -gt 0 ] || { echo "SR VARIANTS FAIL: no CUDA stochastic cell ran under $v"; exit 1; }
    echo "tests under $v: $ok CUDA stochastic cells passed"
  done
fi

# --- speed ------------------------------------------------------------------------------------
out="$build/sr-variants.jsonl"
: > "$out"
for round in $(seq 1 "${SR_ROUNDS:-3}"); do
  for grads in fp32 model; do
    for v in nearest "${variants[@]}"; do
      sr=--stochastic-rounding
      [ "$v" = nearest ] && sr=
      # shellcheck disable=SC2086
      RENAISSANCE_CUDA_SR_VARIANT=$([ "$v" = nearest ] && echo default || echo "$v") \
        "$bench" --backend cuda --kinds adamw --layouts resnet50,bert_base,gpt2_small --timing enqueued \
        --replays 200 --precision bf16 $sr --grad-dtype $grads |
        sed "s/^{/{\"variant\":\"$v\",\"round\":$round,/" >> "$out"
    done
  done
  echo "round $round done (${SECONDS}s)"
done
python3 - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ms, floor, variants = {}, {}, []
for r in rows:
    named = "sr_variant=" in r["backend"]
    want = r["variant"] not in ("nearest", "default")
    if named != want or (want and "sr_variant=" + r["variant"] not in r["backend"]):
        sys.exit(f'SR VARIANTS FAIL: a {r["variant"]} row ran on {r["backend"]}')
    k = (r["layout"], r["check_finite"], r["grad_dtype"])
    ms.setdefault(k + (r["variant"],), []).append(r["ms_per_step"])
    floor[k] = r["floor_ms"]
    if r["variant"] not in variants:
        variants.append(r["variant"])
med = {k: statistics.median(v) for k, v in ms.items()}
print(f"\nmedian ms per step over {max(r['round'] for r in rows)} rounds (bf16 copy, adamw); x = ratio to nearest (target <= 1.03)")
print(f'{"layout":11} {"check":5} {"grads":5} {"floor":>7}' + "".join(f' {v:>20}' for v in variants))
worst = {v: 0.0 for v in variants}
for k in sorted(floor):
    near = med.get(k + ("nearest",))
    cells = []
    for v in variants:
        m = med.get(k + (v,))
        if m is None or near is None:
            cells.append(f'{"-":>20}')
            continue
        worst[v] = max(worst[v], m / near)
        cells.append(f'{m:10.4f} x{m / near:.3f}'.rjust(20))
    print(f'{k[0]:11} {str(k[1]):5} {k[2]:5} {floor[k]:7.4f}' + "".join(cells))
print("worst ratio to nearest: " + ", ".join(f"{v} {worst[v]:.3f}" for v in variants if v != "nearest"))
EOF
echo "SR VARIANTS DONE (${SECONDS}s; rows in $out)"
