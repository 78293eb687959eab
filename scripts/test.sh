#!/usr/bin/env bash
# The test command (README, .ci/run): set up and build (scripts/setup.sh), then run every
# GoogleTest suite through ctest. GPU suites skip on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-$(nproc)}"
