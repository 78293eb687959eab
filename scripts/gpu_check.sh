#!/usr/bin/env bash
# The one GPU check: build, GPU tests, trainer throughput, attention benchmarks; logs under $OUT,
# a short table printed last. Run on the GPU machine from the repository root:
#   scripts/gpu_check.sh [build] [tests] [train] [profile] [quality] [quality-seeds] [sample] [sanitize] [bench] [matrix] [converge] [fastmax] [tune] [hopper] [fwdkinds] [bwdkinds] [determinism] [coverage] [scaling] [clocks]
#   (default: build tests train bench)
# tune: needs a build with FLASHCOS_TUNING=ON (the env variable is passed to cmake); times every
# tile variant of the fused kernels (attention/cosine/cuda/tuning.h) at bf16 b4 h8 n8192 d64 / d128,
# causal or not, after running the d64 / d128 CUDA test cases with that variant.
# profile: GPU time per kernel (train --profile-steps) of the sdpa and fused runs at seq 8192, batch 4,
# grad-accum 1 (PROFILE_STEPS, default 4; PROFILE_IMPLS, default "sdpa fused"); the reports go to the
# log folder.
# matrix: fused vs SDPA flash / cuDNN for bf16, fp16 x d64, d128 x causal or not at n 4096..16384,
# MATRIX_ROUNDS (default 2) rounds per configuration (bench --rounds).
# fastmax: `bench --attention fastmax` to n 131072 and FASTMAX_STEPS (default 2000) training steps
# at seq 2048 with --attention fastmax beside the cosine (sdpa) model.
# hopper: the CUDA attention grid once as built (the Hopper family where it applies) and once with
# FLASHCOS_HOPPER=0 (the sm_80 kernels only), then d64 / d128 kernel timings (HOPPER_DTYPES, default
# bf16; HOPPER_SEQ, default 8192) beside SDPA flash / cuDNN; HOPPER_SM80_BENCH=1 adds the sm_80
# kernels' timings.
# fwdkinds: the Hopper forward kinds side by side (FLASHCOS_HOPPER_FWD=ws, ws-overlap, ws-rounded,
# ws-packed, ws-qsmem: the warp-specialised kernel without and with its overlapped schedule, that
# dividing by the sum of the 16-bit P from the tensor cores, and from the packed P, and the default
# with d 128's Q read from shared memory), forward only, bf16
# d64 / d128, n 8192, causal or not, and the attention grid under each warp-specialised kind, as
# launched and on a persistent grid of 3 CTAs (FLASHCOS_HOPPER_FWD_PERSISTENT=3).
# bwdkinds: the Hopper backward kinds side by side (FLASHCOS_HOPPER_BWD, bwd_hopper.cuh): the attention
# grid and the deterministic tests under each of BWD_GRID_KINDS (default ws-atomic) and on a persistent grid
# of 3 CTAs (FLASHCOS_HOPPER_BWD_PERSISTENT=3), then backward only,
# bf16 / fp16, d64 / d128, n 8192 / 16384, causal or not, for each of BWD_KINDS (default "ws-atomic ws"),
# BWDKINDS_ROUNDS (default 2) rounds. The table lists TFLOP/s in that order. STEP_TIMEOUT: seconds
# allowed to each of these commands (none by default).
# clocks: the SM clock and power while each implementation runs alone (the kernels run at the board's
# power limit, docs/kernels-tried.md): CLOCKS_REPEATS (default 2) rounds of `bench --only-backwards`, one
# process per dtype of CLOCKS_DTYPES (default "bf16 fp16") and implementation of CLOCKS_IMPLS (default
# "fused sdpa-cudnn"), at b4 h8 d CLOCKS_DIM (128) n CLOCKS_SEQ (8192), 300 timed iterations after the
# warm-up, then one bf16 `--only-forwards` each; nvidia-smi samples every 25 ms, summarised per process
# over the last timed second by scripts/clock_summary.sh (clocks_summary.txt; a row each in the table).
# determinism: backward time plain, --deterministic (the dQ grid) and --deterministic with the ordered
# adds (FLASHCOS_DQ_GRID=0), bf16 d64 / d128, n 8192, causal or not.
# scaling: data-parallel scaling at seq 8192 (docs/scaling.md): the default model, batch 4 per GPU,
# grad-accum 4, SCALING_STEPS (default 100) steps with --profile-steps 5 and a 64-window validation at
# the end, on 1 GPU and through scripts/launch.sh on each of SCALING_GPUS (default: 2 and 4, those the
# machine has), SCALING_ROUNDS (default 2) rounds; then 1-GPU runs of each one's global batch
# (grad-accum 4N), side by side on separate GPUs. The table: tokens/s, the ratio to 1 GPU, the exposed
# communication and the validation loss.
# coverage: ours against SDPA flash / cuDNN beyond the Hopper family's common case: d96, a key mask
# (--mask-prob 0.1), a head bias with its gradient (--bias head), bf16 n 8192 causal.
# quality-seeds: two programs (QUALITY_A_ENV, QUALITY_B_ENV) over QUALITY_SEEDS with the quality recipe, paired by seed,
# and the mean (standard error) of their differences (the block below says more).
# quality: 500-step runs at seq 8192 (QUALITY_RUNS of default, unfused, unfused2, det, det2, unfused-det, seed, cosine, learned, fp16,
# bf16, or name=--flag,value,... for the default recipe plus those flags; a value cannot hold a comma) with a 64-window validation eval each (each run's metrics.jsonl is packed with the logs as quality_<name>_metrics.jsonl); sample: sample --length 2048 / 16384 wall time from the newest quality checkpoint (2048-raw: from the corpus unpacked, as data/enwik8 is).
# TRAIN_RUNS: names of throughput runs (sdpa-8192 fused-8192 plain-2048 sdpa-2048 rope-8192 learned-8192
# unfused-8192 fused-1024 ddp1-8192; nograph-8192 / nograph-1024: fused with --cuda-graph off).
# tests: TESTS_FILTER (a gtest filter for the one-process run), TESTS_CTEST=0 skips the ./train-process
# suites.
# DATA: a corpus (default .carry/wiki-text-substitute.gz, copied there from ../shared/data).
# FWD_GRID_KINDS: the forward kinds whose attention grid fwdkinds runs (default "ws ws-overlap ws-rounded ws-packed ws-qsmem").
# PREBUILT=1 (no build step): $BUILD/train, flashcos_tests and attention/libflashcos_attention.so.* were
# built on another machine and carried; the loader is pointed at them, at the local libtorch and at
# PREBUILT_LIBS (a folder of the build machine's shared libraries that this one lacks, e.g. spdlog).
# TRAIN_ARGS: more flags for every throughput run (e.g. --split 0.9,0.05,0.05 with a shorter corpus).
# TRAIN_STEPS (default 40) steps per throughput run; CONVERGE_STEPS (default 500) for `converge`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_check}
BUILD=${BUILD:-build}
DATA=${DATA:-.carry/wiki-text-substitute.gz}
TRAIN_STEPS=${TRAIN_STEPS:-40}
CONVERGE_STEPS=${CONVERGE_STEPS:-500}
# Logs go to $OUT/logs and are packed into $OUT/logs.tgz at the end (the device returns few files);
# checkpoints of the timing runs go to a scratch folder, not $OUT.
LOG="$OUT/logs"
CK=${CK:-$(mktemp -d)}
mkdir -p "$LOG"
pack() { [ -d "$LOG" ] && tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"; }
trap 'pack; exit 124' TERM
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build tests train bench)
if [ "${PREBUILT:-0}" = 1 ]; then  # carried binaries: no build step, whatever the list says
  kept=(); for s in "${steps[@]}"; do [ "$s" != build ] && kept+=("$s"); done; steps=("${kept[@]}")
