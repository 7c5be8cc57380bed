# Sourced by the scripts that recompile backend_cuda's sources outside the build (count_kernels.sh,
# same_sass.sh): the real compile command of one source, taken from a configured CUDA build
# directory (`ninja -t commands`), so that they compile with exactly the build's flags.

# cuda_build_home BUILD: the checkout BUILD was configured from.
cuda_build_home() {
  local home
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt" 2> /dev/null)
  [ -n "$home" ] || { echo "$(basename "$0"): $1 is not a configured CMake build" >&2; return 1; }
  echo "$home"
}

# cuda_compile_command BUILD FILE TREE: BUILD's command compiling backend_cuda/FILE, without the
# compiler launcher and the dependency file, with TREE in place of the checkout (TREE has its
# layout); it ends in "-c SOURCE -o OBJECT" and runs from BUILD.
cuda_compile_command() {
  local build=$1 file=$2 tree=$3 home line
  home=$(cuda_build_home "$build") || return 1
  line=$(cd "$build" && ninja -t commands renaissance_cuda | grep -E -- "-c [^ ]*/backend_cuda/$file -o " | head -n 1)
  [ -n "$line" ] || { echo "$(basename "$0"): no compile command for $file in $build" >&2; return 1; }
  sed -E -e 's/^ccache //' -e 's/ -MD -MT [^ ]+ -MF [^ ]+//' -e "s#$home#$tree#g" <<< "$line"
}
