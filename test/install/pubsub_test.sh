#!/usr/bin/env bash
# This tree's install: idem::pubsub as a find_package component and a
# pkg-config module, used by a program outside the tree (test/install/pubsub_app).
# usage: pubsub_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
BUILD=$2
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >/dev/null
CFG=$(dirname "$(find "$P" -name idemConfig.cmake)")
LIB=$(cd "$CFG/../.." && pwd)
for f in "$CFG/idemTargets-pubsub.cmake" "$CFG/idem-pubsub-component.cmake" "$LIB/pkgconfig/idem-pubsub.pc" \
         "$P/include/idem/pubsub/source.h" "$P/include/idem/pubsub/publisher.h"; do
  test -f "$f" || fail "$f is not installed"
done
cmake -S "$HERE/pubsub_app" -B "$T/app" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$P" \
  >"$T/configure.log" 2>&1 || { cat "$T/configure.log" >&2; fail "find_package(idem COMPONENTS pubsub open)"; }
cmake --build "$T/app" >"$T/build.log" 2>&1 || { cat "$T/build.log" >&2; fail "the application does not build"; }
"$T/app/pubsub_app" >"$T/out" || { cat "$T/out" >&2; fail "the CMake application failed"; }
grep -qx "source scheme: pubsub" "$T/out" || { cat "$T/out" >&2; fail "idem::open does not open pubsub://"; }
echo "ok: find_package(idem COMPONENTS pubsub open): built and ran"
export PKG_CONFIG_PATH=$LIB/pkgconfig
flags=$(pkg-config --cflags --libs idem-pubsub idem-open) || fail "pkg-config idem-pubsub idem-open"
# shellcheck disable=SC2086
c++ -std=c++20 -O1 -o "$T/app-pc" "$HERE/pubsub_app/pubsub_app.cc" -Wl,-u,idem_open_link_pubsub $flags \
  || fail "pkg-config's flags do not build the application"
"$T/app-pc" >"$T/out-pc" || { cat "$T/out-pc" >&2; fail "the pkg-config application failed"; }
echo "ok: pkg-config idem-pubsub idem-open: built and ran"