fi
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
table=()
row() { table+=("$(printf '%-34s %s' "$1" "$2")"); }
# "PASSED n SKIPPED n FAILED n" from a GoogleTest log (the count lines only, not the per-test ones).
gtest_counts() {
  grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ tests?[.,]' "$1" | sed -E 's/^\[ +([A-Z]+) +\] ([0-9]+) tests?.*/\1 \2/' | tr '\n' ' '
}

# Column `col` of the fused rows of a `./train bench` log ("seq_len impl ms TFLOP/s ..."), on one line.
fused_col() {  # log, col
  grep -E '^ +[0-9]+ +fused' "$1" | awk -v c="$2" '{print $c}' | tr '\n' ' '
}
# Mean and max of the gradient norm before clipping over a training log's progress lines (logged
# since b43bb8e; nothing for older logs).
grad_norms() {  # log
  grep -oE 'grad norm [0-9.]+' "$1" | awk '{ s += $3; if ($3 > m) m = $3; ++n } END { if (n) printf "grad norm mean %.3f max %.3f", s / n, m }'
}
# Each validation of a training log as "step bpc", one a line.
val_step_bpcs() {  # log
  grep -oE 'step [0-9]+ validation: loss [0-9.]+ nats, [0-9.]+ bpc' "$1" | awk '{print $2, $7}'
}
# The validation bits/char of every eval in a training log, on one line.
val_bpcs() { val_step_bpcs "$1" | awk '{print $2}' | tr '\n' ' '; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$LOG/gpu.txt" 2>&1
row "gpu" "$(head -1 "$LOG/gpu.txt")"

if has build; then
  t0=$(date +%s)
  prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DFLASHCOS_CUDA_ARCHS="${FLASHCOS_CUDA_ARCHS:-90}" \
        -DFLASHCOS_TUNING="${FLASHCOS_TUNING:-OFF}" \
        > "$LOG/configure.log" 2>&1 && cmake --build "$BUILD" -j "$(nproc)" > "$LOG/build.log" 2>&1; then
    row "build" "ok ($(( $(date +%s) - t0 )) s)"
  else
    tail -30 "$LOG/configure.log" "$LOG/build.log"; echo "build FAILED"; pack; exit 1
  fi
fi
TRAIN="$BUILD/train"
if [ "${PREBUILT:-0}" = 1 ]; then
  # A carried build has the versioned library (then .so.0 is made its link) or the .so.0 file itself.
  so=$(ls "$BUILD"/attention/libflashcos_attention.so.*.*.* 2>/dev/null | head -1)
  if [ -n "$so" ]; then
    ln -sf "$(basename "$so")" "$BUILD/attention/libflashcos_attention.so.0"
  elif [ ! -e "$BUILD/attention/libflashcos_attention.so.0" ]; then
    echo "PREBUILT=1: no $BUILD/attention/libflashcos_attention.so.0 (or a versioned one) to load" >&2; pack; exit 1
  fi
  torch_lib=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
  export LD_LIBRARY_PATH="$PWD/$BUILD/attention:$torch_lib:/usr/local/cuda/lib64${PREBUILT_LIBS:+:$PWD/$PREBUILT_LIBS}:${LD_LIBRARY_PATH:-}"
  row "prebuilt" "$(ldd "$TRAIN" | grep -c 'not found') libraries not found"
fi

if has tests; then
  # The suites that start ./train processes run under ctest (one process per test, as in CI); the
  # rest in one process.
  proc_suites="TrainCli.*:ResumeCli.*:Dist*:LossScaler.*"
  stdbuf -oL -eL "$BUILD/flashcos_tests" --gtest_filter="${TESTS_FILTER:-*}:-$proc_suites" > "$LOG/tests.log" 2>&1
  rc=$?
  row "tests (in one process)" "rc $rc: $(gtest_counts "$LOG/tests.log")"
  if [ "${TESTS_CTEST:-1}" = 1 ]; then
    ctest --test-dir "$BUILD" -j 8 -R '^(TrainCli|ResumeCli|Dist|LossScaler)' --output-on-failure > "$LOG/tests_ctest.log" 2>&1
    row "tests (./train processes, ctest)" "rc $?: $(grep -E 'tests passed' "$LOG/tests_ctest.log")"
  fi
fi

# Throughput of one training configuration: the tokens/s and peak memory of the last progress line.
train_run() {  # name, args...   (LAUNCH: a launcher to put in front, e.g. scripts/launch.sh --nproc 1)
  local name=$1; shift
  ${LAUNCH:-} "$TRAIN" --data "$DATA" --steps "$TRAIN_STEPS" --log-every 10 --validate-every 1000000 --generate-every 0 \
      --save-every 1000000 --checkpoint-dir "$CK" --run "$name" "$@" ${TRAIN_ARGS:-} > "$LOG/train_$name.log" 2>&1
  local rc=$? last
  last=$(grep -E 'step [0-9]+/' "$LOG/train_$name.log" | tail -1 | sed -E 's/.*\| ([0-9.]+k tok\/s).*(peak mem [0-9.]+ GiB).*/\1, \2/')
  row "train $name" "rc $rc: $last"
}

if has train; then
  runs=${TRAIN_RUNS:-"sdpa-8192 fused-8192 plain-2048 sdpa-2048"}
  for r in $runs; do
    case $r in
      sdpa-8192) train_run sdpa-8192 --seq-len 8192 --batch 4 --attention-impl sdpa ;;
      fused-8192) train_run fused-8192 --seq-len 8192 --batch 4 --use-cuda-kernel ;;
      nograph-8192) train_run nograph-8192 --seq-len 8192 --batch 4 --use-cuda-kernel --cuda-graph off ;;
      nograph-1024) train_run nograph-1024 --seq-len 1024 --batch 32 --use-cuda-kernel --cuda-graph off ;;
      plain-2048) train_run plain-2048 --seq-len 2048 --batch 4 --attention-impl plain ;;
      sdpa-2048) train_run sdpa-2048 --seq-len 2048 --batch 4 --attention-impl sdpa ;;
      rope-8192) train_run rope-8192 --seq-len 8192 --batch 4 --use-cuda-kernel --pos rope ;;
      learned-8192) train_run learned-8192 --seq-len 8192 --batch 4 --use-cuda-kernel --pos learned ;;
      unfused-8192) FLASHCOS_FUSED_OPS=0 train_run unfused-8192 --seq-len 8192 --batch 4 --use-cuda-kernel ;;
      fused-1024) train_run fused-1024 --seq-len 1024 --batch 32 --use-cuda-kernel ;;
      ddp1-8192) LAUNCH="scripts/launch.sh --nproc 1" train_run ddp1-8192 --seq-len 8192 --batch 4 --use-cuda-kernel ;;
    esac
  done
