#!/usr/bin/env bash
# Plots `./train bench` output to a PNG with gnuplot: TFLOP/s against the sequence length n, one
# line per implementation (fused, sdpa-flash, sdpa-cudnn, ...), one panel per pass (forward,
# backward) and configuration (mask, head dim) of one dtype.
#
#   scripts/plot_bench.sh [--dtype bfloat16] [--pass forward,backward] [-o out.png] BENCH_OUTPUT...
#
# BENCH_OUTPUT: what `./train bench` printed (e.g. one causal and one non-causal run, as in
# docs/history/raw/*-matrix-*.txt). Read from it: the "device:" line and, for every block header
# ("bfloat16  batch: 4  heads: 8  dim 64  forward, causal ..."), the rows of the "every
# implementation" table that follows (seq_len impl ms TFLOP/s ...). --dtype picks the dtype (default:
# the first one in the input); --pass the passes, in row order (forward, backward, "forward +
# backward"; default forward,backward). Needs only bash, awk and gnuplot (no Python).
set -euo pipefail

die() { echo "plot_bench.sh: error: $*" >&2; exit 1; }
usage="usage: scripts/plot_bench.sh [--dtype DTYPE] [--pass forward,backward] [-o out.png] BENCH_OUTPUT..."

dtype=""; passes="forward,backward"; out="bench.png"; inputs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dtype) [ $# -ge 2 ] || die "--dtype needs a value (bfloat16, float16, float32)"; dtype="$2"; shift 2 ;;
    --pass) [ $# -ge 2 ] || die "--pass needs a value (forward,backward)"; passes="$2"; shift 2 ;;
    -o|--out) [ $# -ge 2 ] || die "-o needs a file name"; out="$2"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) die "unknown option '$1'; $usage" ;;
    *) inputs+=("$1"); shift ;;
  esac
done
[ ${#inputs[@]} -ge 1 ] || die "no bench output given; $usage"
for f in "${inputs[@]}"; do
  [ -f "$f" ] && [ -r "$f" ] || die "bench output '$f' is not a readable file"
done
command -v gnuplot >/dev/null 2>&1 || die "gnuplot is not installed (Debian/Ubuntu: sudo apt-get install gnuplot-nox)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One row per measurement: dtype|dim|mask|pass|n|impl|tflops (mask "causal" or "non-causal").
awk '
  /^device: / { if (device == "") { device = $0; sub(/^device: */, "", device); print "#device|" device } next }
  /^(bfloat16|float16|float32|float64) +batch:/ {
    dt = $1; batch = $3; heads = $5; dim = $7
    rest = $0; sub(/^.*dim +[0-9]+ +/, "", rest); sub(/ +kernel:.*$/, "", rest)
    mask = (rest ~ /, causal$/) ? "causal" : "non-causal"; sub(/, causal$/, "", rest)
    pass = rest; intable = 0
    print "#shape|" dt "|" batch "|" heads
    next
  }
  / every implementation / { intable = 1; next }
  intable && $1 == "seq_len" { next }
  intable && NF >= 4 && $1 ~ /^[0-9]+$/ && $4 ~ /^[0-9.]+$/ { print dt "|" dim "|" mask "|" pass "|" $1 "|" $2 "|" $4; next }
  intable && NF == 0 { intable = 0 }
' "${inputs[@]}" > "$tmp/rows"

grep -qv '^#' "$tmp/rows" || die "no '... every implementation' tables found: is this ./train bench output?"
[ -n "$dtype" ] || dtype=$(grep -v '^#' "$tmp/rows" | head -1 | cut -d'|' -f1)
awk -F'|' -v d="$dtype" '$1 == d' "$tmp/rows" > "$tmp/sel"
[ -s "$tmp/sel" ] || die "no rows for dtype '$dtype' (the input has: $(grep -v '^#' "$tmp/rows" | cut -d'|' -f1 | sort -u | tr '\n' ' '))"
device=$(grep '^#device|' "$tmp/rows" | head -1 | cut -d'|' -f2- || true)
shape=$(awk -F'|' -v d="$dtype" '$1 == "#shape" && $2 == d { print "batch " $3 ", heads " $4; exit }' "$tmp/rows")

# Panels: rows = passes (as asked), columns = (mask, dim) in input order; lines = implementations.
IFS=',' read -r -a pass_list <<< "$passes"
for p in "${pass_list[@]}"; do
  p="$(echo "$p" | sed 's/+/ + /; s/  */ /g; s/^ //; s/ $//')"
  grep -q "|$p|" "$tmp/sel" || die "no '$p' tables for $dtype (passes in the input: $(cut -d'|' -f4 "$tmp/sel" | sort -u | tr '\n' ',' | sed 's/,$//'))"
done
cols=$(cut -d'|' -f3,2 "$tmp/sel" | awk -F'|' '!seen[$0]++ { print $2 "|" $1 }')
impls=$(cut -d'|' -f6 "$tmp/sel" | awk '!seen[$0]++')
ymax=$(awk -F'|' '$7 + 0 > m { m = $7 + 0 } END { print int(m * 1.15 / 50 + 1) * 50 }' "$tmp/sel")
xtics=$(cut -d'|' -f5 "$tmp/sel" | sort -n -u | awk '{ printf "%s\"%s\" %s", (NR > 1 ? ", " : ""), ($1 % 1024 == 0 ? $1 / 1024 "k" : $1), $1 }')
ncols=$(echo "$cols" | wc -l); nrows=${#pass_list[@]}

colour() {  # colour IMPL N: fused red, flash blue, cuDNN grey, the N-th other implementation from a list
  case "$1" in
    fused) echo "#c0392b" ;; sdpa-flash) echo "#2471a3" ;; sdpa-cudnn) echo "#7f8c8d" ;;
    *) local c=("#27ae60" "#8e44ad" "#d68910" "#17202a" "#e84393" "#00838f"); echo "${c[$(( $2 % 6 ))]}" ;;
  esac
}

