#!/usr/bin/env bash
# Downloads enwik8 (the first 10^8 bytes of the English Wikipedia dump of 2006-03-03, the Hutter
# Prize file) from its official address, checks it, and unpacks it into data/:
#   data/enwik8      the raw 100,000,000 bytes (size and md5 checked)
#   data/enwik8.gz   the same bytes, gzip -9 -n (what `./train --data data/enwik8.gz` reads)
# Idempotent: files that are already there and check out are kept; nothing is downloaded again.
#
#   scripts/download_enwik8.sh [DEST_DIR]        (default: data/ in the repository)
#   ENWIK8_URL=<mirror>/enwik8.zip scripts/download_enwik8.sh   (any copy: the checks still apply)
#
# The check is on the unpacked file: exactly 100,000,000 bytes with md5
# a1fa5ffddb56f4953e226637dabbb36a, the value in Matt Mahoney's published table (Large Text
# Compression Benchmark, http://mattmahoney.net/dc/textdata.html) and quoted unchanged by many
# independent projects (e.g. GluonNLP's large_text_compression_benchmark).
set -euo pipefail

URL="${ENWIK8_URL:-http://mattmahoney.net/dc/enwik8.zip}"
SIZE=100000000
MD5=a1fa5ffddb56f4953e226637dabbb36a

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$here/../data}"

die() { echo "download_enwik8.sh: error: $*" >&2; exit 1; }
say() { echo "download_enwik8.sh: $*" >&2; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed; $2"; }
need unzip "install it (Debian/Ubuntu: sudo apt-get install unzip)"
need md5sum "install coreutils"
need gzip "install it (Debian/Ubuntu: sudo apt-get install gzip)"

mkdir -p "$dest" || die "cannot create the folder '$dest'"
dest="$(cd "$dest" && pwd)"
[ -w "$dest" ] || die "the folder '$dest' is not writable"
raw="$dest/enwik8"
gz="$dest/enwik8.gz"
zip="$dest/enwik8.zip"

file_size() { stat -c %s "$1" 2>/dev/null || wc -c <"$1"; }

# check FILE: true when FILE holds exactly enwik8.
check() {
  [ -f "$1" ] || return 1
  local n sum
  n="$(file_size "$1")"
  if [ "$n" != "$SIZE" ]; then say "'$1' has $n bytes, expected $SIZE"; return 1; fi
  sum="$(md5sum "$1" | cut -d' ' -f1)"
  if [ "$sum" != "$MD5" ]; then say "'$1' has md5 $sum, expected $MD5"; return 1; fi
  return 0
}

# check_gz FILE: true when FILE is a gzip of exactly enwik8.
check_gz() {
  [ -f "$1" ] || return 1
  local n sum
  n="$(gzip -dc "$1" 2>/dev/null | wc -c)" || true
  if [ "$n" != "$SIZE" ]; then say "'$1' unpacks to $n bytes, expected $SIZE"; return 1; fi
  sum="$(gzip -dc "$1" | md5sum | cut -d' ' -f1)"
  if [ "$sum" != "$MD5" ]; then say "'$1' unpacks to md5 $sum, expected $MD5"; return 1; fi
  return 0
}

download() {  # download URL OUT: to OUT.part, renamed on success
  local part="$2.part"
  rm -f "$part"
  if command -v curl >/dev/null 2>&1; then
    curl -fL --retry 3 --connect-timeout 30 -o "$part" "$1" ||
      { rm -f "$part"; die "curl could not download $1 (network down, proxy, or the address moved?); download enwik8.zip by hand into '$dest' and run this again"; }
  elif command -v wget >/dev/null 2>&1; then
    wget --tries=3 --timeout=30 -O "$part" "$1" ||
      { rm -f "$part"; die "wget could not download $1 (network down, proxy, or the address moved?); download enwik8.zip by hand into '$dest' and run this again"; }
  else
    die "neither curl nor wget is installed (Debian/Ubuntu: sudo apt-get install curl)"
  fi
  mv -f "$part" "$2"
}

if check "$raw"; then
  say "'$raw' is already there and checks out (size $SIZE, md5 $MD5)"
else
  if [ -e "$raw" ]; then say "replacing '$raw'"; rm -f "$raw"; fi
  if [ ! -f "$zip" ]; then
    say "downloading $URL (about 36 MB)"
    download "$URL" "$zip"
  else
    say "using the existing '$zip'"
  fi
  tmpdir="$(mktemp -d "$dest/.enwik8.XXXXXX")"
  trap 'rm -rf "$tmpdir"' EXIT
  unzip -q -o "$zip" enwik8 -d "$tmpdir" ||
    { rm -f "$zip"; die "'$zip' is not a valid zip holding 'enwik8' (truncated download?); it was removed, run this again"; }
  if ! check "$tmpdir/enwik8"; then
    rm -f "$zip"
    die "the unpacked enwik8 fails its check (see above): '$zip' was removed; run this again, or get enwik8.zip from another copy"
  fi
  mv -f "$tmpdir/enwik8" "$raw"
  rm -f "$zip"
  say "wrote '$raw' (size $SIZE, md5 $MD5 checked)"
fi

if check_gz "$gz"; then
  say "'$gz' is already there and checks out"
else
  say "compressing to '$gz' (gzip -9 -n, about 10-30 s)"
  gzip -9 -n -c "$raw" >"$gz.part" || { rm -f "$gz.part"; die "gzip failed writing '$gz' (disk full?)"; }
  mv -f "$gz.part" "$gz"
  say "wrote '$gz'"
fi
echo "$raw"
echo "$gz"
