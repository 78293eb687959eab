#!/usr/bin/env bash
# Fastmax on the GPU machine: build the Fastmax objects with the CUDA kernels (sm_90), link them
# into a Fastmax-only test binary (so the check does not depend on the rest of the tree
# compiling), run the Fastmax tests, compute-sanitizer memcheck on small cases, and the timing
# report (forward at the original README's shape; causal fwd + bwd at b 4, h 8, d 64, n 16k ..
# 128k with peak memory).
#   scripts/gpu_fastmax_check.sh [tests|sanitizer|timing|all]     (logs under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}
OUT=${OUT:-fastmax-gpu-logs}
mkdir -p "$OUT"
BUILD=${BUILD:-build-fastmax-gpu}
BIN="$BUILD/fastmax_tests"
OBJS="CMakeFiles/flashcos.dir/attention/fastmax/fastmax.cpp.o CMakeFiles/flashcos.dir/attention/fastmax/fastmax_chunked.cpp.o
      CMakeFiles/flashcos.dir/attention/fastmax/fastmax_cuda.cpp.o CMakeFiles/flashcos.dir/attention/fastmax/cuda/fastmax.cu.o
      CMakeFiles/flashcos.dir/attention/fastmax/cuda/fastmax_scan.cu.o
      CMakeFiles/flashcos_tests.dir/tests/test_fastmax.cpp.o CMakeFiles/flashcos_tests.dir/tests/test_fastmax_cuda.cpp.o"
t0=$(date +%s)
{
  PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  [ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DFLASHCOS_CUDA_ARCHS=90
  ninja -C "$BUILD" -j16 $OBJS libflashcos_log.a || exit 1
  # The whole flashcos_tests when the rest of the tree links; else flashcos_tests' link line with
  # our objects in place of libflashcos.a.
  if ninja -C "$BUILD" -j16 flashcos_tests; then
    cp "$BUILD/flashcos_tests" "$BIN"
  else
    LINE=$(grep -A12 '^build flashcos_tests ' "$BUILD/build.ninja")
    LIBS=$(echo "$LINE" | grep ' LINK_LIBRARIES = ' | sed 's/^ *LINK_LIBRARIES = //; s/libflashcos\.a//; s/"//g')
    LPATH=$(echo "$LINE" | grep ' LINK_PATH = ' | sed 's/^ *LINK_PATH = //')
    (cd "$BUILD" && g++ -o fastmax_tests $OBJS $LPATH -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib $LIBS) || exit 1
  fi
} > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"

rc=0
if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  timeout ${TEST_TIMEOUT:-200} "$BIN" --gtest_filter="${FILTER:-*Fastmax*}" > "$OUT/tests.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED) |tests? ran|Failure|err .* plain" "$OUT/tests.log" | tail -40
fi
if [ "$WHAT" = all ] || [ "$WHAT" = sanitizer ]; then
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -n "$SAN" ]; then
    timeout ${SAN_TIMEOUT:-240} "$SAN" --tool memcheck --error-exitcode 3 "$BIN" \
      --gtest_filter='Gpu/FastmaxCuda.ForwardAndGradsVsFp64/bf16_d64_p2_causal_i100_j301:Gpu/FastmaxCuda.ForwardAndGradsVsFp64/bf16_d32_p2_full_i100_j301:Gpu/FastmaxCuda.ForwardAndGradsVsFp64/bf16_d16_p1_causal_i257_j257:Gpu/FastmaxCuda.ForwardAndGradsVsFp64/f32_d128_p2_full_i100_j301:Gpu/FastmaxCuda.ForwardAndGradsVsFp64/f16_d16_p1_causal_i257_j257:FastmaxCudaShapes.*' \
      > "$OUT/sanitizer.log" 2>&1
    echo "compute-sanitizer memcheck rc=$?"
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" | tail -4
    # The fused moment scan (shared-memory atomics, cp.async double buffer): racecheck.
    timeout ${SAN_TIMEOUT:-240} "$SAN" --tool racecheck --error-exitcode 3 "$BIN" \
      --gtest_filter='Gpu/FastmaxCuda.ForwardAndGradsVsFp64/bf16_d64_p2_causal_i257_j257:Gpu/FastmaxCuda.ForwardAndGradsVsFp64/bf16_d32_p2_full_i100_j301' \
      > "$OUT/racecheck.log" 2>&1
    echo "compute-sanitizer racecheck rc=$?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/racecheck.log" | tail -4
  else
    echo "compute-sanitizer not found"
  fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = timing ]; then
  FLASHCOS_FASTMAX_TIMING=1 timeout ${TIMING_TIMEOUT:-200} "$BIN" --gtest_filter='FastmaxCudaTiming.*' > "$OUT/timing.log" 2>&1
  grep '^FASTMAX' "$OUT/timing.log"
  grep -E "Failure|exception" "$OUT/timing.log" | head -5
fi
exit $rc
