#!/usr/bin/env bash
# The test command (README, .ci/run): set up and build (scripts/setup.sh), run every GoogleTest
# suite through ctest (GPU suites skip on machines without a GPU), then check the library as an
# installable package (scripts/package_check.sh: install, find_package consumer, add_subdirectory).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-$(nproc)}"
scripts/package_check.sh "$(cat "${BUILD_DIR:-build}/torch_prefix.txt")"
