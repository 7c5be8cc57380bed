#!/usr/bin/env bash
# Sharded steps over NCCL on a machine with 2 GPUs, Open MPI and NCCL (issue 16,
# docs/distributed.md "NCCL"). First run on 2x H200 on 2026-12-01 (a subset: resnet50, adamw and lamb,
# fp32 and bf16 model gradients; 24 checks passed): see issue 16's note.
#
# Builds the CLI with CUDA + MPI + NCCL (NCCL_ROOT=... for a non-system NCCL), then for K = 1, 2
# and a few kinds (with clipping and a skipped NaN step) checks, by fingerprint of the whole state:
#   mpirun -np K ... --distributed nccl --grad-reduce replicated  ==  the plain CUDA run
#   mpirun -np K ... --distributed nccl --grad-reduce ordered     ==  --simulate-ranks K (CUDA)
#   --grad-reduce fast at K = 2                                    ==  ordered (two summands)
#   the plain CUDA run                                             ==  the plain CPU run
# and the same with a bf16/fp16 model copy (adamw, lamb; --precision bf16 --stochastic-rounding
# and --precision fp16), where also the K-rank NCCL run == the plain CPU run (replicated), and
# with model-dtype gradients (--grad-dtype model: bf16 nearest, fp16 stochastic; fast == ordered
# at K = 2 there too, its blocks widened on the device before ncclReduceScatter),
# and prints a performance table ("perf" lines: ms per step and comm_ms_per_step of resnet50 and
# gpt2_small AdamW at K = 1 plain, K = 1 nccl, K = 2 nccl replicated / ordered / fast; rank 0's
# arena_bytes_per_rank). Success: every check line "ok", last line "gpu_dist: all checks
# passed", exit 0. Any "FAIL" line: exit 1.
#
#   bash scripts/gpu_dist.sh            # BUILD=build-gpu-dist by default
#   MODELS=resnet50 KINDS="adamw lamb" PRECS="bf16 --grad-dtype model" bash scripts/gpu_dist.sh
#                                       # a subset when device time is short (PRECS: "|"-separated)
#   CHECKS=0 bash scripts/gpu_dist.sh   # the performance table only (PERF_MODELS, PERF_STEPS)
#   KS=1 ...                            # one GPU: K = 1 only (checks and table)
#   BUILD_TESTS=ON: renaissance_tests is built in the same build dir too (the caller runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu-dist}
deps=()  # the GPU machines have no Highway or xxHash: the carried .deps/ (scripts/make_gpu_deps.sh)
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$PWD/.deps" -DCMAKE_PREFIX_PATH="$PWD/.deps")
  export LD_LIBRARY_PATH="$PWD/.deps/lib:$PWD/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_MPI=ON \
  -DRENAISSANCE_NCCL=ON -DRENAISSANCE_BUILD_TESTS="${BUILD_TESTS:-OFF}" ${NCCL_ROOT:+-DNCCL_ROOT=$NCCL_ROOT} "${deps[@]}" >/dev/null
if [ "${BUILD_TESTS:-OFF}" = ON ]; then ninja -C "$BUILD" renaissance_cli renaissance_tests; else ninja -C "$BUILD" renaissance_cli; fi
CLI=$BUILD/cli/renaissance
nvidia-smi -L || true
# NVLink multicast stays off (the device machines' rule); root may start mpirun in containers.
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
PY=$(command -v python3)

failures=0
json_field() { "$PY" -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }
run_fp() { "$@" --json | json_field fingerprint; }
check() {  # check WHAT A B
  if [[ "$2" == "$3" && -n "$2" ]]; then echo "ok   $1: $2"; else echo "FAIL $1: $2 != $3"; failures=$((failures + 1)); fi
}

