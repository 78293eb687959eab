#!/usr/bin/env bash
# Plots a run's metrics file (JSON lines, one object per event) to a PNG with gnuplot:
# loss (nats) and bits/char for train and val, learning rate, the gradients' norm before clipping
# (runs from before it was logged leave that panel empty), and tokens/s, against the step.
#
#   scripts/plot_metrics.sh checkpoints/<run>/metrics.jsonl [out.png]   (default: metrics.png next to it)
#
# Lines look like {"step":100,"event":"train","loss":1.23,"bpc":1.77,"lr":0.0002,"grad_norm":0.8,"tok_per_s":12345}
# and {"step":100,"event":"val","loss":1.30,"bpc":1.88}; other events and keys are ignored, and so
# are lines that are not JSON objects. After a --resume a step may appear twice: the later line
# wins. Needs only gnuplot and awk (no jq, no Python).
set -euo pipefail

die() { echo "plot_metrics.sh: error: $*" >&2; exit 1; }

[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: scripts/plot_metrics.sh checkpoints/<run>/metrics.jsonl [out.png]"
in="$1"
[ -e "$in" ] || die "metrics file '$in' not found (a run writes checkpoints/<run>/metrics.jsonl)"
[ -f "$in" ] && [ -r "$in" ] || die "metrics file '$in' is not a readable file"
out="${2:-${in%.jsonl}.png}"
[ "$out" != "$in" ] || out="$in.png"
command -v gnuplot >/dev/null 2>&1 || die "gnuplot is not installed (Debian/Ubuntu: sudo apt-get install gnuplot-nox)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One table per event: step and the wanted keys ("?" where a key is absent, gnuplot skips it).
# Sorted by step (stably), keeping the last line for each step.
extract() {  # extract EVENT KEY...
  local event="$1"; shift
  awk -v event="$event" -v keys="$*" '
    function val(line, key,    s) {
      if (!match(line, "\"" key "\"[ \t]*:[ \t]*")) return "?"
      s = substr(line, RSTART + RLENGTH)
      if (substr(s, 1, 1) == "\"") {  # a string value
        s = substr(s, 2)
        return match(s, /"/) ? substr(s, 1, RSTART - 1) : "?"
      }
      if (!match(s, /^-?[0-9][0-9.eE+-]*/)) return "?"  # null, NaN, ...
      return substr(s, 1, RLENGTH)
    }
    BEGIN { n = split(keys, k, " ") }
    /^[ \t]*\{/ {
      if (val($0, "event") != event) next
      step = val($0, "step")
      if (step == "?") next
      row = step
      for (i = 1; i <= n; i++) row = row " " val($0, k[i])
      print NR, row
    }' "$in" | sort -n -k2,2 -k1,1 | awk '
      { step = $2; sub(/^[0-9]+ /, ""); if (NR > 1 && step != last) print line; line = $0; last = step }
      END { if (NR > 0) print line }'
}

extract train loss bpc lr tok_per_s grad_norm >"$tmp/train.dat"
extract val loss bpc >"$tmp/val.dat"
n_train=$(wc -l <"$tmp/train.dat")
n_val=$(wc -l <"$tmp/val.dat")
n_norm=$(awk '$6 != "?"' "$tmp/train.dat" | wc -l)  # metrics from before grad_norm was logged have none
[ "$n_train" -gt 0 ] || [ "$n_val" -gt 0 ] ||
  die "'$in' has no train or val events (expected JSON lines like {\"step\":100,\"event\":\"train\",\"loss\":1.23,...})"

run="$(basename "$(cd "$(dirname "$in")" && pwd)")"
last_val="no val yet"
if [ "$n_val" -gt 0 ]; then
  last_val="$(tail -n 1 "$tmp/val.dat" | awk '{ printf "val bpc %s at step %s", $3, $1 }')"
fi

# gnuplot plot clauses, only for tables that have rows.
tr_clause() { [ "$n_train" -gt 0 ] && printf "'%s' using 1:%s with lines lw 1.5 lc rgb '#1f77b4' title 'train'" "$tmp/train.dat" "$1" || true; }
va_clause() { [ "$n_val" -gt 0 ] && printf "'%s' using 1:%s with linespoints pt 7 ps 0.6 lw 2 lc rgb '#d62728' title 'val'" "$tmp/val.dat" "$1" || true; }
both() { local a b; a="$(tr_clause "$1")"; b="$(va_clause "$2")"; if [ -n "$a" ] && [ -n "$b" ]; then echo "$a, $b"; else echo "$a$b"; fi; }
plotline() {  # plotline CLAUSES: a plot command, or empty axes saying 'no data'
  if [ -n "$1" ]; then echo "plot $1"
  else echo "set label 1 'no data' at graph 0.5,0.5 center; plot [0:1][0:1] -1 notitle; unset label 1"; fi
}

term="pngcairo size 2100,900 font ',10'"
gnuplot -e "set terminal pngcairo" >/dev/null 2>&1 || term="png size 2100,900"

gnuplot <<EOF || die "gnuplot failed to plot '$in'"
set terminal $term
set output '$out'
set datafile missing '?'
set key top right
set grid
set xlabel 'step'
set multiplot layout 2,3 title "$run: $last_val"
set title 'loss (nats)'
$(plotline "$(both 2 2)")
set title 'bits per character'
$(plotline "$(both 3 3)")
set title 'learning rate'
set format y '%.1e'
$(plotline "$(tr_clause 4)")
set title 'gradient norm before clipping'
set format y '%g'
$(plotline "$([ "$n_norm" -gt 0 ] && tr_clause 6)")
set title 'tokens / s'
set format y '%.0f'
$(plotline "$(tr_clause 5)")
unset multiplot
EOF
echo "plot_metrics.sh: wrote $out ($n_train train points, $n_val val points)" >&2
