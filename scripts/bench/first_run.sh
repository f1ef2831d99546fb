#!/usr/bin/env bash
# A new user's first run, measured: from a fresh clone on a fresh Debian 12 system to the first
# streamed token of `scripts/run.sh` (its apt step, the `tandem` build from an empty compiler
# cache, the cluster start and the client call). The fresh system is a minimal Debian 12 root
# made by debootstrap (no build tools, no libraries, empty apt and compiler caches) entered with
# chroot; it downloads from the same apt sources as this machine. Runs as root. Prints every line
# of run.sh with the seconds since its start, then the seconds to the first streamed token.
# Usage: scripts/bench/first_run.sh [WORKDIR]   (default /tmp/tandem-first-run; needs ~2 GB)
# Environment: REPO (the clone's source, default this checkout's repository; its HEAD is cloned),
# PRIORITY (nice value of the run, default -10: other work on the machine yields to it).
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "first_run.sh: run as root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
work="${1:-/tmp/tandem-first-run}"
repo="${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}"
root="$work/root"
mkdir -p "$work"
unmount() { for m in dev/pts dev proc sys; do umount "$root/$m" 2>/dev/null || true; done; }
unmount
if [ ! -f "$work/pristine.tar" ]; then
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
  tar -C "$root" -cf "$work/pristine.tar" .
fi
rm -rf "$root" && mkdir "$root" && tar -C "$root" -xf "$work/pristine.tar"
cp /etc/resolv.conf "$root/etc/"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
fi
git clone -q "$repo" "$root/root/tandem"
echo "first_run: $(git -C "$root/root/tandem" log --oneline -1)"
trap unmount EXIT
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t sysfs sys "$root/sys"
start=$(date +%s.%N)
first=""
while IFS= read -r line; do
  now=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN {printf "%.1f", a - b}')
  printf '%7s %s\n' "$now" "$line"
  # After the client's banner, the first line that is not a log record carries the first
  # streamed text (a log record starts with its UTC timestamp).
  if [ -z "$first" ] && [ "${seen_banner:-0}" = 1 ] &&
     ! [[ "$line" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z\  ]]; then
    first=$now
  fi
  [[ "$line" == "   build/bin/tandem client"* ]] && seen_banner=1
  if [[ "$line" == "== Serving on"* ]]; then
    for p in $(pgrep -f "bin/tandem serve"); do
      [ "$(readlink "/proc/$p/root")" = "$root" ] && kill -TERM "$p"
    done
  fi
done < <(nice -n "${PRIORITY:--10}" chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
           LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
           bash -c 'cd /root/tandem && exec scripts/run.sh' 2>&1)
echo "first_run: first streamed token after ${first:-?} s (clone excluded)"
