#!/usr/bin/env bash
# libFuzzer run of every parser of untrusted input, as CI runs it: configures a
# separate clang build (build-fuzz) with -fsanitize=fuzzer-no-link,address,undefined for the whole
# library, builds the four targets of fuzz/, replays the stored regression inputs, then fuzzes
# each target for a bounded time from a temporary copy of its seed corpus (the repository is
# never written). Exits non-zero on any crash, hang, leak, out-of-memory or sanitizer report;
# the reproducer is left in BUILD_DIR/fuzz-artifacts/TARGET/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     (default: $FUZZ_SECONDS, else 60)
#   FUZZ_BUILD_DIR (build-fuzz)  FUZZ_JOBS (nproc)  FUZZ_TARGETS (all four)  FUZZ_CXX (clang++)
#   FUZZ_KEEP_CORPUS=DIR: keep the grown corpora under DIR/TARGET instead of deleting them
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-${FUZZ_SECONDS:-60}}"
build="${FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${FUZZ_JOBS:-$(nproc)}"
cxx="${FUZZ_CXX:-clang++}"
targets=(${FUZZ_TARGETS:-fuzz_safetensors fuzz_replay_case fuzz_layout fuzz_checkpoint})

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh: $cxx not found (Debian: apt-get install -y clang)" >&2
  exit 2
fi
# Debian ships libFuzzer's runtime in libclang-rt-N-dev; install it when the link test fails.
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cc"
if ! "$cxx" -fsanitize=fuzzer,address "$probe/p.cc" -o "$probe/p" 2>/dev/null; then
  major="$("$cxx" -dumpversion | cut -d. -f1)"
  echo "fuzz.sh: $cxx cannot link -fsanitize=fuzzer; installing libclang-rt-$major-dev" >&2
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get install -y "libclang-rt-$major-dev"
  "$cxx" -fsanitize=fuzzer,address "$probe/p.cc" -o "$probe/p"
fi

# -O1 -g: fast enough to fuzz, readable stacks. -fno-sanitize-recover: a UBSan finding aborts,
# so libFuzzer reports it with the input instead of printing and carrying on.
# The fuzzed code is the parsers: the CPU kernels that the checkpoint target links are built for
# this machine's SIMD target only (configure_sanitized's RENAISSANCE_SIMD_TARGETS=native).
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
source scripts/sanitized_build.sh
configure_sanitized "$build" "$san" \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DRENAISSANCE_BUILD_TESTS=OFF \
  -DRENAISSANCE_BUILD_CLI=OFF \
  -DRENAISSANCE_BUILD_FUZZ=ON
cmake --build "$build" --parallel "$jobs" --target "${targets[@]}"

# One input at a time: no OpenMP pool. Leak checking stays on (libFuzzer's -detect_leaks).
export OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
artifacts="$build/fuzz-artifacts"
status=0
for t in "${targets[@]}"; do
  bin="$build/fuzz/$t"
  mkdir -p "$artifacts/$t"
  # Every input that once crashed must now pass (the gtests in tests/io/test_fuzz_regressions.cc
  # check the same files through the library; this checks them through the fuzz target too).
  shopt -s nullglob
  regressions=(fuzz/regressions/"$t"/*)
  shopt -u nullglob
  if ((${#regressions[@]} > 0)); then
    echo "==== $t: ${#regressions[@]} regression input(s)"
    # Given files rather than a folder, libFuzzer runs each once and exits non-zero on a failure.
    if ! "$bin" "${regressions[@]}" >"$artifacts/$t/regressions.log" 2>&1; then
      echo "fuzz.sh: $t FAILED on a stored regression input; see $artifacts/$t/regressions.log" >&2
      tail -n 40 "$artifacts/$t/regressions.log" >&2
      status=1
      continue
    fi
  fi
  corpus="$(mktemp -d)"
  cp -R "fuzz/corpus/$t/." "$corpus/"
  # The target's dictionary plus every kind name of the kind table (bare and JSON-quoted), so a
  # new kind is fuzzed without anyone editing a dictionary.
  dict_file="$artifacts/$t/generated.dict"
  { [[ -f "fuzz/dict/$t.dict" ]] && cat "fuzz/dict/$t.dict"
    for k in $(sed -n 's/^ *{OptimizerKind::k[A-Za-z]*, "\([a-z0-9_]*\)".*/\1/p' core/include/renaissance/kinds.h); do
      printf '"%s"\n"\\"%s\\""\n' "$k" "$k"
    done; } > "$dict_file"
  dict=(-dict="$dict_file")
  echo "==== $t: ${seconds}s from $(ls "$corpus" | wc -l) seed(s)"
  # -timeout: an input that takes 10 s is a hang. -rss_limit_mb / -malloc_limit_mb: a parser that
  # tries to allocate gigabytes for a small file is a finding.
  if ! "$bin" "$corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$artifacts/$t/" \
      >"$artifacts/$t/fuzz.log" 2>&1; then
    echo "fuzz.sh: $t FOUND A PROBLEM; reproducer in $artifacts/$t/, log:" >&2
    tail -n 60 "$artifacts/$t/fuzz.log" >&2
    status=1
  fi
  grep -E "^#[0-9]+.*(DONE|pulse)|stat::" "$artifacts/$t/fuzz.log" | tail -n 8 || true
  echo "corpus: $(ls "$corpus" | wc -l) file(s) after the run"
  if [[ -n "${FUZZ_KEEP_CORPUS:-}" ]]; then
    mkdir -p "$FUZZ_KEEP_CORPUS/$t"
    cp -R "$corpus/." "$FUZZ_KEEP_CORPUS/$t/"
  fi
  rm -rf "$corpus"
done
if ((status != 0)); then
  echo "fuzz.sh: FAILED (findings above)" >&2
  exit "$status"
fi
echo "fuzz.sh: ${targets[*]}: ${seconds}s each, no findings"
