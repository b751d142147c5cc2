#!/usr/bin/env bash
# Runs a command where the development files of the optional components'
# libraries (PostgreSQL, Redis, RabbitMQ, Kafka, cpp-httplib)
# cannot be seen: in a private mount namespace, every file of their -dev
# packages (headers, .pc files, CMake package files, the .so links, static
# archives, pg_config) is hidden under an overlay whiteout. Nothing outside
# the command's own namespace changes. Needs root (unshare -m); exits 77
# (skipped) without it.
# usage: hide_dev_files.sh COMMAND [ARG...]
set -euo pipefail
HIDE_PACKAGES=(libpq-dev libhiredis-dev librabbitmq-dev librdkafka-dev libcpp-httplib-dev)

if [ "${IDEM_HIDE_DEV_FILES_INNER:-}" != 1 ]; then
  if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
    echo "hide_dev_files: needs root and unshare -m (a private mount namespace): skipped" >&2
    exit 77
  fi
  IDEM_HIDE_DEV_FILES_INNER=1 exec unshare -m --propagation private bash "$0" "$@"
fi

# Inside the namespace. A tmpfs holds the overlays' upper and work dirs.
T=$(mktemp -d)
mount -t tmpfs idem-hide "$T"
files=()
for p in "${HIDE_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || continue
  while IFS= read -r f; do
    case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
    if [ -L "$f" ] || [ -f "$f" ]; then files+=("$f"); fi
  done < <(dpkg -L "$p")
done
# One overlay per top directory (/usr/include, /usr/lib/x86_64-linux-gnu, ...):
# its upper layer has a whiteout (a 0:0 character device) per hidden file.
declare -A tops=()
for f in "${files[@]}"; do
  case "$f" in
    /usr/include/*) top=/usr/include ;;
    /usr/lib/*/*) top=$(echo "$f" | cut -d/ -f1-4) ;;
    /usr/share/*/*) top=$(echo "$f" | cut -d/ -f1-4) ;;
    *) top=$(dirname "$f") ;;
  esac
  n=${tops[$top]:-}
  if [ -z "$n" ]; then
    n=${#tops[@]}
    tops[$top]=$n
    mkdir -p "$T/u$n" "$T/w$n"
  fi
  rel=${f#"$top"/}
  mkdir -p "$T/u$n/$(dirname "$rel")"
  mknod "$T/u$n/$rel" c 0 0
done
for top in "${!tops[@]}"; do
  n=${tops[$top]}
  mount -t overlay idem-hide -o "lowerdir=$top,upperdir=$T/u$n,workdir=$T/w$n" "$top"
done
# The check of the check: none of those files is visible any more.
for f in "${files[@]}"; do
  if [ -e "$f" ] || [ -L "$f" ]; then echo "hide_dev_files: $f is still visible" >&2; exit 1; fi
done
for m in libpq hiredis librabbitmq rdkafka cpp-httplib; do
  if pkg-config --exists "$m" 2>/dev/null; then echo "hide_dev_files: pkg-config still finds $m" >&2; exit 1; fi
done
echo "hide_dev_files: ${#files[@]} development files of ${HIDE_PACKAGES[*]} hidden" >&2
exec "$@"
