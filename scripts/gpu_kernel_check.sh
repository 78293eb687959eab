#!/usr/bin/env bash
# GPU check of the fused attention kernels, run on the GPU machine from the repository root:
#   scripts/gpu_kernel_check.sh [build] [tests] [sanitize] [bench]     (default: all four)
# build     configure + build flashcos_tests and ./train for sm_90 (FLASHCOS_CUDA_ARCHS overrides)
# tests     the CUDA attention suite (tests/test_attention_cuda.cpp) and the fused validation test
# sanitize  compute-sanitizer memcheck and racecheck on a small subset, our kernels only
# bench     ./train bench: fused vs libtorch SDPA flash / cuDNN, b4 h8, d64 and d128, causal and
#           not (fwd, bwd, fwd+bwd TFLOP/s); BENCH_LENS (default 8192), BENCH_DTYPES (default bf16)
# Logs go to $OUT (default out/gpu_kernel_check); a summary table is printed last.
set -uo pipefail

OUT=${OUT:-out/gpu_kernel_check}
BUILD=${BUILD:-build}
ARCHS=${FLASHCOS_CUDA_ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build tests sanitize bench)
summary=()
has_step() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

if has_step build; then
  prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  start=$(date +%s)
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DFLASHCOS_CUDA_ARCHS="$ARCHS" \
       > "$OUT/configure.log" 2>&1 &&
     cmake --build "$BUILD" -j"$JOBS" --target flashcos_tests train > "$OUT/build.log" 2>&1; then
    summary+=("build: ok ($(( $(date +%s) - start )) s)")
  else
    tail -40 "$OUT/build.log" "$OUT/configure.log"
    echo "build: FAILED"
    exit 1
  fi
fi

TESTS="$BUILD/flashcos_tests"
if has_step tests; then
  "$TESTS" --gtest_filter='Cuda/FusedAttention.*:FusedAttentionMisc.*:AttentionValidation.FusedBackendHeadDim' \
      > "$OUT/tests.log" 2>&1
  rc=$?
  grep -E '^\[ (errors|memory) ' "$OUT/tests.log" > "$OUT/errors.txt"
  summary+=("tests: rc $rc, $(grep -c '^\[       OK' "$OUT/tests.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/tests.log") failed")
  grep -E '^\[  FAILED  \].*\(' "$OUT/tests.log" | head -20
fi

if has_step sanitize; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  subset='Cuda/FusedAttention.MatchesFloat64Reference/d64_mask_bias_head_causal_bf16:Cuda/FusedAttention.MatchesFloat64Reference/d80_grouped_mask_bias_batch_f16:Cuda/FusedAttention.MatchesFloat64Reference/d32_cross_63x127_f32:Cuda/FusedAttention.MatchesFloat64Reference/d64_causal_i_gt_j_bf16:Cuda/FusedAttention.MatchesFloat64Reference/d128_groups2_causal_bf16'
  # The Hopper family (d 64 / 128, no mask, no bias; on an H100): rows without keys, cross
  # lengths, one key, grouped heads.
  subset+=':Cuda/FusedAttention.MatchesFloat64Reference/d64_causal_i_gt_j_1000x127_bf16'
  # (d128_cross_257x1000 is left out: under racecheck it stops with "Internal Sanitizer Error: the
  # Sanitizer failed to handle a hardware exception" with either kernel family, FLASHCOS_HOPPER=0
  # included; memcheck on it is clean. docs/kernels.md, 2026-11-23.)
  subset+=':Cuda/FusedAttention.MatchesFloat64Reference/d128_causal_2049_bf16'
  subset+=':Cuda/FusedAttention.MatchesFloat64Reference/d128_len1_bf16'
  subset+=':Cuda/FusedAttention.MatchesFloat64Reference/d64_grouped_1000x2049_bf16'
  for tool in memcheck racecheck; do
    if [ -x "$CS" ]; then
      "$CS" --tool "$tool" --kernel-name kns=flashcos --error-exitcode 9 \
        "$TESTS" --gtest_filter="$subset" > "$OUT/sanitize_$tool.log" 2>&1
      rc=$?
      summary+=("sanitize $tool: rc $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)")
    else
      summary+=("sanitize $tool: compute-sanitizer not found")
    fi
  done
fi

if has_step bench; then
  for causal in "" "--causal"; do
    "$BUILD/train" bench --impls fused,sdpa-flash,sdpa-cudnn --dtype "${BENCH_DTYPES:-bf16}" \
      --dim-head 64,128 --seq-lens "${BENCH_LENS:-8192}" --batch 4 --heads 8 --iters 20 $causal \
      > "$OUT/bench${causal:+_causal}.log" 2>&1
    summary+=("bench ${causal:-non-causal}: rc $? (table in bench${causal:+_causal}.log)")
  done
fi

echo "---- gpu_kernel_check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
for line in "${summary[@]}"; do echo "  $line"; done
