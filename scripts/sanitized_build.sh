# shellcheck shell=bash
# Sourced by scripts/fuzz.sh and scripts/sanitize.sh: configure_sanitized BUILD_DIR FLAGS [ARGS...]
# configures a CPU-only RelWithDebInfo build without the benchmarks in BUILD_DIR whose every C++
# object is compiled with FLAGS (the sanitizers) at -O1 -g (fast enough to run the suite or fuzz,
# readable stacks), the CPU kernels for this machine's SIMD target and the baseline only
# (RENAISSANCE_SIMD_TARGETS=native); ARGS are further cmake arguments (a later -D of the same
# variable wins).
configure_sanitized() {
  local build=$1 flags=$2
  shift 2
  cmake -S . -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_CXX_FLAGS="$flags" \
    -DRENAISSANCE_CUDA=OFF \
    -DRENAISSANCE_BUILD_BENCH=OFF \
    -DRENAISSANCE_SIMD_TARGETS=native \
    "$@"
}
