#!/usr/bin/env sh
# Fails when the host code of the CUDA backend references exit(). nvcc compiles a host call of a
# __device__-only function inside a template (e.g. a reader's operator+ applied on the host in a
# launch lambda) without an error or a warning, into a host stub that calls exit(1): the process
# then dies silently mid-step (e.g. the masked CHECK_FINITE launch on the H200).
# No code of the backend calls exit() on purpose, so any reference is such a stub.
#   scripts/check_cuda_host_exit.sh path/to/librenaissance_cuda.a
set -eu
lib=$1
nm_tool=${NM:-nm}
found=$("$nm_tool" -u -A "$lib" 2>/dev/null | awk '$NF == "exit" || $NF ~ /^exit@/ {print $1}' | sort -u)
if [ -n "$found" ]; then
  echo "host code of $lib references exit() (a __device__-only function called on the host?):"
  echo "$found"
  exit 1
fi
echo "no exit() reference in the host code of $lib"
