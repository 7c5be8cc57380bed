# Sourced by scripts/fuzz.sh and scripts/sanitize.sh: configure_sanitized BUILD_DIR FLAGS [ARGS...]
# configures a CPU-only RelWithDebInfo build in BUILD_DIR whose every C++ object is compiled
# with FLAGS (the sanitizers) at -O1 -g (fast enough to run the suite or fuzz, readable stacks);
# ARGS are further cmake arguments.
configure_sanitized() {
  local build=$1 flags=$2
  shift 2
  cmake -S . -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_CXX_FLAGS="$flags" \
    -DRENAISSANCE_CUDA=OFF \
    "$@"
}