fi

if has profile; then
  for impl in ${PROFILE_IMPLS:-sdpa fused}; do
    flag="--attention-impl sdpa"; [ $impl = fused ] && flag="--use-cuda-kernel"
    n=${PROFILE_STEPS:-4}
    "$TRAIN" --data "$DATA" --seq-len 8192 --batch 4 --grad-accum 1 --steps $((n + 2)) --profile-steps "$n" \
        --log-every 1 --validate-every 1000000 --generate-every 0 --save-every 1000000 --checkpoint-dir "$CK" \
        --run prof-$impl $flag ${TRAIN_ARGS:-} > "$LOG/profile_$impl.log" 2>&1
    row "profile $impl" "rc $?: $(grep -oE 'kernel time [0-9.]+ ms/step' "$LOG/profile_$impl.log")"
  done
fi

if has converge; then
  for impl in sdpa fused; do
    flag="--attention-impl sdpa"; [ $impl = fused ] && flag="--use-cuda-kernel"
    "$TRAIN" --data "$DATA" --seq-len 8192 --batch 4 --steps "$CONVERGE_STEPS" --validate-every 100 --val-windows 16 \
        --generate-every 0 --save-every 100000 --log-every 50 --checkpoint-dir "$CK" --run conv-$impl $flag \
        > "$LOG/converge_$impl.log" 2>&1
    row "converge $impl (val bpc by 100s)" "$(val_bpcs "$LOG/converge_$impl.log")"
  done
fi