read -ra models <<< "${MODELS:-resnet50 gpt2_small}"
read -ra kinds <<< "${KINDS:-adamw lamb lars}"
precs=("bf16 --stochastic-rounding" "fp16" "bf16 --grad-dtype model" "fp16 --stochastic-rounding --grad-dtype model")
[ -n "${PRECS:-}" ] && IFS='|' read -ra precs <<< "$PRECS"
[[ "${CHECKS:-1}" == 0 ]] && models=()
read -ra ks <<< "${KS:-1 2}"  # KS=1 on a machine with one GPU (two ranks cannot share one in NCCL)
for model in "${models[@]}"; do
  for kind in "${kinds[@]}"; do
    args=(run --model "$model" --optimizer "$kind" --steps 6 --seed 3 --loss-scale 128 --schedule cosine --warmup 1
          --nan-at 2 --max-grad-norm 0.05)
    plain=$(run_fp "$CLI" "${args[@]}" --backend cuda)
    if [[ "$model" == resnet50 ]]; then
      check "$model $kind: CUDA == CPU" "$plain" "$(run_fp "$CLI" "${args[@]}" --backend cpu)"
    fi
    for K in "${ks[@]}"; do
      tag="$model $kind K=$K"
      check "$tag replicated == plain" "$(run_fp "${MPIRUN[@]}" -np "$K" "$CLI" "${args[@]}" --distributed nccl --grad-reduce replicated)" "$plain"
      ordered=$(run_fp "${MPIRUN[@]}" -np "$K" "$CLI" "${args[@]}" --distributed nccl --grad-reduce ordered)
      check "$tag ordered == --simulate-ranks $K" "$ordered" "$(run_fp "$CLI" "${args[@]}" --backend cuda --simulate-ranks "$K")"
      if [[ "$K" == 2 ]]; then
        check "$tag fast == ordered" "$(run_fp "${MPIRUN[@]}" -np 2 "$CLI" "${args[@]}" --distributed nccl --grad-reduce fast)" "$ordered"
      fi
    done
  done
  # The model copy: the update sub-step writes the copy of its slice (cut tensors keep their
  # rounding keys), W and the copy are all-gathered (docs/distributed.md "The model copy").
  for prec in "${precs[@]}"; do
    for kind in adamw lamb; do
      # shellcheck disable=SC2206  # prec is split on purpose into --precision's value and flag
      args=(run --model "$model" --optimizer "$kind" --steps 6 --seed 3 --loss-scale 128 --schedule cosine --warmup 1
            --nan-at 2 --max-grad-norm 0.05 --precision $prec)
      plain=$(run_fp "$CLI" "${args[@]}" --backend cuda)
      cpu=$(run_fp "$CLI" "${args[@]}" --backend cpu)
      check "$model $kind $prec: CUDA == CPU" "$plain" "$cpu"
      for K in "${ks[@]}"; do
        tag="$model $kind $prec K=$K"
        check "$tag replicated == plain CPU" "$(run_fp "${MPIRUN[@]}" -np "$K" "$CLI" "${args[@]}" --distributed nccl --grad-reduce replicated)" "$cpu"
        ordered=$(run_fp "${MPIRUN[@]}" -np "$K" "$CLI" "${args[@]}" --distributed nccl --grad-reduce ordered)
        check "$tag ordered == --simulate-ranks $K" "$ordered" "$(run_fp "$CLI" "${args[@]}" --backend cuda --simulate-ranks "$K")"
        if [[ "$K" == 2 && "$prec" == *grad-dtype* ]]; then
          check "$tag fast == ordered" "$(run_fp "${MPIRUN[@]}" -np 2 "$CLI" "${args[@]}" --distributed nccl --grad-reduce fast)" "$ordered"
        fi
      done
    done
  done
done

# The performance table (issue 16): AdamW fp32, --steps PERF_STEPS (default 50), per model:
# ms_per_step (median over the steps; plain: CUDA events around each step; nccl: the host's wall
# time of ShardedStep::step() until its stream is done, so collectives, the reduction and the
# sub-steps), its minimum, and comm_ms_per_step (CUDA events on the stream around the
# communication phases: collectives and the reduction kernels between them, not the sub-steps).
perf() {  # perf LABEL CMD...: one row (a run that fails counts as a failed check)
  local json
  if ! json=$("${@:2}" --json); then
    echo "FAIL perf $model $1: the run failed"
    failures=$((failures + 1))
    return 0
  fi
  "$PY" -c 'import json,sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
comm = "%.3f" % j["comm_ms_per_step"] if "comm_ms_per_step" in j else "-"
print("perf %-10s %-18s %9.3f %9.3f %9s %14d" % (sys.argv[1], sys.argv[2], j["ms_per_step"], j["ms_per_step_min"], comm,
                                               j["arena_bytes_per_rank"]))' "$model" "$1" <<< "$json"
}
printf "perf %-10s %-18s %9s %9s %9s %14s\n" model run ms/step min_ms comm_ms arena_bytes
read -ra perf_models <<< "${PERF_MODELS:-resnet50 gpt2_small}"
for model in "${perf_models[@]}"; do
  pargs=(run --model "$model" --optimizer adamw --steps "${PERF_STEPS:-50}" --seed 3)
  perf "K=1 plain" "$CLI" "${pargs[@]}" --backend cuda
  perf "K=1 nccl ordered" "${MPIRUN[@]}" -np 1 "$CLI" "${pargs[@]}" --distributed nccl --grad-reduce ordered
  [[ " ${ks[*]} " == *" 2 "* ]] || continue
  for mode in replicated ordered fast; do
    perf "K=2 nccl $mode" "${MPIRUN[@]}" -np 2 "$CLI" "${pargs[@]}" --distributed nccl --grad-reduce "$mode"
  done
done

if [[ $failures -ne 0 ]]; then
  echo "gpu_dist: $failures check(s) FAILED"
  exit 1
fi
echo "gpu_dist: all checks passed"
