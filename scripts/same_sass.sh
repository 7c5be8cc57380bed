#!/usr/bin/env bash
# Whether a CUDA change leaves the machine code as it was: compiles backend_cuda's sources of a git
# revision and of the working tree, each copied to one temporary path (so that the anonymous
# namespaces get the same names), with a configured build's compile commands (cuda_commands.sh) to
# sm_90 cubins, and compares the SASS of every kernel (cuobjdump -sass), kernel by kernel (their
# order in the cubin is not compared). A comparison `a > b` emitted as `b < a`, an integer `a == b`
# or `a != b` with its operands swapped (the same predicates) and register-reuse hints are not
# counted as differences; anything else is. For refactors that must change neither bits nor speed
# when no GPU is at hand.
#
#   scripts/same_sass.sh BUILD_DIR REV [FILE.cu ...]      (default: every backend_cuda/*.cu)
#
# BUILD_DIR: configured with -DRENAISSANCE_CUDA=ON (its --generate-code flags are replaced by
# -arch=sm_90). Needs cuobjdump (CUOBJDUMP=path; the CUDA toolkit's, or PyPI's
# nvidia-cuda-cuobjdump wheel). Exit status 0: every kernel the same; 1: some differ (the files'
# diff counts and the kernels' names printed); 2: a tool is missing.
set -euo pipefail

usage="usage: scripts/same_sass.sh BUILD_DIR REV [FILE.cu ...]"
build=${1:?$usage}
rev=${2:?$usage}
shift 2
. "$(dirname "$0")/cuda_commands.sh"
build=$(cd "$build" && pwd)
root=$(git rev-parse --show-toplevel)
cuobjdump=${CUOBJDUMP:-cuobjdump}
command -v "$cuobjdump" > /dev/null || { echo "same_sass: no cuobjdump (set CUOBJDUMP)" >&2; exit 2; }
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  for f in "$root"/backend_cuda/*.cu; do files+=("$(basename "$f")"); done
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/old" "$tmp/new"
git -C "$root" archive "$rev" backend_cuda core | tar -x -C "$tmp/old"
cp -r "$root/backend_cuda" "$root/core" "$tmp/new/"

# Each tree is compiled from $tmp/tree, the same path for both.
sass() {  # sass TREE FILE -> its kernels' instructions, addresses and encodings stripped (none: empty)
  rm -rf "$tmp/tree" && cp -r "$tmp/$1" "$tmp/tree"
  local cmd
  cmd=$(cuda_compile_command "$build" "$2" "$tmp/tree" |
        sed -E -e 's# --generate-code=[^ ]+##g' -e "s# -c ([^ ]+) -o [^ ]+# -arch=sm_90 -cubin \1 -o $tmp/$1.cubin#")
  (cd "$build" && eval "$cmd")
  "$cuobjdump" -sass "$tmp/$1.cubin" | { grep -E 'Function :|/\*[0-9a-f]{4}\*/' || true; } |
    sed -E 's@^\s*/\*[0-9a-f]{4}\*/\s*@@; s@\s*/\* 0x[0-9a-f]+ \*/\s*$@@; s@ +@ @g; s@\.reuse@@g' |
    sed -E 's/FSETP\.LT\.AND (P[0-9]), PT, ([^,]+), ([^,]+), /FSETP.GT.AND \1, PT, \3, \2, /' |
    awk -F', ' '/^ISETP\.(NE|EQ)[.A-Z0-9]*AND/ && $3 > $4 { t = $3; $3 = $4; $4 = t } { print }' OFS=', '
}
kernels_of() {  # kernels_of SASS DIR: one file per kernel in DIR (k1, k2, ...), DIR/names: "FILE SYMBOL"
  rm -rf "$2" && mkdir "$2"
  awk -v d="$2" '/Function :/ { close(out); out = d "/k" ++n; print "k" n, $3 > (d "/names") } out { print > out }' "$1"
  touch "$2/names"
}

status=0
for f in "${files[@]}"; do
  sass old "$f" > "$tmp/old.sass"
  sass new "$f" > "$tmp/new.sass"
  kernels_of "$tmp/old.sass" "$tmp/old.k"
  kernels_of "$tmp/new.sass" "$tmp/new.k"
  kernels=$(wc -l < "$tmp/new.k/names")
  declare -A old_file=() new_file=()
  while read -r file symbol; do old_file[$symbol]=$tmp/old.k/$file; done < "$tmp/old.k/names"
  while read -r file symbol; do new_file[$symbol]=$tmp/new.k/$file; done < "$tmp/new.k/names"
  differing=0
  names=()
  for k in $(cut -d' ' -f2 "$tmp/old.k/names" "$tmp/new.k/names" | sort -u); do
    # A kernel on one side only: all its lines differ.
    n=$(diff "${old_file[$k]:-/dev/null}" "${new_file[$k]:-/dev/null}" | grep -c '^[<>]' || true)
    [ "$n" -eq 0 ] || { differing=$((differing + n)); names+=("$k"); }
  done
  unset old_file new_file
  if [ "$differing" -eq 0 ]; then
    printf '%-28s %3d kernels, the same SASS\n' "$f" "$kernels"
  else
    printf '%-28s %3d kernels, %d lines differ, in:\n' "$f" "$kernels" "$differing"
    printf '  %s\n' "${names[@]}"
    status=1
  fi
done
exit $status