{
  width=$(( 330 * ncols + 80 )); [ "$width" -ge 760 ] || width=760
  echo "set terminal pngcairo size $width,$(( 300 * nrows + 90 )) font 'DejaVu Sans,10'"
  echo "set output '$out'"
  echo "set datafile separator '|'; set termoption noenhanced"
  echo "set multiplot layout $nrows,$ncols title \"TFLOP/s by sequence length, $dtype, $shape\\n$device\" font ',12'"
  echo "set logscale x 2; set xtics ($xtics); set xrange [*:*]; set offsets graph 0.08, graph 0.08, 0, 0"
  echo "set yrange [0:$ymax]; set grid ytics lc rgb '#dddddd'; set key top left box opaque$( [ "$(echo "$impls" | wc -l)" -gt 4 ] && echo " font ',8' spacing 0.8 samplen 2")"
  echo "set xlabel 'n (queries = keys)'; set ylabel 'TFLOP/s'"
  first=1
  for p in "${pass_list[@]}"; do
    p="$(echo "$p" | sed 's/+/ + /; s/  */ /g; s/^ //; s/ $//')"
    while IFS='|' read -r mask dim; do
      echo "set title '$p, $mask, d $dim'"
      [ $first = 1 ] && echo "set key" || echo "unset key"
      first=0
      plot="plot"; others=0
      while read -r impl; do
        f="$tmp/$(echo "$p-$mask-$dim-$impl" | tr -c 'A-Za-z0-9-\n' '_').dat"
        awk -F'|' -v p="$p" -v m="$mask" -v d="$dim" -v im="$impl" \
          '$4 == p && $3 == m && $2 == d && $6 == im { print $5 "|" $7 }' "$tmp/sel" | sort -t'|' -n -k1,1 > "$f"
        if [ -s "$f" ]; then
          lw=2; label="$impl"; [ "$impl" = fused ] && { lw=3; label='fused (flashcos)'; }
          plot="$plot '$f' using 1:2 with linespoints lw $lw pt 7 ps 0.8 lc rgb '$(colour "$impl" "$others")' title '$label',"
        fi
        case "$impl" in fused|sdpa-flash|sdpa-cudnn) ;; *) others=$((others + 1)) ;; esac
      done <<< "$impls"
      echo "${plot%,}"
    done <<< "$cols"
  done
  echo "unset multiplot"
} > "$tmp/plot.gp"

gnuplot "$tmp/plot.gp" || { cp "$tmp/plot.gp" "$out.gp"; die "gnuplot failed (its script: $out.gp)"; }
echo "wrote $out ($dtype; $(echo "$cols" | wc -l) configurations x ${#pass_list[@]} passes; implementations: $(echo "$impls" | tr '\n' ' '))"
