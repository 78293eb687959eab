#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine to a built ./train:
#   scripts/setup.sh            # dependencies + libtorch + build (Release) -> ./train
# libtorch is taken, in this order, from: $Torch_DIR, $CMAKE_PREFIX_PATH or $LIBTORCH (a libtorch
# folder); an existing .venv with torch 2.11; a system python3 with torch 2.11; the official
# libtorch 2.11 (CUDA 13.0) zip when download.pytorch.org is reachable; else the torch==2.11.0
# wheel from PyPI installed into .venv (its share/cmake is the prefix; no Python runs in the product).
# Environment: BUILD_DIR (default build), FLASHCOS_CUDA_ARCHS (default 80;90), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
TORCH_VERSION=2.11.0
# A CUDA libtorch's CMake config enables CUDA, so it needs nvcc even to be configured against:
# without nvcc take the CPU libtorch (zip or wheel) instead.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  LIBTORCH_URL="https://download.pytorch.org/libtorch/cu130/libtorch-shared-with-deps-${TORCH_VERSION}%2Bcu130.zip"
  WHEEL_INDEX=()
else
  LIBTORCH_URL="https://download.pytorch.org/libtorch/cpu/libtorch-shared-with-deps-${TORCH_VERSION}%2Bcpu.zip"
  WHEEL_INDEX=(--index-url https://download.pytorch.org/whl/cpu)
fi

say() { printf '[setup] %s\n' "$*"; }

# ---- system packages ----------------------------------------------------------------------
need_pkgs=()
for p in build-essential cmake ninja-build libspdlog-dev libcxxopts-dev zlib1g-dev nlohmann-json3-dev \
         libgtest-dev gnuplot-nox curl unzip python3-venv ccache libgloo-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if command -v apt-get >/dev/null; then
    say "installing: ${need_pkgs[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
  else
    say "missing packages (${need_pkgs[*]}) and no apt-get: install them yourself"; exit 1
  fi
fi

# ---- libtorch ---------------------------------------------------------------------------
torch_prefix=""
torch_ok() { "$1" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('${TORCH_VERSION}') else 1)" 2>/dev/null; }
if [ -n "${Torch_DIR:-}" ]; then
  torch_prefix="$Torch_DIR"
elif [ -n "${CMAKE_PREFIX_PATH:-}" ]; then
  torch_prefix="$CMAKE_PREFIX_PATH"
elif [ -n "${LIBTORCH:-}" ]; then
  torch_prefix="$LIBTORCH"
elif [ -x .venv/bin/python ] && torch_ok .venv/bin/python; then
  torch_prefix=$(.venv/bin/python -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
elif command -v python3 >/dev/null && torch_ok python3; then
  torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
elif [ -d third_party/libtorch/share/cmake/Torch ]; then
  torch_prefix="$ROOT/third_party/libtorch"
elif curl -sfI --max-time 15 "$LIBTORCH_URL" >/dev/null 2>&1; then
  say "downloading the official libtorch ${TORCH_VERSION} zip: $LIBTORCH_URL"
  mkdir -p third_party
  curl -fL --retry 3 -o third_party/libtorch.zip "$LIBTORCH_URL"
  unzip -q -o third_party/libtorch.zip -d third_party && rm third_party/libtorch.zip
  torch_prefix="$ROOT/third_party/libtorch"
else
  say "download.pytorch.org unreachable: installing the torch==${TORCH_VERSION} wheel into .venv (libtorch only)"
  # The CUDA wheel and its nvidia-* wheels take about 5 GiB installed, and pip unpacks each wheel
  # beside that (the CPU wheel: under 1 GiB). Each install first checks the space it needs, so that
  # it stops before a long download that cannot fit rather than in the middle of it.
  need_disk() {  # KiB the next wheel needs in the checkout and in the temporary folder
    local free_kib tmp_kib
    free_kib=$(df -Pk . | awk 'NR==2 {print $4}')
    tmp_kib=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR==2 {print $4}')
    [ "$tmp_kib" -lt "$free_kib" ] && free_kib=$tmp_kib
    if [ "$free_kib" -lt "$1" ]; then
      say "not enough free disk for the torch wheel: $((free_kib / 1024)) MiB free in $ROOT or ${TMPDIR:-/tmp}, about $(($1 / 1024)) MiB needed"
      say "free some space, or point LIBTORCH / CMAKE_PREFIX_PATH at an existing libtorch 2.11"
      exit 1
    fi
  }
  pip_install=(.venv/bin/pip install -q --disable-pip-version-check --no-cache-dir)
  if [ ${#WHEEL_INDEX[@]} -gt 0 ] && need_disk $((1024 * 1024)) && python3 -m venv .venv &&
      "${pip_install[@]}" "${WHEEL_INDEX[@]}" "torch==${TORCH_VERSION}"; then
    say "installed the CPU wheel (no nvcc here)"
  else
    [ ${#WHEEL_INDEX[@]} -gt 0 ] && say "no CPU wheel reachable: the PyPI wheel is a CUDA build, and configuring against it needs nvcc"
    need_disk $((7 * 1024 * 1024))
    [ -x .venv/bin/pip ] || python3 -m venv .venv
    "${pip_install[@]}" "torch==${TORCH_VERSION}"
  fi
  torch_prefix=$(.venv/bin/python -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
fi
say "libtorch: $torch_prefix"

# ---- build -------------------------------------------------------------------------------
cmake_args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$torch_prefix")
if command -v ccache >/dev/null; then  # rebuilds (and scripts/package_check.sh's) reuse objects
  export CCACHE_BASEDIR="$ROOT"
  cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
[ -n "${FLASHCOS_CUDA_ARCHS:-}" ] && cmake_args+=("-DFLASHCOS_CUDA_ARCHS=${FLASHCOS_CUDA_ARCHS}")
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
cmake "${cmake_args[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
echo "$torch_prefix" >"$BUILD_DIR/torch_prefix.txt"  # for scripts/package_check.sh
ln -sfn "$BUILD_DIR/train" train
say "built ./train ($(./train help >/dev/null && echo ok))"
