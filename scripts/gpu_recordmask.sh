#!/usr/bin/env bash
# GPU machine, issue 13 (replaying steps with None gradients): 1) every committed recorded case
# (testdata/recorded: CPU- and H200-recorded, among them torch_adamw_frozen_cpu with
# no_grad_per_step and per-tensor step counts) through `renaissance replay --backend cuda`: each
# must print MATCH, so the device's per-tensor mask gives the CPU's bits; 2) where the Python
# package with CUDA is installed (scripts/gpu_python.sh; PYTHONPATH=build-gpu-python/site), the
# same frozen-branch run recorded on the GPU (scripts/record_torch_case.py --device cuda
# --freeze-alternate) into $OUT/torch_adamw_frozen_h200 and replayed on the CPU backend: MATCH.
# Needs the CLI built with CUDA first (BUILD_TARGETS=renaissance_cli scripts/gpu_check.sh build).
#
#   scripts/gpu_recordmask.sh     (CLI=build-gpu/cli/renaissance by default; the last line sums up)
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-recordmask-out}
CLI=${CLI:-$ROOT/build-gpu/cli/renaissance}
PY=${PYTHON:-python3}
DEPS=$ROOT/.deps
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
mkdir -p "$OUT"
if [ ! -x "$CLI" ]; then
  echo "gpu_recordmask: no CLI at $CLI (build it: BUILD_TARGETS=renaissance_cli scripts/gpu_check.sh build)"
  exit 2
fi
passed=0
failed=0
for case in "$ROOT"/testdata/recorded/*/; do
  if "$CLI" replay "$case" --backend cuda; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
summary="recorded cases on cuda: $passed MATCH, $failed failed"
if "$PY" -c 'import renaissance, torch, sys; sys.exit(0 if renaissance.with_cuda and torch.cuda.is_available() else 1)' 2>/dev/null; then
  rm -rf "$OUT/torch_adamw_frozen_h200"
  if "$PY" scripts/record_torch_case.py --out "$OUT/torch_adamw_frozen_h200" --device cuda --freeze-alternate &&
     "$CLI" replay "$OUT/torch_adamw_frozen_h200" --backend cpu; then
    summary="$summary; frozen run recorded on cuda, replayed on cpu: MATCH"
  else
    failed=$((failed + 1))
    summary="$summary; frozen run recorded on cuda, replayed on cpu: FAILED"
  fi
else
  summary="$summary; (no CUDA renaissance package on PYTHONPATH: the GPU recording was not made)"
fi
if [ $failed -eq 0 ]; then verdict=PASS; else verdict=FAIL; fi
echo "gpu_recordmask: $verdict: $summary"
[ $failed -eq 0 ]
