#!/usr/bin/env bash
# Checks flashcos::attention as a package other projects use (part of scripts/test.sh):
#   1. a CPU build of the library alone, `cmake --install` into a temporary prefix;
#   2. examples/attention_layer configured against that prefix with find_package(flashcos),
#      built and run (it checks its output against plain_cosine_sim_attention);
#   3. the installed library links no spdlog, nlohmann-json or zlib (its DT_NEEDED list);
#   4. examples/parent_project builds flashcos from source with add_subdirectory.
# Usage: scripts/package_check.sh <libtorch cmake prefix>   (scripts/test.sh passes it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TORCH_PREFIX=${1:?usage: scripts/package_check.sh <libtorch cmake prefix>}
WORK=${PACKAGE_CHECK_DIR:-$ROOT/build-package}
JOBS=${JOBS:-$(nproc)}
say() { printf '[package] %s\n' "$*"; }
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$ROOT"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
rm -rf "$WORK"; mkdir -p "$WORK"

say "1. library-only CPU build, installed into $WORK/prefix"
cmake -S . -B "$WORK/lib" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX" \
  -DFLASHCOS_ENABLE_CUDA=OFF -DFLASHCOS_BUILD_APP=OFF -DFLASHCOS_BUILD_TESTS=OFF -DFLASHCOS_INSTALL=ON \
  "${launcher[@]}" >"$WORK/lib.log"
cmake --build "$WORK/lib" -j "$JOBS" >>"$WORK/lib.log"
cmake --install "$WORK/lib" --prefix "$WORK/prefix" >>"$WORK/lib.log"
find "$WORK/prefix" -type f | sed "s#$WORK/prefix/#  #" | sort

say "2. examples/attention_layer against the installed package"
cmake -S examples/attention_layer -B "$WORK/example" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$WORK/prefix;$TORCH_PREFIX" "${launcher[@]}" >"$WORK/example.log"
cmake --build "$WORK/example" -j "$JOBS" >>"$WORK/example.log"
"$WORK/example/attention_layer"

say "3. what the installed library links"
lib=$(find "$WORK/prefix" -name 'libflashcos_attention.so' | head -1)
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
printf '  %s\n' $needed
if printf '%s\n' $needed | grep -Eq 'spdlog|fmt|nlohmann|^libz\.so'; then
  say "FAIL: flashcos::attention links spdlog / fmt / nlohmann-json / zlib"; exit 1
fi
grep -Eq 'spdlog|nlohmann|ZLIB' "$WORK/prefix"/lib*/cmake/flashcos/flashcosTargets.cmake &&
  { say "FAIL: the exported target names spdlog / nlohmann-json / zlib"; exit 1; }

say "4. examples/parent_project: flashcos through add_subdirectory"
cmake -S examples/parent_project -B "$WORK/parent" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX" -DFLASHCOS_ENABLE_CUDA=OFF "${launcher[@]}" >"$WORK/parent.log"
cmake --build "$WORK/parent" -j "$JOBS" >>"$WORK/parent.log"
"$WORK/parent/attention_layer"
say "ok"