# Validation bpc after QUALITY_STEPS (default 500) steps at seq 8192 (fused kernels, rope), for the seed's
# recipe (lr 2e-4 constant) and the warmup + cosine recipe (lr 1e-3, 100 warmup steps, cosine to 0.1x),
# each checkpoint evaluated on 64 evenly spaced validation windows; QUALITY_RUNS picks (seed cosine fp16).
# QENV (words VAR=value, set for the call): the environment of that run's training.
quality_run() {  # name, args...
  local name=$1; shift
  env ${QENV:-} "$TRAIN" --data "$DATA" --seq-len 8192 --batch 4 --use-cuda-kernel --steps "${QUALITY_STEPS:-500}" \
      --validate-every 100 --val-windows 16 --generate-every 0 --save-every 100000 --log-every 50 \
      --checkpoint-dir "$CK" --run "q-$name" "$@" > "$LOG/quality_$name.log" 2>&1
  local rc=$?
  cp "$CK/q-$name/metrics.jsonl" "$LOG/quality_${name}_metrics.jsonl" 2>/dev/null  # the curve, packed with the logs
  "$TRAIN" eval --checkpoint "$CK/q-$name" --which val --max-windows 64 > "$LOG/quality_${name}_eval.log" 2>&1
  row "quality $name val bpc, each eval" "rc $rc: $(val_bpcs "$LOG/quality_$name.log")"
  row "  $name eval 64 val windows" "$(grep -oE '[0-9.]+ bits/char' "$LOG/quality_${name}_eval.log") $(grep -E 'step [0-9]+/' "$LOG/quality_$name.log" | tail -1 | grep -oE '[0-9.]+k tok/s') $(grad_norms "$LOG/quality_$name.log")"
}
if has quality; then
  for q in ${QUALITY_RUNS:-seed cosine}; do
    case $q in
      default) quality_run default ;;
      unfused) FLASHCOS_FUSED_OPS=0 quality_run unfused ;;  # the default with the composite libtorch ops
      unfused2) FLASHCOS_FUSED_OPS=0 quality_run unfused2 ;;  # ... again: the run-to-run spread of one program
      det) quality_run det --deterministic ;;  # bit-repeatable runs: the fused step, ...
      det2) quality_run det2 --deterministic ;;  # ... the same again (must match det exactly), ...
      unfused-det) FLASHCOS_FUSED_OPS=0 quality_run unfused-det --deterministic ;;  # ... the composite ops
      seed) quality_run seed --seed-recipe ;;
      cosine) quality_run cosine --lr 1e-3 --warmup 100 --schedule cosine --min-lr-ratio 0.1 ;;
      cosine2e-3|cosine3e-3) quality_run $q --lr ${q#cosine} --warmup 100 --schedule cosine --min-lr-ratio 0.1 ;;
      learned) quality_run learned --pos learned --lr 2e-4 --warmup 0 --schedule constant ;;
      fp16) quality_run fp16 --precision fp16 ;;
      bf16) quality_run bf16 --precision bf16 ;;
      *=*) quality_run "${q%%=*}" $(echo "${q#*=}" | tr ',' ' ') ;;  # name=--flag,value,...: the default recipe plus those
    esac
  done
fi

