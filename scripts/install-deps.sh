#!/usr/bin/env bash
# Installs the Debian packages the build needs, only when some are missing, so a fresh machine
# needs nothing by hand. Safe to run repeatedly. (CUDA is optional: the CUDA backend is built
# when nvcc is found.)
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libhwy-dev libeigen3-dev libgtest-dev libgmock-dev
          libbenchmark-dev nlohmann-json3-dev libcli11-dev libxxhash-dev python3 python3-numpy clang
          python3-dev python3-venv python3-pip libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
