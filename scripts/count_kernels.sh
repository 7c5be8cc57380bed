#!/usr/bin/env bash
# Kernels per CUDA source: for each backend_cuda/*.cu, the number of `.entry` symbols in the PTX
# that `nvcc -ptx` writes with the real build's flags (taken from `ninja -t commands` of a
# configured CUDA build directory), and with --time the CPU seconds (user + sys) of the real
# object compile (nvcc through ptxas, without ccache).
#
#   scripts/count_kernels.sh BUILD_DIR [--time] [--source DIR] [FILE.cu ...]
#
# BUILD_DIR: configured with -DRENAISSANCE_CUDA=ON (e.g. CUDAARCHS=90-real). --source DIR: compile
# the sources of another checkout (same layout) with that build's flags, for an A/B of two trees.
# FILE.cu: only these sources (names inside backend_cuda/); default every one.
set -euo pipefail

build=${1:?usage: scripts/count_kernels.sh BUILD_DIR [--time] [--source DIR] [FILE.cu ...]}
shift
timed=0
source_dir=
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) timed=1 ;;
    --source) source_dir=$(cd "$2" && pwd); shift ;;
    *) files+=("$1") ;;
  esac
  shift
done

. "$(dirname "$0")/cuda_commands.sh"
build=$(cd "$build" && pwd)
home=$(cuda_build_home "$build")
[ -n "$source_dir" ] || source_dir=$home
if [ ${#files[@]} -eq 0 ]; then
  for f in "$source_dir"/backend_cuda/*.cu; do files+=("$(basename "$f")"); done
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $timed -eq 1 ]; then
  printf '%-26s %8s %10s\n' file kernels cpu_s
else
  printf '%-26s %8s\n' file kernels
fi
total=0
for f in "${files[@]}"; do
  cmd=$(cuda_compile_command "$build" "$f" "$source_dir")  # the real command, on the chosen tree
  ptx_cmd=$(sed -E "s# -c ([^ ]+) -o [^ ]+# -ptx \\1 -o $tmp/k.ptx#" <<<"$cmd")
  (cd "$build" && eval "$ptx_cmd")
  n=$(grep -cE '^[[:space:]]*(\.(visible|weak|extern)[[:space:]]+)*\.entry[[:space:]]' "$tmp/k.ptx" || true)
  total=$((total + n))
  if [ $timed -eq 1 ]; then
    obj_cmd=$(sed -E "s# -o [^ ]+\$# -o $tmp/k.o#" <<<"$cmd")
    (cd "$build" && /usr/bin/time -f '%U %S' -o "$tmp/time" bash -c "$obj_cmd")
    secs=$(awk '{printf "%.1f", $1 + $2}' "$tmp/time")
    printf '%-26s %8d %10s\n' "$f" "$n" "$secs"
  else
    printf '%-26s %8d\n' "$f" "$n"
  fi
done
printf '%-26s %8d\n' total "$total"
