#!/usr/bin/env bash
# Installs the system packages shardkit needs on a fresh Debian 12 (or Ubuntu 24.04) machine.
# Idempotent: packages already present are left alone. Runs apt-get through sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libhdf5-dev hdf5-tools           # serial HDF5 C API + h5dump for interop checks
  libzstd-dev                      # zstd for the HDF5 filter 32015
  zlib1g-dev                       # CRC-32 of the torch.save archives written for DeepSpeed
  libopenmpi-dev openmpi-bin       # MPI ranks
  libcli11-dev nlohmann-json3-dev  # command line, JSON
  libgtest-dev libgmock-dev        # tests
  python3-torch                    # golden numerics: the CPU model against PyTorch
  libopenblas-dev                  # matrix products of the CPU trainer
  liburing-dev                     # io_uring: the NVMe offload's asynchronous swap I/O
  python3 python3-h5py python3-numpy python3-xxhash  # interop tests: Debian h5py reads shards
  clang-format
  clang libclang-rt-dev            # libFuzzer targets of the parsers (scripts/fuzz.sh)
)
# The headless rendering test of `shardkit report` (tests/report). Ubuntu ships Chromium only as a snap,
# which apt cannot install here: there the test skips with a message.
if grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then packages+=(chromium); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup-debian: installed ${#missing[@]} package(s)"
