#!/usr/bin/env bash
# The per-tensor mask in sharded steps on CUDA ranks over NCCL (issue 16; docs/distributed.md "One
# step on rank r", the per-tensor mask), on a machine with 2 GPUs, Open MPI and NCCL: builds
# tests/comm/sharded_mask.cc with CUDA + MPI + NCCL, then runs it at K = 1 and 2 with `cuda`:
# replicated == the plain masked CUDA run, ordered == the simulated ranks, fast == ordered at
# K <= 2, bit for bit with the per-tensor counts (adamw, lamb, lars, sgd_momentum with and
# without clipping, adamw bf16 stochastic: the masked and unmasked programs' update sub-steps
# both prepared, the second as the alternate). Success: no "FAIL" line and the last line of each
# K is "all sharded mask runs match"; exit 0. (About a minute of build and seconds of runs.)
#
#   bash scripts/gpu_shardmask.sh        # BUILD=build-gpu-dist by default (shared with gpu_dist.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu-dist}
deps=()  # the GPU machines have no Highway or xxHash: the carried .deps/ (scripts/make_gpu_deps.sh)
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$PWD/.deps" -DCMAKE_PREFIX_PATH="$PWD/.deps")
  export LD_LIBRARY_PATH="$PWD/.deps/lib:$PWD/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_MPI=ON \
  -DRENAISSANCE_NCCL=ON -DRENAISSANCE_BUILD_TESTS=ON ${NCCL_ROOT:+-DNCCL_ROOT=$NCCL_ROOT} "${deps[@]}" >/dev/null
ninja -C "$BUILD" sharded_mask
nvidia-smi -L || true
# NVLink multicast stays off (the device machines' rule); root may start mpirun in containers.
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
for K in ${KS:-1 2}; do
  out=$(mpirun --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np "$K" \
        "$BUILD/tests/comm/sharded_mask" tests/comm/shard_layout.json cuda 2>&1) || status=1
  echo "$out"
  echo "$out" | tail -1 | grep -q "all sharded mask runs match" || status=1
done
if [ $status -eq 0 ]; then echo "gpu_shardmask: all checks passed"; else echo "gpu_shardmask: FAILED"; fi
exit $status
