#!/usr/bin/env bash
# Checks container/flashcos.def without Apptainer: builds a chroot of the recipe's Debian release
# (OSVersion, MirrorURL) with mmdebstrap --variant=minbase (what Apptainer's debootstrap bootstrap
# makes), then runs the recipe's own %setup, %post and %test sections, taken from the .def file, in
# it. First it checks that the recipe installs exactly scripts/setup.sh's package list.
#
#   sudo scripts/container_check.sh [log]     # root (mount, chroot); Debian/Ubuntu with mmdebstrap
#
# Environment: JOBS (build jobs inside, default nproc), WORKDIR (where the chroot goes, default a new
# folder under /var/tmp; it takes ~15 GB), KEEP=1 keeps the chroot afterwards, CUDA_TOOLKIT_DIR (a
# host CUDA toolkit, e.g. /usr/local/cuda-13.0, mounted read-only: needed to configure against the
# CUDA torch wheel from PyPI when the CPU wheel is unreachable; the recipe itself brings none).
# Not covered: Apptainer itself (SIF image, %environment, %runscript through `apptainer run`) and
# a GPU (GPU suites skip).
set -euo pipefail
cd "$(dirname "$0")/.."
DEF=container/flashcos.def

die() { echo "container_check.sh: error: $*" >&2; exit 1; }
say() { printf '[container_check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap, mount and chroot); run it with sudo"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (sudo apt-get install mmdebstrap)"
[ -f "$DEF" ] || die "$DEF not found"
git rev-parse HEAD >/dev/null 2>&1 || die "not a git checkout (the recipe's %setup exports git HEAD)"

if [ $# -ge 1 ]; then exec > >(tee -a "$1") 2>&1; fi

# A header value of the recipe ("OSVersion: bookworm").
header() { awk -v k="$1" '/^%/ { exit } index($0, k ":") == 1 { sub(/^[^:]*: */, ""); print; exit }' "$DEF"; }
# The body of a section: the lines after "%name" up to the next "%section" line.
section() { awk -v s="%$1" '/^%[a-z]+/ { on = ($1 == s); next } on' "$DEF"; }
# Package names: the words after "apt-get install -y -qq" up to the line without a trailing "\".
def_packages() {
  section post | awk '/apt-get install/ { on = 1 } on { print; if ($0 !~ /\\$/) exit }' |
    tr -s ' \\' '\n' | grep -v -e '^$' -e '^apt-get$' -e '^install$' -e '^-' | sort
}
setup_packages() {
  awk '/^for p in / { on = 1 } on { print; if ($0 ~ /; do/) exit }' scripts/setup.sh |
    sed -e 's/^for p in //' -e 's/; do.*//' | tr -s ' \\' '\n' | grep -v '^$' | sort
}

release=$(header OSVersion); mirror=$(header MirrorURL)
[ "$(header Bootstrap)" = debootstrap ] || die "$DEF: expected 'Bootstrap: debootstrap'"
[ -n "$release" ] && [ -n "$mirror" ] || die "$DEF: OSVersion or MirrorURL missing"
for s in setup post test runscript; do
  [ -n "$(section "$s")" ] || die "$DEF: section %$s missing or empty"
done
if ! diff <(setup_packages) <(def_packages) >/dev/null; then
  diff <(setup_packages) <(def_packages) || true
  die "the package list of $DEF differs from scripts/setup.sh's (< setup.sh, > recipe)"
fi
say "recipe: $DEF, Debian $release from $mirror, $(def_packages | wc -l) packages = scripts/setup.sh's list"
say "source: git HEAD $(git rev-parse --short HEAD) ($(git log -1 --format=%cd --date=iso-strict HEAD))"

WORKDIR=${WORKDIR:-$(mktemp -d /var/tmp/flashcos-container.XXXXXX)}
mkdir -p "$WORKDIR"; rootfs="$WORKDIR/rootfs"
[ ! -e "$rootfs" ] || die "$rootfs exists already; give an empty WORKDIR"
mounts_under_rootfs() { findmnt -rn -o TARGET | awk -v p="$rootfs/" 'index($0, p) == 1'; }
cleanup() {
  local rc=$?
  # Every mount under the chroot, deepest first; nothing is removed while one is left.
  mounts_under_rootfs | sort -r | while read -r m; do umount -l "$m" || true; done
  if [ "${KEEP:-0}" = 1 ]; then
    say "kept the chroot in $rootfs"
  elif [ -d "$rootfs" ] && [ -z "$(mounts_under_rootfs)" ]; then
    rm -rf --one-file-system "$WORKDIR"
  fi
  exit $rc
}
trap cleanup EXIT

say "mmdebstrap --variant=minbase $release"
mmdebstrap --variant=minbase --quiet "$release" "$rootfs" "$mirror"

say "%setup (on the host, APPTAINER_ROOTFS=$rootfs)"
APPTAINER_ROOTFS="$rootfs" SINGULARITY_ROOTFS="$rootfs" /bin/sh -e -c "$(section setup)"

# What Apptainer provides during a build: /proc, /sys, /dev and the host's resolver.
mount -t proc proc "$rootfs/proc"
mount --rbind /sys "$rootfs/sys" && mount --make-rslave "$rootfs/sys"
mount --rbind /dev "$rootfs/dev" && mount --make-rslave "$rootfs/dev"
cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf"
# CUDA_TOOLKIT_DIR: a CUDA toolkit of the host, read-only at the same path, named by CUDA_PATH (as
# on a machine with the toolkit installed): a CUDA libtorch's CMake config enables CUDA, so nvcc
# must be found; flashcos then compiles its kernels too (no GPU needed for that).
toolkit_env=()
if [ -n "${CUDA_TOOLKIT_DIR:-}" ]; then
  [ -x "$CUDA_TOOLKIT_DIR/bin/nvcc" ] || die "CUDA_TOOLKIT_DIR=$CUDA_TOOLKIT_DIR has no bin/nvcc"
  mkdir -p "$rootfs$CUDA_TOOLKIT_DIR"
  mount --bind "$CUDA_TOOLKIT_DIR" "$rootfs$CUDA_TOOLKIT_DIR"
  mount -o remount,bind,ro "$rootfs$CUDA_TOOLKIT_DIR"
  toolkit_env=(CUDA_PATH="$CUDA_TOOLKIT_DIR")
  say "host CUDA toolkit $CUDA_TOOLKIT_DIR visible read-only as CUDA_PATH"
fi
# Networks that intercept TLS: the host's CA bundle for pip and curl (not a part of the image).
ca_env=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/tmp/host-ca-bundle.crt"
  ca_env=(SSL_CERT_FILE=/tmp/host-ca-bundle.crt PIP_CERT=/tmp/host-ca-bundle.crt)
fi

in_chroot() {  # in_chroot SECTION: the section's body under /bin/sh -e, as Apptainer runs it
  section "$1" > "$rootfs/tmp/section-$1.sh"
  chroot "$rootfs" /usr/bin/env -i HOME=/root TERM=dumb LC_ALL=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin JOBS="${JOBS:-$(nproc)}" "${ca_env[@]}" "${toolkit_env[@]}" \
    /bin/sh -e "/tmp/section-$1.sh"
}

say "%post"
start=$(date +%s)
in_chroot post || { rc=$?; say "%post FAILED (exit $rc) after $(( ($(date +%s) - start) / 60 )) min"; exit $rc; }
say "%post passed in $(( ($(date +%s) - start) / 60 )) min"

say "%test"
start=$(date +%s)
in_chroot test || { rc=$?; say "%test FAILED (exit $rc)"; exit $rc; }
say "%test passed in $(( ($(date +%s) - start) / 60 )) min"
say "/opt/flashcos in the image: $(du -sh "$rootfs/opt/flashcos" | cut -f1)," \
    "torch $(chroot "$rootfs" /opt/flashcos/.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"
say "OK: the recipe's %setup, %post and %test ran in a Debian $release chroot"
