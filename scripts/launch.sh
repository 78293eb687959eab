#!/usr/bin/env bash
# Starts N copies of a command on this machine as one data-parallel job, the way torchrun does:
#   scripts/launch.sh --nproc 4 ./train --data data/enwik8 --seq-len 8192 --use-cuda-kernel
# Each copy gets RANK = LOCAL_RANK = 0..N-1, WORLD_SIZE = N, MASTER_ADDR (default 127.0.0.1) and
# MASTER_PORT (default 29500; --master-port or the environment override them). Ctrl-C / SIGTERM
# are forwarded to every copy. When a copy fails, the others are given --grace seconds to notice
# (they fail their next collective, naming their rank) before they are terminated; the exit status
# is the first failing copy's (0 when all succeed).
#
# Several nodes: run one launch.sh per node with --nnodes, --node-rank and --master-addr, or use
# Slurm (srun --ntasks-per-node N ./train ...), which ./train reads directly.
set -u

usage() {
  cat <<'EOF'
usage: scripts/launch.sh --nproc N [--nnodes M --node-rank K] [--master-addr HOST] [--master-port P]
                         [--grace S] command [args...]
EOF
}

nproc="" nnodes=1 node_rank=0 grace=30
addr="${MASTER_ADDR:-127.0.0.1}" port="${MASTER_PORT:-29500}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nproc) nproc="${2:-}"; shift 2 ;;
    --nnodes) nnodes="${2:-}"; shift 2 ;;
    --node-rank) node_rank="${2:-}"; shift 2 ;;
    --master-addr) addr="${2:-}"; shift 2 ;;
    --master-port) port="${2:-}"; shift 2 ;;
    --grace) grace="${2:-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "launch.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
is_int() { [[ "$1" =~ ^[0-9]+$ ]]; }
if ! is_int "$nproc" || [[ "$nproc" -lt 1 ]]; then echo "launch.sh: --nproc must be a positive integer, got '$nproc'" >&2; exit 2; fi
if ! is_int "$nnodes" || [[ "$nnodes" -lt 1 ]]; then echo "launch.sh: --nnodes must be a positive integer, got '$nnodes'" >&2; exit 2; fi
if ! is_int "$node_rank" || [[ "$node_rank" -ge "$nnodes" ]]; then echo "launch.sh: --node-rank must be in [0, $nnodes), got '$node_rank'" >&2; exit 2; fi
if ! is_int "$port" || [[ "$port" -lt 1 || "$port" -gt 65535 ]]; then echo "launch.sh: --master-port must be in [1, 65535], got '$port'" >&2; exit 2; fi
if ! is_int "$grace"; then echo "launch.sh: --grace must be a number of seconds, got '$grace'" >&2; exit 2; fi
if [[ $# -eq 0 ]]; then echo "launch.sh: no command given" >&2; usage >&2; exit 2; fi

world=$((nproc * nnodes))
pids=()
for ((i = 0; i < nproc; i++)); do
  RANK=$((node_rank * nproc + i)) LOCAL_RANK=$i WORLD_SIZE=$world LOCAL_WORLD_SIZE=$nproc \
    MASTER_ADDR="$addr" MASTER_PORT="$port" "$@" &
  pids+=($!)
done

forward() {
  for p in "${pids[@]}"; do kill -s "$1" "$p" 2>/dev/null; done
}
trap 'forward INT' INT
trap 'forward TERM' TERM

# Wait for the copies; remember the first failure and give the rest --grace seconds.
status=0 failed_at=""
remaining=${#pids[@]}
declare -A done_pid=()
while [[ $remaining -gt 0 ]]; do
  for idx in "${!pids[@]}"; do
    p=${pids[$idx]}
    [[ -n "${done_pid[$p]:-}" ]] && continue
    if ! kill -0 "$p" 2>/dev/null; then
      wait "$p"; rc=$?
      done_pid[$p]=1; remaining=$((remaining - 1))
      if [[ $rc -ne 0 && $status -eq 0 ]]; then
        status=$rc failed_at=$SECONDS
        echo "launch.sh: rank $((node_rank * nproc + idx)) exited with status $rc" >&2
      fi
    fi
  done
  if [[ -n "$failed_at" && $remaining -gt 0 && $((SECONDS - failed_at)) -ge $grace ]]; then
    echo "launch.sh: terminating the remaining ranks ($grace s after the first failure)" >&2
    forward TERM; sleep 5; forward KILL; failed_at=""
  fi
  [[ $remaining -gt 0 ]] && sleep 0.2
done
exit $status
