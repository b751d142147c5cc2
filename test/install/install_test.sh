#!/usr/bin/env bash
# Installs idem into a temporary prefix and builds the payments example
# against it with find_package(idem COMPONENTS sqlite embedded http), then
# runs it (its consumer calls a provider it serves on loopback over HTTP).
# Then builds examples/testing against it (the test kit) and runs its tests.
# usage: install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$1 BUILD=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null
test -f "$T/prefix/include/idem/inbox.h"
test -f "$T/prefix/lib/cmake/idem/idemConfig.cmake" || test -f "$T"/prefix/lib/*/cmake/idem/idemConfig.cmake
cmake -S "$SRC/examples/payments" -B "$T/example" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$T/prefix" >/dev/null
cmake --build "$T/example" >/dev/null
mkdir "$T/run"
"$T/example/payments_example" "$T/run" | tee "$T/out"
grep -q "order-1042 charged 4000 cents in 1 row(s)" "$T/out"
grep -q "applied 2, duplicates skipped 2" "$T/out"
grep -q "provider (HTTP on http://127.0.0.1:[0-9]*): 2 charge(s), 6500 cents" "$T/out"
# The test kit, as a user's test suite uses it: find_package(idem COMPONENTS
# sqlite testing) and GoogleTest; the corrected handlers pass, the wrong ones
# are caught with their reports.
cmake -S "$SRC/examples/testing" -B "$T/kit" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$T/prefix" >/dev/null
cmake --build "$T/kit" >/dev/null
"$T/kit/handlers_test" >"$T/kit.out" 2>&1 || { cat "$T/kit.out" >&2; exit 1; }
grep -q '"outside-ledger" on sqlite is NOT idempotent' "$T/kit.out"
grep -q '\[lost_response\] the answer to the first call for "pay-0" lost' "$T/kit.out"
# A component that does not exist is refused at configure time.
mkdir "$T/bad" && cat >"$T/bad/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(bad CXX)
find_package(idem REQUIRED COMPONENTS nosuchthing)
CM
if cmake -S "$T/bad" -B "$T/bad/b" -DCMAKE_PREFIX_PATH="$T/prefix" >/dev/null 2>&1; then
  echo "find_package accepted an unknown component" >&2; exit 1
fi
echo "install: 1 passed, 0 failed"
