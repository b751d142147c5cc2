#!/usr/bin/env bash
# This tree's install, and a program built against idem::dynamodb with
# find_package(idem COMPONENTS dynamodb open): its export set, header and
# .pc file are there, the program builds, names dynamodb among the store
# schemes and opens a dynamodb:// URL through idem::open.
# usage: dynamodb_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$(cd "$1" && pwd) BUILD=$2
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >/dev/null
CFG=$(dirname "$(find "$P" -name idemConfig.cmake)")
LIB=$(cd "$CFG/../.." && pwd)
test -f "$CFG/idemTargets-dynamodb.cmake" || fail "no idemTargets-dynamodb.cmake"
test -f "$LIB/pkgconfig/idem-dynamodb.pc" || fail "no idem-dynamodb.pc"
for h in dynamodb/store.h dynamodb/items.h; do test -f "$P/include/idem/$h" || fail "include/idem/$h is not installed"; done
echo "ok: idem::dynamodb installed"
cmake -S "$HERE/dynamodb_app" -B "$T/app" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$P" \
  >"$T/app.log" 2>&1 || { cat "$T/app.log" >&2; fail "find_package(idem COMPONENTS dynamodb open)"; }
cmake --build "$T/app" >>"$T/app.log" 2>&1 || { cat "$T/app.log" >&2; fail "the application does not build"; }
"$T/app/dynamodb_app" >"$T/out" || { cat "$T/out" "$T/app.log" >&2; fail "the application failed"; }
grep -q "^stores: .*dynamodb" "$T/out" || { cat "$T/out" >&2; fail "dynamodb is not among the store schemes"; }
echo "ok: find_package(idem COMPONENTS dynamodb open): built, dynamodb:// opened through idem::open"
echo "install (dynamodb): 2 passed, 0 failed"