# Two programs over seeds: for each of QUALITY_SEEDS (default 1 .. 6) the quality recipe under
# QUALITY_A_ENV (default: nothing, the default program) and under QUALITY_B_ENV (default
# FLASHCOS_FUSED_OPS=0, the composite ops), both with QUALITY_SEED_ARGS (e.g. --deterministic); then
# per seed A - B at every 100 steps and on the 64-window eval, and over the seeds the mean of those
# differences with its standard error. QUALITY_SPREAD=1 also runs B a second time per seed and
# reports B again - B the same way: what the same program gives against itself (no program is
# bit-repeatable without --deterministic). QUALITY_GPUS (e.g. "0 1 2 3"): the seeds are dealt out
# to those GPUs, one worker each. QUALITY_ORDER=alternate runs B first for even seeds (A first is
# the default: over 14 pairs of runs I5 / I6 the first run of a pair ended 0.015 (0.013) bpc higher,
# docs/quality.md, "Over seeds"). One program run twice differs by about 0.05 bpc (standard
# deviation) at step 500 on this recipe (docs/quality.md, "Over seeds"): a single pair says
# little, 20 pairs resolve about 0.03. The "band" rows: how many seeds keep |A - B| within QUALITY_BAND
# (default 0.02, issue 16 point 4) at every validation at a multiple of QUALITY_BAND_EVERY (default 100) steps.
if has quality-seeds; then
  diffs="$LOG/quality_seeds_diffs.txt" spread="$LOG/quality_seeds_spread.txt"
  : > "$diffs"; : > "$spread"
  env_a=${QUALITY_A_ENV:-} env_b=${QUALITY_B_ENV-FLASHCOS_FUSED_OPS=0}
  bpcs() {  # name: the bpc of each validation, then the 64-window eval, one a line
    { val_bpcs "$LOG/quality_$1.log"; grep -oE '[0-9.]+ bits/char' "$LOG/quality_$1_eval.log"; } | grep -oE '[0-9]+\.[0-9]+'
  }
  minus() { paste -d ' ' <(bpcs "$1") <(bpcs "$2") | awk 'NF == 2 {printf "%+.4f ", $1 - $2}'; }
  # Largest |A - B| over the validations at multiples of QUALITY_BAND_EVERY (default 100) steps.
  largest_d() {  # name A, name B
    paste -d " " <(val_step_bpcs "$LOG/quality_$1.log") <(val_step_bpcs "$LOG/quality_$2.log") | awk -v e="${QUALITY_BAND_EVERY:-100}" \
      'NF != 4 || $1 != $3 { bad = 1; next }  # one run has fewer validations: it stopped early
       $1 % e == 0 { d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d; ++n }
       END { if (n && !bad) printf "%.4f", m; else printf "incomplete" }'
  }
  seeds_worker() {  # seeds...: each seed's runs, its differences appended to the files as "seed d..."
    local seed order prog penv
    for seed in "$@"; do
      order="A B"
      [ "${QUALITY_ORDER:-}" = alternate ] && [ $(( seed % 2 )) -eq 0 ] && order="B A"  # even seeds: B first
      for prog in $order; do
        if [ "$prog" = A ]; then penv=$env_a; else penv=$env_b; fi
        QENV="$penv" quality_run "$prog-s$seed" --seed "$seed" ${QUALITY_SEED_ARGS:-}
      done
      echo "$seed $(minus "A-s$seed" "B-s$seed")" >> "$diffs"
      if [ "${QUALITY_SPREAD:-0}" = 1 ]; then
        QENV="$env_b" quality_run "B2-s$seed" --seed "$seed" ${QUALITY_SEED_ARGS:-}
        echo "$seed $(minus "B2-s$seed" "B-s$seed")" >> "$spread"
      fi
    done
  }
  read -ra qseeds <<< "${QUALITY_SEEDS:-1 2 3 4 5 6}"
  read -ra qgpus <<< "${QUALITY_GPUS:-}"
  if [ ${#qgpus[@]} -le 1 ]; then
    CUDA_VISIBLE_DEVICES=${qgpus[0]:-${CUDA_VISIBLE_DEVICES:-}} seeds_worker "${qseeds[@]}"
  else
    for g in "${!qgpus[@]}"; do
      mine=(); for i in "${!qseeds[@]}"; do [ $(( i % ${#qgpus[@]} )) -eq "$g" ] && mine+=("${qseeds[$i]}"); done
      CUDA_VISIBLE_DEVICES=${qgpus[$g]} seeds_worker "${mine[@]}" > /dev/null 2>&1 &
    done
    wait
  fi
  mean_se() {  # file of "seed d...": mean (standard error) of each column of d over the lines
    awk '{ for (i = 2; i <= NF; ++i) { s[i] += $i; q[i] += $i * $i } if (NF > m) m = NF; ++n }
      END { for (i = 2; i <= m; ++i) { mu = s[i] / n; v = n > 1 ? (q[i] - n * mu * mu) / (n - 1) : 0; if (v < 0) v = 0;
            printf "%+.4f (%.4f) ", mu, sqrt(v / n) } }' "$1"
  }
  within_band() {  # run A, run B, their file of "seed d...": how many seeds keep |A - B| within QUALITY_BAND
    while read -r seed _; do echo "$seed $(largest_d "$1-s$seed" "$2-s$seed")"; done < <(sort -n "$3") |
      awk -v b="${QUALITY_BAND:-0.02}" -v e="${QUALITY_BAND_EVERY:-100}" '
      { n++; if ($2 ~ /^[0-9.]+$/ && $2 + 0 <= b + 1e-9) k++; list = list sprintf(" %s:%s", $1, $2) }
      END { printf "%d of %d seeds within +-%s at every %s steps (seed:largest |d|%s)", k, n, b, e, list }'
  }
  while read -r seed d; do row "  seed $seed: A - B" "$d"; done < <(sort -n "$diffs")
  row "quality-seeds A - B: mean (s.e.)" "$(mean_se "$diffs")"
  row "quality-seeds A - B: band" "$(within_band A B "$diffs")"
  if [ -s "$spread" ]; then
    while read -r seed d; do row "  seed $seed: B again - B" "$d"; done < <(sort -n "$spread")
    row "quality-seeds B again - B: mean (s.e.)" "$(mean_se "$spread")"
    row "quality-seeds B again - B: band" "$(within_band B2 B "$spread")"
  fi
  row "  (columns)" "each validation step (--validate-every: 100 unless QUALITY_SEED_ARGS says), then the 64-window eval; A: ${env_a:-default} B: ${env_b:-default}${QUALITY_ORDER:+; order: $QUALITY_ORDER}"
fi

# Sampling speed from the newest quality checkpoint: wall time of `sample --length` 2048 and 16384
# (fused decode kernel + CUDA graph), and 2048 with the decode step on libtorch ops
# (FLASHCOS_DECODE_KERNEL=0) and without the graph (FLASHCOS_DECODE_GRAPH=0) for comparison.
sample_run() {  # tag, length, env...
  local tag=$1 len=$2; shift 2
  local t0; t0=$(date +%s.%N)
  env "$@" "$TRAIN" sample --checkpoint "$ck" --data "$DATA" --length "$len" --seed 1 > "$LOG/sample_$tag.log" 2>&1
  local rc=$?
  row "sample $tag" "rc $rc: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}') s wall; $(grep -oE '[0-9.]+ bytes/s.*' "$LOG/sample_$tag.log" | tail -1)"
}
if has sample; then
  ck=$(ls -td "$CK"/q-* 2>/dev/null | head -1)
  t0=$(date +%s.%N); "$TRAIN" --help > /dev/null 2>&1
  row "process start + exit (--help)" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}') s wall"
  for s in ${SAMPLE_RUNS:-1 2048 2048-again 2048-raw 16384 2048-torch-ops 2048-no-graph}; do
    case $s in
      2048-torch-ops) sample_run $s 2048 FLASHCOS_DECODE_KERNEL=0 ;;
      2048-no-graph) sample_run $s 2048 FLASHCOS_DECODE_GRAPH=0 ;;
      2048-raw)  # the corpus unpacked (what data/enwik8 is): no inflating to reach the prime
        raw=$(mktemp); gunzip -c "$DATA" > "$raw" 2>/dev/null || cp "$DATA" "$raw"
        DATA=$raw sample_run $s 2048; rm -f "$raw" ;;
      *) sample_run $s "${s%%-*}" ;;
    esac
  done
  # SAMPLE_NCU=1: GPU time of every kernel of a 6-byte sample (prefill, then five decode steps) as CSV.
  if [ "${SAMPLE_NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        "$TRAIN" sample --checkpoint "$ck" --data "$DATA" --length 6 --seed 1 > "$LOG/sample_ncu.csv" 2> "$LOG/sample_ncu.err"
    row "sample ncu (6 bytes)" "rc $?: $(grep -c gpu__time_duration "$LOG/sample_ncu.csv") kernels in sample_ncu.csv"
  fi
fi

if has matrix; then
  for c in "--causal" ""; do
    tag=$([ -n "$c" ] && echo causal || echo full)
    "$TRAIN" bench $c --dtype bf16,fp16 --dim-head 64,128 --seq-lens 4096,8192,16384 --rounds "${MATRIX_ROUNDS:-2}" \
        --impls fused,sdpa-flash,sdpa-cudnn --json "$LOG/matrix_$tag.json" > "$LOG/matrix_$tag.log" 2>&1
    row "matrix $tag" "rc $? (see matrix_$tag.log)"
  done
fi

if has fastmax; then
  timeout "${FASTMAX_BENCH_TIMEOUT:-150}" "$TRAIN" bench --attention fastmax --causal --dtype bf16 --dim-head 64 \
      --seq-lens 16384,32768,65536,131072 --impls fastmax-cuda,fused,sdpa-cudnn \
      --json "$LOG/fastmax_bench.json" > "$LOG/fastmax_bench.log" 2>&1
  row "bench fastmax causal" "rc $? (see fastmax_bench.log)"
  for att in cosine fastmax; do
    extra="--attention fastmax --use-cuda-kernel"; [ $att = cosine ] && extra="--attention-impl sdpa"
    timeout "${FASTMAX_TRAIN_TIMEOUT:-300}" "$TRAIN" --data "$DATA" --seq-len 2048 --batch "${FASTMAX_BATCH:-4}" \
        --grad-accum 1 --steps "${FASTMAX_STEPS:-2000}" \
        --validate-every 250 --val-windows 32 --generate-every 0 --save-every 100000 --log-every 100 \
        --checkpoint-dir "$CK" --run fm-$att $extra > "$LOG/fastmax_train_$att.log" 2>&1
    row "train $att seq 2048 (val bpc)" "rc $?: $(val_bpcs "$LOG/fastmax_train_$att.log")"
  done
fi

if has tune; then
  for v in 0 1 2 3; do
    export FLASHCOS_FWD_VARIANT=$v FLASHCOS_BWD_VARIANT=$v FLASHCOS_HOPPER_BWD_VARIANT=$v
    "$BUILD/flashcos_tests" --gtest_brief=1 \
        --gtest_filter='Cuda/FusedAttention.*/d64_*:Cuda/FusedAttention.*/d128_*' > "$LOG/tune_tests_v$v.log" 2>&1
    res="tests rc $?, $(grep -cE '^\[  FAILED  \].*\(' "$LOG/tune_tests_v$v.log") failed;"
    for c in "" "--causal"; do
      "$TRAIN" bench $c --impls fused --dtype bf16 --dim-head 64,128 --seq-lens 8192 --batch 4 --heads 8 \
          > "$LOG/tune_v${v}${c}.log" 2>&1
      res+=" ${c:-full}: $(fused_col "$LOG/tune_v${v}${c}.log" 4)"
    done
    row "tune v$v TFLOP/s d64 fwd,bwd,both; d128" "$res"
  done
  unset FLASHCOS_FWD_VARIANT FLASHCOS_BWD_VARIANT FLASHCOS_HOPPER_BWD_VARIANT
fi

if has hopper; then
  for fam in hopper sm80; do
    env_fam=1; [ $fam = sm80 ] && env_fam=0
    FLASHCOS_HOPPER=$env_fam "$BUILD/flashcos_tests" --gtest_brief=1 --gtest_filter='Cuda/FusedAttention.*' \
        > "$LOG/grid_$fam.log" 2>&1
    row "grid FLASHCOS_HOPPER=$env_fam" "rc $?: $(gtest_counts "$LOG/grid_$fam.log")"
    grep -E '^\[  FAILED  \]' "$LOG/grid_$fam.log" | sed -E 's/, where GetParam.*//' | sort -u | head -20
  done
  for c in "" "--causal"; do
    "$TRAIN" bench $c --impls fused,sdpa-flash,sdpa-cudnn --dtype "${HOPPER_DTYPES:-bf16}" --dim-head 64,128 \
        --seq-lens "${HOPPER_SEQ:-8192}" --batch 4 --heads 8 > "$LOG/hopper_bench${c}.log" 2>&1
    row "bench ${c:-full} (hopper family)" "rc $?"
    echo "== bench ${c:-full}: hopper family"
    grep -E '^(bfloat16|float16)|^ +[0-9]+ ' "$LOG/hopper_bench${c}.log" | sed -E 's/ +batch: [0-9]+ +heads: [0-9]+ +/ /; s/ +kernel:.*//'
    if [ "${HOPPER_SM80_BENCH:-0}" = 1 ]; then
      FLASHCOS_HOPPER=0 "$TRAIN" bench $c --impls fused --dtype "${HOPPER_DTYPES:-bf16}" --dim-head 64,128 \
          --seq-lens "${HOPPER_SEQ:-8192}" --batch 4 --heads 8 > "$LOG/sm80_bench${c}.log" 2>&1
      echo "== bench ${c:-full}: FLASHCOS_HOPPER=0"
      grep -E '^(bfloat16|float16)|^ +[0-9]+ ' "$LOG/sm80_bench${c}.log" | sed -E 's/ +batch: [0-9]+ +heads: [0-9]+ +/ /; s/ +kernel:.*//'
    fi
  done
fi

if has fwdkinds; then
  for kind in ${FWD_GRID_KINDS-ws ws-overlap ws-rounded ws-packed ws-qsmem}; do  # set and empty: no grid
    for persist in "" 3; do  # 3: a persistent grid of 3 CTAs, causal too, each walking many tiles
      FLASHCOS_HOPPER_FWD=$kind FLASHCOS_HOPPER_FWD_PERSISTENT=$persist "$BUILD/flashcos_tests" --gtest_brief=1 \
          --gtest_filter='Cuda/FusedAttention.*:*Qkv*' > "$LOG/grid_fwd_$kind$persist.log" 2>&1
      row "grid FLASHCOS_HOPPER_FWD=$kind${persist:+ FLASHCOS_HOPPER_FWD_PERSISTENT=$persist}" \
          "rc $?: $(gtest_counts "$LOG/grid_fwd_$kind$persist.log")"
    done
  done
  for c in "" "--causal"; do
    for kind in ws ws-overlap ws-rounded ws-packed ws-qsmem; do
      FLASHCOS_HOPPER_FWD=$kind "$TRAIN" bench $c --impls fused --only-forwards --dtype bf16 --dim-head 64,128 \
          --seq-lens 8192 --batch 4 --heads 8 --rounds 2 > "$LOG/fwdkind_${kind}${c}.log" 2>&1
      row "fwd $kind ${c:-full} (d64, d128 TFLOP/s)" "$(fused_col "$LOG/fwdkind_${kind}${c}.log" 4)"
    done
  done
fi

if has bwdkinds; then
  for kind in ${BWD_GRID_KINDS:-ws-atomic}; do
    FLASHCOS_HOPPER_BWD=$kind ${STEP_TIMEOUT:+timeout $STEP_TIMEOUT} "$BUILD/flashcos_tests" --gtest_brief=1 --gtest_filter='Cuda/FusedAttention.*:*Qkv*:*Determin*' \
        > "$LOG/grid_bwd_$kind.log" 2>&1
    row "grid FLASHCOS_HOPPER_BWD=$kind" "rc $?: $(gtest_counts "$LOG/grid_bwd_$kind.log")"
  done
  # The default kind on a persistent grid of 3 CTAs, causal too, each walking many key blocks.
  FLASHCOS_HOPPER_BWD_PERSISTENT=3 ${STEP_TIMEOUT:+timeout $STEP_TIMEOUT} "$BUILD/flashcos_tests" --gtest_brief=1 \
      --gtest_filter='Cuda/FusedAttention.*:*Qkv*:*Determin*:*SplitTail*' > "$LOG/grid_bwd_persistent3.log" 2>&1
  row "grid FLASHCOS_HOPPER_BWD_PERSISTENT=3" "rc $?: $(gtest_counts "$LOG/grid_bwd_persistent3.log")"
  for c in "" "--causal"; do
    for kind in ${BWD_KINDS:-ws-atomic ws}; do
      FLASHCOS_HOPPER_BWD=$kind ${STEP_TIMEOUT:+timeout $STEP_TIMEOUT} "$TRAIN" bench $c --impls fused --only-backwards --dtype bf16,fp16 --dim-head 64,128 \
          --seq-lens 8192,16384 --batch 4 --heads 8 --rounds "${BWDKINDS_ROUNDS:-2}" > "$LOG/bwdkind_${kind}${c}.log" 2>&1
      row "bwd $kind ${c:-full} (TFLOP/s)" "$(fused_col "$LOG/bwdkind_${kind}${c}.log" 4)"
    done
  done
fi

if has clocks; then
  marks="$LOG/clocks_marks.txt"
  : > "$marks"
  TZ=UTC nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader \
      -lms 25 > "$LOG/clocks_samples.csv" 2>&1 &
  smi=$!
  sleep 2
  clock_run() {  # tag, impl, bench args...
    local tag=$1 impl=$2; shift 2
    echo "START $tag $(date -u +%H:%M:%S.%N)" >> "$marks"
    "$TRAIN" bench --batch 4 --heads 8 --dim-head "${CLOCKS_DIM:-128}" --seq-lens "${CLOCKS_SEQ:-8192}" --rounds 1 \
        --iters 300 --impls "$impl" "$@" > "$LOG/clocks_$tag.log" 2>&1
    echo "END $tag $(date -u +%H:%M:%S.%N)" >> "$marks"
    sleep 3  # the next process's window starts after this one's samples
  }
  for r in $(seq 1 "${CLOCKS_REPEATS:-2}"); do
    for d in ${CLOCKS_DTYPES:-bf16 fp16}; do
      for i in ${CLOCKS_IMPLS:-fused sdpa-cudnn}; do clock_run "bwd_${d}_${i}_$r" "$i" --only-backwards --dtype "$d"; done
    done
  done
  for i in ${CLOCKS_IMPLS:-fused sdpa-cudnn}; do clock_run "fwd_bf16_$i" "$i" --only-forwards --dtype bf16; done
  kill "$smi" 2>/dev/null
  scripts/clock_summary.sh "$marks" "$LOG/clocks_samples.csv" > "$LOG/clocks_summary.txt" 2>&1
  while read -r tag n mhz w capped rest; do
    [ "$tag" = run ] && continue
    if [ "$n" = 0 ]; then row "clocks $tag" "no nvidia-smi sample in its window"; continue; fi
    impl=$(echo "$tag" | cut -d_ -f3)
    tflops=$(grep -E "^ +[0-9]+ +$impl " "$LOG/clocks_$tag.log" | awk '{print $4}' | head -1)
    row "clocks $tag" "${mhz} MHz, ${w} W, capped ${capped}, ${tflops:-?} TFLOP/s ($n samples)"
  done < "$LOG/clocks_summary.txt"
fi

if has determinism; then
  for c in "" "--causal"; do
    for mode in plain grid ordered; do  # ordered: the deterministic adds in a fixed order (FLASHCOS_DQ_GRID=0)
      det=--deterministic; genv=""
      [ $mode = plain ] && det=""
      [ $mode = ordered ] && genv=FLASHCOS_DQ_GRID=0
      env $genv "$TRAIN" bench $c $det --impls fused --only-backwards --dtype bf16 --dim-head 64,128 --seq-lens 8192 \
          --batch 4 --heads 8 --rounds 2 > "$LOG/bwd_${mode}${c}.log" 2>&1
      row "bwd ${c:-full} $mode (d64, d128 ms)" "$(fused_col "$LOG/bwd_${mode}${c}.log" 3)"
    done
  done
fi

if has scaling; then
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  sc_steps=${SCALING_STEPS:-100}
  sc_args=(--data "$DATA" --use-cuda-kernel --seq-len 8192 --batch 4 --log-every 10 --validate-every "$sc_steps"
           --val-windows 64 --generate-every 0 --save-every 1000000 --checkpoint-dir "$CK" --steps "$sc_steps")
  sc_tok() { grep -E "step $sc_steps/" "$1" | grep -oE '[0-9.]+k tok/s' | tail -1 | sed 's/k tok\/s//'; }
  sc_val() { grep -oE 'validation: loss [0-9.]+' "$1" | tail -1 | awk '{print $3}'; }
  sc_gpus=""
  for n in ${SCALING_GPUS:-2 4}; do [ "$n" -le "$ngpu" ] && sc_gpus="$sc_gpus $n"; done
  for r in $(seq 1 "${SCALING_ROUNDS:-2}"); do
    "$TRAIN" "${sc_args[@]}" --grad-accum 4 --run "scale1_$r" --profile-steps 5 > "$LOG/scale_1_$r.log" 2>&1
    rc=$?
    one=$(sc_tok "$LOG/scale_1_$r.log")
    row "scaling 1 GPU round $r" "rc $rc: ${one:-?}k tok/s, val loss $(sc_val "$LOG/scale_1_$r.log")"
    for n in $sc_gpus; do
      MASTER_PORT=$((29650 + n + 10 * r)) scripts/launch.sh --nproc "$n" "$TRAIN" "${sc_args[@]}" --grad-accum 4 \
          --run "scale${n}_$r" --profile-steps 5 > "$LOG/scale_${n}_$r.log" 2>&1
      rc=$?
      tok=$(sc_tok "$LOG/scale_${n}_$r.log")
      ratio=$(awk -v a="${tok:-0}" -v b="${one:-0}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "?" }')
      row "scaling $n GPUs round $r" "rc $rc: ${tok:-?}k tok/s = ${ratio}x, val loss $(sc_val "$LOG/scale_${n}_$r.log"), $(grep -oE 'exposed[^,]*ms/step' "$LOG/scale_${n}_$r.log" | head -1)"
    done
  done
  # 1-GPU runs with each world size's global batch, one per GPU, side by side.
  gpu=0
  for n in $sc_gpus; do
    CUDA_VISIBLE_DEVICES=$gpu "$TRAIN" "${sc_args[@]}" --grad-accum $((4 * n)) --run "equal$n" > "$LOG/scale_equal_$n.log" 2>&1 &
    gpu=$(( (gpu + 1) % (ngpu > 0 ? ngpu : 1) ))
  done
  wait
  for n in $sc_gpus; do row "scaling 1 GPU, grad-accum $((4 * n))" "val loss $(sc_val "$LOG/scale_equal_$n.log")"; done
fi

if has coverage; then
  for cfgname in d96 mask bias; do
    case $cfgname in
      d96) extra="--dim-head 96" ;;
      mask) extra="--dim-head 64,128 --mask-prob 0.1" ;;
      bias) extra="--dim-head 64,128 --bias head" ;;
    esac
    "$TRAIN" bench --causal --dtype bf16 --seq-lens 8192 --batch 4 --heads 8 --rounds 2 $extra \
        --impls fused,sdpa-flash,sdpa-cudnn > "$LOG/coverage_$cfgname.log" 2>&1
    row "coverage $cfgname" "rc $? (see coverage_$cfgname.log)"
  done
