#!/usr/bin/env bash
# Builds the Python package's wheel (`pip wheel .`, CPU only), installs it into a venv under the
# build dir and into a fresh one (a 2-step Task there) and runs tests/python (the core module and
# renaissance.torch) on the first.
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
# rebuilds what changed. `pip wheel`, then that wheel installed: the tests run on what a wheel
# carries (the same version reinstalled, hence --force-reinstall).
rm -rf "$BUILD/dist"
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$VENV/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$BUILD/dist" . \
  -Cbuild-dir="$BUILD/skbuild" -Ccmake.define.RENAISSANCE_CUDA=OFF \
  -Ccmake.define.RENAISSANCE_SIMD_TARGETS="${PYTHON_SIMD_TARGETS:-native}"
WHEEL=$(ls "$BUILD"/dist/renaissance-*.whl)
"$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$WHEEL"
# The wheel on its own (docs/python.md, "A wheel that stands alone"): installed into a fresh venv
# (numpy, its one dependency, is Debian's: --system-site-packages and no index) and used from
# outside the source tree with no LD_LIBRARY_PATH: two AdamW steps of a Task against float64.
FRESH="$BUILD/wheel-venv"
rm -rf "$FRESH"
"$PY" -m venv --system-site-packages "$FRESH"
"$FRESH/bin/python" -m pip install -q --no-index "$WHEEL"
(cd "$BUILD" && env -u LD_LIBRARY_PATH "$FRESH/bin/python" - "$WHEEL" <<'PY'
import os, sys
import numpy as np
import renaissance
assert renaissance.__file__.startswith(sys.prefix), (renaissance.__file__, sys.prefix)
lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
w0 = np.array([1.0, -2.0, 3.0, -4.0], dtype=np.float32)
grads = [np.array([0.5, 0.5, -0.5, 1.0], np.float32), np.array([0.25, -1.0, 0.5, 0.0], np.float32)]
task = renaissance.Task([("w", (4,), "fc_weight")], backend="cpu", threads=1)
task.optimizer("adamw", lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=0.0).compile()
task.set_weight("w", w0)
w, m, v = w0.astype(np.float64), np.zeros(4), np.zeros(4)
for t, g in enumerate(grads, 1):
    task.set_grad("w", g)
    task.step()
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g.astype(np.float64) ** 2
    w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
got = task.get_weight("w")
err = float(np.max(np.abs(got - w)))
assert task.step_count == 2 and err < 2e-6, (task.step_count, got, w)
print(f"test_python: wheel {os.path.basename(sys.argv[1])} in a fresh venv: import ok from "
      f"{os.path.dirname(renaissance.__file__)}, 2 AdamW steps, max |w - float64| {err:.1e}")
PY
)
# Run from outside the source tree so `import renaissance` is the installed package.
cd "$BUILD"
"$VENV/bin/python" -m pytest "$ROOT/tests/python" -q
