#!/usr/bin/env bash
# Assembles .deps/ (git-ignored) for the GPU machine, which has no Highway, xxHash, CLI11 or
# nlohmann-json: headers, Highway's shared library and the CMake package files, copied from this
# machine's Debian packages (scripts/install-deps.sh installs them). The device tool carries
# .deps/ beside the working tree (carry [".deps"]); scripts/gpu.sh builds with -DRENAISSANCE_DEPS_DIR=.deps.
# AB_BASE=COMMIT also writes .deps/ab-base.tar, that commit's tree (git archive), the base of
# gpu.sh's ab phase. Other files under .deps/ (carried wheels, test material) are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh > /dev/null
rm -rf .deps/include .deps/lib .deps/share .deps/ab-base.tar
mkdir -p .deps/include .deps/lib .deps/share/cmake
cp -r /usr/include/hwy /usr/include/CLI /usr/include/nlohmann .deps/include/
cp /usr/include/xxhash.h /usr/include/xxh3.h .deps/include/
cp -P /usr/lib/x86_64-linux-gnu/libhwy.so* .deps/lib/
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json .deps/share/cmake/
# nlohmann_json's package file locates its headers relative to itself: point it at .deps/include.
sed -i 's|/usr/include|${CMAKE_CURRENT_LIST_DIR}/../../../include|g' .deps/share/cmake/nlohmann_json/*.cmake
if [ -n "${AB_BASE:-}" ]; then
  git archive --format=tar -o .deps/ab-base.tar "$AB_BASE"
  echo "make_gpu_deps: .deps/ab-base.tar is $(git rev-parse --short "$AB_BASE")"
fi
du -sh .deps
