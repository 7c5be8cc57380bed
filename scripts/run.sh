#!/usr/bin/env bash
# The main job of README.md: installs what is missing, builds, and runs `renaissance run`
# (resnet50 layout, AdamW, best available backend). Extra arguments go to `renaissance run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --parallel "$(nproc)" --target renaissance_cli
exec build/cli/renaissance run "$@"
