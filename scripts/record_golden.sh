#!/usr/bin/env bash
# Records audit/golden/fingerprints.json and conformance/REPORT.md on a machine with a
# CUDA GPU: builds with the CUDA backend, runs the whole conformance suite once (CPU and CUDA in
# lockstep; it refuses to record unless CUDA is available, every check passes and every cell's
# CUDA fingerprint equals the CPU's), then renders the report from the same run.
# Usage: scripts/record_golden.sh [BUILD_DIR]   (then review and commit the two files)
# A BUILD_DIR that is already configured (scripts/gpu.sh's, `gpu.sh golden`) keeps its
# configuration; a new one is configured with CUDA on and the benchmarks off.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-golden}"
# The GPU machine keeps Highway, xxHash, CLI11 and nlohmann-json under .deps (scripts/make_gpu_deps.sh).
deps=()
if [ -d .deps ]; then
  deps=(-DRENAISSANCE_DEPS_DIR="$PWD/.deps" -DCMAKE_PREFIX_PATH="$PWD/.deps")
  export LD_LIBRARY_PATH="$PWD/.deps/lib:$PWD/.deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_BUILD_BENCH=OFF "${deps[@]}"
fi
cmake --build "$build" --target conformance_suite renaissance_cli --parallel "$(nproc)"
# The one opt-out from golden strictness: while recording, the old file may not cover the matrix
# (the suite refuses --record-golden without it). Set for this command only.
RENAISSANCE_GOLDEN_RECORDING=1 "$build/conformance/conformance_suite" \
  --record-golden audit/golden/fingerprints.json --report-json "$build/conformance-results.json"
python3 conformance/render_report.py "$build/conformance-results.json" > conformance/REPORT.md
# The binaries embed the golden file at build time: rebuild so they carry the new one, then the
# audit (strict again, no opt-out) must say MATCH for every kind and backend.
cmake --build "$build" --target conformance_suite renaissance_cli --parallel "$(nproc)"
"$build/cli/renaissance" audit
echo "recorded: audit/golden/fingerprints.json and conformance/REPORT.md (review, then commit both)"