fi

# sanitize: compute-sanitizer memcheck, racecheck and synccheck over SANITIZE_FILTER (a gtest filter;
# default: the trainer's fused operators, the one-row decode linear, the l2norm kernels, the Hopper
# forward (d64, d128), the deterministic backward and the backward's dq conversion on one case each; the graph
# decode and decode-step suites take minutes under the sanitizer, name them to include them;
# SANITIZE_TIMEOUT seconds per tool, default 400; SANITIZE_TOOLS, default all three). Racecheck (shared-memory
# hazards) leaves out the l2norm kernels, which use no shared memory and take 16 s a case under it: with
# them it ran out of its 200 s before the attention cases (2026-11-27, runs W4 / W6).
if has sanitize; then
  filter=${SANITIZE_FILTER:-'Cases/AddLayerNormCuda.*:Cases/BiasGeluCuda.*:*ClassifierCrossEntropyCuda*:DecodeLinear.*:Gpu/L2NormCuda.*:*FusedAttention*d64_causal_1000*:*FusedAttention*d128_groups2_causal*:*DeterministicBackward*hopper_bf16_d128_full*:*DqFinishCuda*bf16_d128_i63_j127_gqa*'}
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    tool_filter=$filter
    if [ $tool = racecheck ] && [ -z "${SANITIZE_FILTER:-}" ]; then tool_filter="$filter:-Gpu/L2NormCuda.*"; fi
    timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/flashcos_tests" --gtest_filter="$tool_filter" \
        > "$LOG/sanitize_$tool.log" 2>&1
    row "compute-sanitizer $tool" "rc $?: $(grep -oE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?[^)]*' "$LOG/sanitize_$tool.log" | tail -1)"
  done
fi

if has bench; then
  for c in "--causal" ""; do
    tag=$([ -n "$c" ] && echo causal || echo full)
    "$TRAIN" bench $c --dtype bf16 --dim-head 64 --seq-lens 1024,2048,4096,8192,16384 \
        --json "$LOG/bench_$tag.json" > "$LOG/bench_$tag.log" 2>&1
    row "bench bf16 d64 $tag" "rc $? (see bench_$tag.log)"
  done
fi

if has tests; then  # failing tests with their error lines, for the output tail
  grep -E '^\[  FAILED  \]' "$LOG/tests.log" | sed -E 's/, where GetParam.*//' | sort -u | head -30
  grep -E '^\[ errors' "$LOG/tests.log" > "$LOG/test_errors.txt"
fi
pack
echo
echo "==== flashcos gpu_check $(date -u +%Y-%m-%dT%H:%MZ) ===="
printf '%s\n' "${table[@]}"
