#!/usr/bin/env bash
# The npm packages the gateway's real-client test and its peer benchmark
# use, pinned, installed once into ${IDEM_EMULATORS_DIR:-<repo>/.emulators}
# under flock (several builds' tests may start at once). Prints the
# directory whose node_modules holds them.
#   npm-packages.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
emulators=${IDEM_EMULATORS_DIR:-$here/../../../.emulators}
# Change the set's name when a pin changes: an older set stays as it was.
prefix=$emulators/gateway-npm-1
PACKAGES=(express@5.3.0 express-idempotency@1.0.6 express-idempotency-redis-adapter@1.0.8
          http-proxy-middleware@3.0.5 got@14.6.5 stripe@23.2.0)
if [ ! -f "$prefix/.complete" ]; then
  command -v node >/dev/null && command -v npm >/dev/null \
    || { echo "npm-packages: node and npm are needed (apt-get install nodejs npm)" >&2; exit 3; }
  mkdir -p "$emulators"
  (
    flock -w 600 9 || { echo "npm-packages: could not lock $emulators/.gateway-npm.lock" >&2; exit 3; }
    if [ ! -f "$prefix/.complete" ]; then
      echo "npm-packages: installing ${PACKAGES[*]} into $prefix" >&2
      rm -rf "$prefix"
      npm install --no-audit --no-fund --loglevel=error --prefix "$prefix" "${PACKAGES[@]}" >&2 \
        || { echo "npm-packages: npm install failed" >&2; exit 3; }
      touch "$prefix/.complete"
    fi
  ) 9>"$emulators/.gateway-npm.lock"
fi
echo "$prefix"
