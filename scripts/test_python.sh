#!/usr/bin/env bash
# Builds the Python package with `pip install .` (CPU only) into a venv under the build dir and
# runs tests/python (the core module and renaissance.torch).
# Usage: scripts/test_python.sh [BUILD_DIR] (default build-python).
# The venv sees Debian's numpy (--system-site-packages); nanobind, scikit-build-core and pytest
# come from PyPI. --no-build-isolation: the build uses the venv's nanobind and scikit-build-core.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
BUILD="${1:-build-python}"
mkdir -p "$BUILD"
BUILD="$(cd "$BUILD" && pwd)"  # absolute: the tests run from inside it
PY=/usr/bin/python3  # Debian's interpreter with numpy (the pyenv python3 on PATH has none)
# renaissance.torch's tests need Debian's torch and scikit-learn (the digits data ship inside it);
# the venv sees them through --system-site-packages. Installed here only when missing.
need=()
for p in python3-torch python3-sklearn; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "test_python: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
VENV="$BUILD/venv"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
# pip >= 23.1 understands -C (config settings); Debian's 23.0 does not.
"$VENV/bin/python" -m pip install -q -U pip
"$VENV/bin/python" -m pip install -q nanobind scikit-build-core pytest
# The test venv's module is built for this machine's SIMD target only (RENAISSANCE_SIMD_TARGETS=
# native, ~3x faster; the main build tests every target); PYTHON_SIMD_TARGETS=attainable builds
# the wheel's full set. The CMake build tree is kept under the build dir, so a second run only
# rebuilds what changed.
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$VENV/bin/python" -m pip install -q --no-build-isolation . \
  -Cbuild-dir="$BUILD/skbuild" -Ccmake.define.RENAISSANCE_CUDA=OFF \
  -Ccmake.define.RENAISSANCE_SIMD_TARGETS="${PYTHON_SIMD_TARGETS:-native}"
# Run from outside the source tree so `import renaissance` is the installed package.
cd "$BUILD"
"$VENV/bin/python" -m pytest "$ROOT/tests/python" -q
