#!/usr/bin/env bash
# Installs this tree into a temporary prefix and builds test/install/sqs_app
# against it with find_package(idem COMPONENTS sqs sqlite), then runs it on
# the SQS emulator the CTest fixture "sqs" started (its URL in
# BUILD_DIR/sqs-test/url): two orders published twice, applied once each.
# usage: sqs_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$(cd "$1" && pwd) BUILD=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
endpoint=$(cat "$BUILD/sqs-test/url") || { echo "no SQS emulator in $BUILD/sqs-test (run with ctest)" >&2; exit 1; }
cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null
cmake -S "$SRC/test/install/sqs_app" -B "$T/app" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$T/prefix" \
  >"$T/configure.log" 2>&1 || { cat "$T/configure.log" >&2; exit 1; }
cmake --build "$T/app" >"$T/build.log" 2>&1 || { cat "$T/build.log" >&2; exit 1; }
mkdir "$T/run"
AWS_ACCESS_KEY_ID=AKIDIDEMTEST AWS_SECRET_ACCESS_KEY=idem-test-secret \
  "$T/app/sqs_app" "$endpoint" "install-$$-$(date +%s%N)" "$T/run" | tee "$T/out"
grep -q "sqs: applied 2, duplicates skipped 2" "$T/out"
echo "install sqs: 1 passed, 0 failed"
