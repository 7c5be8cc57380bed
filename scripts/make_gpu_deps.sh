#!/usr/bin/env bash
# Assembles .deps/ (git-ignored) for the GPU machine, which has no Highway, xxHash, CLI11 or
# nlohmann-json: headers, Highway's shared library and the CMake package files, copied from this
# machine's Debian packages (scripts/install-deps.sh installs them). The device tool carries
# .deps/ beside the working tree (carry [".deps"]); scripts/gpu.sh builds with -DRENAISSANCE_DEPS_DIR=.deps.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh > /dev/null
rm -rf .deps
mkdir -p .deps/include .deps/lib .deps/share/cmake
cp -r /usr/include/hwy /usr/include/CLI /usr/include/nlohmann .deps/include/
cp /usr/include/xxhash.h /usr/include/xxh3.h .deps/include/
cp -P /usr/lib/x86_64-linux-gnu/libhwy.so* .deps/lib/
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json .deps/share/cmake/
# nlohmann_json's package file locates its headers relative to itself: point it at .deps/include.
sed -i 's|/usr/include|${CMAKE_CURRENT_LIST_DIR}/../../../include|g' .deps/share/cmake/nlohmann_json/*.cmake
du -sh .deps
