#!/usr/bin/env bash
# Mean SM clock and board power of each run of a sequence, from nvidia-smi samples: how hard the power
# limit held each one (scripts/gpu_check.sh clocks writes both files).
#
#   scripts/clock_summary.sh [--window FROM,TO] MARKS SAMPLES
#
# MARKS: lines "START tag HH:MM:SS.frac" and "END tag HH:MM:SS.frac" (date -u +%H:%M:%S.%N), one pair a run.
# SAMPLES: nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active
#          --format=csv,noheader -lms N, run with TZ=UTC (as gpu_check.sh does), so both are UTC.
# Each run is summarised over [END - FROM, END - TO] seconds (default 1.2,0.2: a bench's timed
# iterations end shortly before its process does): samples, mean SM MHz, mean W (nvidia-smi averages
# power over about a second, so it lags the load), and the share of samples with the software power
# cap (reason bit 0x4) active; lines that are not samples are skipped. A run with no sample in its
# window says so. Times of day that pass midnight are taken as the next day. Needs only bash and awk.
set -euo pipefail

die() { echo "clock_summary.sh: error: $*" >&2; exit 1; }
usage="usage: scripts/clock_summary.sh [--window FROM,TO] MARKS SAMPLES"
from=1.2 to=0.2
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then echo "$usage"; exit 0; fi
if [ "${1:-}" = --window ]; then
  [[ "${2:-}" =~ ^[0-9]+(\.[0-9]+)?,[0-9]+(\.[0-9]+)?$ ]] || die "--window wants FROM,TO in seconds (e.g. 1.2,0.2), got '${2:-}'"
  from=${2%,*} to=${2#*,}
  shift 2
fi
[ $# -eq 2 ] || die "want a marks file and a samples file; $usage"
for f in "$1" "$2"; do [ -r "$f" ] || die "cannot read '$f'"; done
awk -v from="$from" -v to="$to" 'BEGIN { if (from + 0 <= to + 0) { print "clock_summary.sh: error: --window FROM must exceed TO" > "/dev/stderr"; exit 2 } }' || exit 1

awk -v from="$from" -v to="$to" '
  function sec(hms,  t) { split(hms, t, ":"); return t[1] * 3600 + t[2] * 60 + t[3] }
  # Seconds of the day, moved by a day where more than 12 h from the first mark (the run passed midnight).
  function at(x,  s) { s = sec(x); if (s < ref - 43200) s += 86400; else if (s > ref + 43200) s -= 86400; return s }
  # Bit 0x4 of a hexadecimal reasons mask: the software power cap.
  function capped(h,  v) { v = index("0123456789abcdef", tolower(substr(h, length(h), 1))) - 1; return int(v / 4) % 2 }
  FNR == NR { if ($1 == "START" || $1 == "END") { kind[++n] = $1; tag[n] = $2; if (n == 1) ref = sec($3); tm[n] = at($3) } next }
  $0 !~ / MHz, / { next }  # a line of nvidia-smi that is not a sample (a message, [N/A] values)
  { split($0, f, ", "); split(f[1], d, " "); ts[++m] = at(d[2]); clk[m] = f[2] + 0; pw[m] = f[3] + 0; cap[m] = capped(f[4]) }
  END {
    printf "%-28s %7s %8s %8s %8s\n", "run", "samples", "SM MHz", "W", "capped"
    for (i = 1; i <= n; ++i) {
      if (kind[i] != "END") continue
      a = tm[i] - from; b = tm[i] - to; c = 0; sc = 0; sp = 0; sk = 0
      for (j = 1; j <= m; ++j) if (ts[j] >= a && ts[j] <= b) { ++c; sc += clk[j]; sp += pw[j]; sk += cap[j] }
      if (c) printf "%-28s %7d %8.0f %8.1f %7.0f%%\n", tag[i], c, sc / c, sp / c, 100 * sk / c
      else printf "%-28s %7d  (no samples in its window)\n", tag[i], 0
    }
  }' "$1" "$2"
