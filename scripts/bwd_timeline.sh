#!/usr/bin/env bash
# Summarises the Hopper backward's diagnostic timeline (a build with -DFLASHCOS_BWD_TIMELINE=ON writes
# it: attention/cosine/cuda/hopper/bwd_timeline.cuh): where an item's time goes, per consumer, as
# medians in microseconds, and on a grid of a CTA an item the time between one CTA's end and the
# next one's start on the same SM.
#
#   scripts/bwd_timeline.sh TIMELINE_FILE...
#
# Each file holds one launch or more ("# launch ..." headers start them; each launch is summarised on
# its own). Then the launch as a whole: its span (first CTA start to last store, us) and the share of
# that span its SMs were busy (in a CTA; one CTA an SM at a time), over the CTAs recorded (the file's
# header gives the grid; a shorter record says so). A line per (CTA, item, consumer): cta item
# consumer w n_steps, the cycle counts of the marks enter, kv, first step, loop end, dQ MMA, dQ out,
# stored, then the global timer (ns) at enter, the SM and the CTA's start cycle. Cycle counts compare
# within one SM only; the clock (cycles per ns) is the median over SMs of (last enter - first enter) /
# (their global timer difference).
# Needs only bash, awk and sort.
set -euo pipefail

die() { echo "bwd_timeline.sh: error: $*" >&2; exit 1; }
usage="usage: scripts/bwd_timeline.sh TIMELINE_FILE..."
[ $# -ge 1 ] || die "no timeline file given; $usage"
case "$1" in -h|--help) echo "$usage"; exit 0 ;; esac
for f in "$@"; do [ -r "$f" ] || die "cannot read '$f'"; done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Median of the values of each key: input "key value" lines sorted by key, then value.
medians() {
  awk '
    function flush() { if (n) printf "%s %.2f %d\n", key, (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2), n }
    $1 != key { flush(); key = $1; n = 0 }
    { v[++n] = $2 }
    END { flush() }'
}

for f in "$@"; do
  # Split the file into its launches.
  awk -v dir="$tmp" '/^# launch/ { ++k; print > (dir "/launch_" k ".hdr"); next }
                     k && NF == 15 { print > (dir "/launch_" k ".txt") }' "$f"
  for hdr in "$tmp"/launch_*.hdr; do
    [ -e "$hdr" ] || die "'$f' has no '# launch' header: not a timeline file"
    txt="${hdr%.hdr}.txt"
    echo "== $f: $(cat "$hdr")"
    if [ ! -s "$txt" ]; then echo "   no stamps"; rm -f "$hdr"; continue; fi
    # The clock: per SM, first and last enter (cycles, ns) of consumer 0.
    ghz=$(awk '$3 == 0 { s = $14; c = $6; ns = $13
                         if (!(s in c0) || c < c0[s]) { c0[s] = c; n0[s] = ns }
                         if (!(s in c1) || c > c1[s]) { c1[s] = c; n1[s] = ns } }
               END { for (s in c0) if (n1[s] > n0[s]) print "clock", (c1[s] - c0[s]) / (n1[s] - n0[s]) }' "$txt" |
          sort -k1,1 -k2,2g | medians | awk '{ print $2 + 0 }')
    # With one stamp per SM the clock cannot be measured: an assumed 1.7 GHz, said so below.
    clock_note="(cycles per ns)"
    if [ -z "$ghz" ]; then ghz=1.7; clock_note="(assumed: one stamp per SM, the clock not measurable)"; fi
    # Lines whose marks are all there (an item without steps has no dQ marks).
    awk -v ghz="$ghz" '
      function us(c) { return c / ghz / 1000 }
      { for (i = 6; i <= 12; ++i) if ($i == 0) next
        c = $3; n = $5
        print "c" c "_kv(enter->kv)", us($7 - $6)
        print "c" c "_first_step", us($8 - $7)
        if (n > 1) print "c" c "_step(mean_of_the_rest)", us($9 - $8) / (n - 1)
        print "c" c "_dq_mma(loop_end->dq_mma)", us($10 - $9)
        print "c" c "_dq_out(dq_mma->dq_out)", us($11 - $10)
        print "c" c "_stores(dq_out->stored)", us($12 - $11)
        print "c" c "_outside_steps", us($7 - $6) + us($12 - $9) + (n > 1 ? us($8 - $7) - us($9 - $8) / (n - 1) : 0)
        if ($2 == 0) print "c" c "_cta_start->enter", us($6 - $15) }' "$txt" | sort -k1,1 -k2,2g | medians > "$tmp/med"
    # A CTA an item: on each SM, the CTAs by start cycle; the gap from the last store of one (either
    # consumer) to the start of the next.
    awk '$2 == 0 && $12 > 0 { k = $14 " " $15; if (!(k in end) || $12 > end[k]) end[k] = $12; sm[k] = $14; st[k] = $15 }
         END { for (k in end) print sm[k], st[k], end[k] }' "$txt" | sort -k1,1n -k2,2n |
      awk -v ghz="$ghz" '
        NR > 1 && $1 == s && $2 > e { print "cta_gap(stored->next_cta_start)", ($2 - e) / ghz / 1000 }
        { s = $1; e = $3 }' | sort -k1,1 -k2,2g | medians >> "$tmp/med"
    # The launch: each CTA from its start to its last mark (global timer at enter, plus or minus
    # cycles at the clock), the span over all CTAs, and their busy time over (SMs x span).
    awk -v ghz="$ghz" '
      { last = 0; for (i = 6; i <= 12; ++i) if ($i > 0) last = $i
        s = $13 - ($6 - $15) / ghz; e = $13 + (last - $6) / ghz
        if (!($1 in cs) || s < cs[$1]) cs[$1] = s
        if (!($1 in ce) || e > ce[$1]) ce[$1] = e
        sm[$14] = 1 }
      END { for (k in cs) { ++n; busy += ce[k] - cs[k]
                            if (n == 1 || cs[k] < lo) lo = cs[k]
                            if (n == 1 || ce[k] > hi) hi = ce[k] }
            for (s in sm) ++sms
            span = hi - lo
            printf "launch_span_us %.3f %d\n", span / 1000, n
            printf "sm_busy_percent %.3f %d\n", (span > 0 ? 100 * busy / (sms * span) : 0), sms }' "$txt" > "$tmp/launch"
    grid=$(sed -n 's/.* grid \([0-9]*\).*/\1/p' "$hdr")
    recorded=$(awk '$1 == "launch_span_us" { print $3 }' "$tmp/launch")
    printf "   clock %.3f GHz %s; medians in us (count):\n" "$ghz" "$clock_note"
    awk '{ printf "   %-36s %8.2f  (%d)\n", $1, $2, $3 }' "$tmp/med"
    echo "   the launch (CTAs recorded; SMs):"
    awk '{ printf "   %-36s %8.2f  (%d)\n", $1, $2, $3 }' "$tmp/launch"
    if [ -n "$grid" ] && [ "$recorded" -lt "$grid" ]; then echo "   (the first $recorded CTAs of a grid of $grid only)"; fi
    rm -f "$hdr" "$txt"
  done
done
