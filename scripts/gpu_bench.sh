#!/usr/bin/env bash
# The fair side-by-side benchmark on the GPU machine (issue #17), one command: builds what it
# needs (Release, CUDA on, deps from the carried .deps/ as scripts/gpu_check.sh does), checks the
# torch LARS against the float64 replay cases, runs bench/compare_torch.py (both timing methods,
# resnet50, bert_base, gpt2_small, every kind; the CPU rows at 2 and all cores) and prints a short
# table last. Writes under $OUT (default ./gpu-out): build.log, lars_check.log, compare.json,
# compare.log, RESULTS.md, results.png. It does not touch bench/RESULTS.md: the lead renders that
# from compare.json (python3 bench/compare_torch.py --from-json gpu-out/compare.json).
#
#   OUT=/some/dir scripts/gpu_bench.sh        (about 6-8 minutes on an H200 with 16 cores)
#
# Time budget (9 minutes in all): build 150 s at most, the LARS check 30 s, the comparison 340 s
# (every kind of the table plus adamw+clip; lion and lamb against timm's Lion/Lamb, clipping
# against clip_grad_norm_ + fused AdamW, each uncaptured and captured). The replays are set for
# that: 100 steps per configuration and method where a step takes well under a millisecond, 20
# for torch's uncaptured paths; on the CPU 5, against torch's foreach and fused paths (its
# for-loop there costs half a minute and decides nothing). The JSON is written after every row,
# so a run cut short still renders what it measured.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
BUILD=${BUILD:-$ROOT/build-gpu-bench}
DEPS=$ROOT/.deps
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
PYTHON=${PYTHON:-python3}
declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-10s %s' "$1" "$2")"); }
status_of() { case $1 in 0) echo ok ;; 124|137) echo TIMEOUT ;; *) echo "FAILED (rc $1)" ;; esac; }

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
} > "$OUT/env.log" 2>&1

t0=$SECONDS
{
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON \
    -DRENAISSANCE_DEPS_DIR="$DEPS" -DCMAKE_PREFIX_PATH="$DEPS" &&
    timeout 150 ninja -C "$BUILD" -j"$(nproc)" bench_step renaissance_cli
} > "$OUT/build.log" 2>&1
rc=$?
note build "$(status_of $rc) in $((SECONDS - t0)) s"
if [ $rc -ne 0 ]; then
  grep -E "error|Error|FAILED" "$OUT/build.log" | head -30
  printf '%s\n' "${SUMMARY[@]}"
  exit 1
fi

t0=$SECONDS
timeout 30 "$PYTHON" bench/check_torch_lars.py > "$OUT/lars_check.log" 2>&1
note lars-check "$(status_of $?) in $((SECONDS - t0)) s: $(tr '\n' ' ' < "$OUT/lars_check.log" | cut -c1-160)"

t0=$SECONDS
PYTHONUNBUFFERED=1 timeout 340 "$PYTHON" bench/compare_torch.py --build "$BUILD" \
  --layouts resnet50,bert_base,gpt2_small --replays 100 --slow-replays 20 --cpu-replays 5 --cpu-impls foreach,fused \
  --json-out "$OUT/compare.json" --out "$OUT/RESULTS.md" --plot "$OUT/results.png" > "$OUT/compare.log" 2>&1
rc=$?
note compare "$(status_of $rc) in $((SECONDS - t0)) s ($(grep -c '^{' "$OUT/compare.log") rows; json after every row)"
if [ $rc -ne 0 ] && [ -s "$OUT/compare.json" ]; then
  # A run cut short still renders what it measured.
  "$PYTHON" bench/compare_torch.py --from-json "$OUT/compare.json" --out "$OUT/RESULTS.md" --plot "$OUT/results.png" \
    >> "$OUT/compare.log" 2>&1
fi

echo
echo "== gpu_bench on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), files in $OUT =="
[ -s "$OUT/compare.json" ] && "$PYTHON" - "$OUT/compare.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def best(paths, m):
    v = [(x[m], k) for k, x in paths.items() if x and x.get(m) is not None]
    return min(v) if v else (None, None)
f = lambda x: "   n/a" if x is None else f"{x:6.3f}"
print(f"{'layout':>10} {'kind':>13} | enqueued ms: ours-on torch-chk  ours-off torch  %floor on/off | synced: ours-off torch")
for g in r["gpu"]:
    on, off = g["ours_checked"].get("enqueued"), g["ours"].get("enqueued")
    tc, t = best(g["torch_checked"], "enqueued")[0], best(g["torch"], "enqueued")[0]
    p = lambda fl, ms: f"{100 * fl / ms:4.0f}%" if fl and ms else "  n/a"
    pct = f"{p(g.get('floor_checked'), on)}/{p(g['floor'], off)}"
    print(f"{g['layout']:>10} {g['kind']:>13} | {f(on)} {f(tc)}   {f(off)} {f(t)} {pct} | "
          f"{f(g['ours'].get('synced'))} {f(best(g['torch'], 'synced')[0])}")
for c in r["cpu"]:
    print(f"cpu {c['threads']:>2} thr {c['layout']:>10} {c['kind']:>13}: ours {f(c['ours'])} ms, torch fused {f(c['torch'].get('fused'))} ms")
PY
tail -n 3 "$OUT/compare.log"
printf '%s\n' "${SUMMARY[@]}"
