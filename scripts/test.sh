#!/usr/bin/env bash
# The test command of README.md: installs what is missing, builds (CUDA backend too when nvcc
# is found), builds the Python package and runs its pytest suite, then every test under ctest
# (last, so that its summary closes the log). Usage: scripts/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
# ctest runs as many tests at once as there are cores and each opens OpenMP teams of its own, so
# the machine is oversubscribed; OpenMP's default spinning waits then hold a core while the
# thread they wait for cannot run (a Muon test with many small parallel regions: 44 s instead of
# 3 s on 2 cores). Passive waits sleep instead; the bits do not depend on it.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
scripts/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --parallel "$(nproc)"
# The Python package (pip install . into a venv, CPU only) and its pytest suite.
scripts/test_python.sh "$build-python"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 1500
