#!/usr/bin/env bash
# This tree's install with every component: one export set, one .pc file and
# one header folder per component, and an application using each component,
# built with find_package(idem COMPONENTS <all>) and with pkg-config, and run.
# usage: all_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$(cd "$1" && pwd) BUILD=$2
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
passed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAILED: $*" >&2; exit 1; }

P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >/dev/null
CFG=$(dirname "$(find "$P" -name idemConfig.cmake)")
LIB=$(cd "$CFG/../.." && pwd)
components=(core sqlite embedded postgres redis redis_streams http httplib amqp kafka sqs open)
for c in "${components[@]}"; do
  test -f "$CFG/idemTargets-$c.cmake" || fail "no idemTargets-$c.cmake"
  test -f "$CFG/idem-$c-component.cmake" || fail "no idem-$c-component.cmake"
  test -f "$LIB/pkgconfig/idem-$c.pc" || fail "no idem-$c.pc"
  test -f "$LIB/libidem_$c.a" || test -f "$LIB/libidem_$c.so" || fail "no libidem_$c"
done
ok "every component installed: ${components[*]}"
for h in inbox.h open.h sqlite/store.h embedded/queue.h postgres/store.h redis/claim_store.h redis/stream_source.h \
         redis/stream_publisher.h http/client.h http/idempotency.h http/request.h httplib/middleware.h httplib/server.h httplib/gateway.h \
         amqp/source.h amqp/publisher.h kafka/source.h kafka/publisher.h sqs/source.h sqs/publisher.h sqs/connect.h publisher.h url.h transaction.h claim_store.h version.h; do
  test -f "$P/include/idem/$h" || fail "include/idem/$h is not installed"
done
ok "every component's headers installed"
# Each component's export set holds its own target only.
for c in "${components[@]}"; do
  n=$(grep -c "^add_library(idem::" "$CFG/idemTargets-$c.cmake" || true)
  [ "$n" = 1 ] || fail "idemTargets-$c.cmake defines $n targets"
done
ok "one target per export set"
if grep -rq "IDEM_KILL_POINTS\|IDEM_HAVE_" "$CFG" "$LIB/pkgconfig"; then
  fail "a build define is in the installed CMake or pkg-config files"
fi
ok "no build define in the installed CMake and pkg-config files"

cmake -S "$HERE/app" -B "$T/app" -G Ninja -DCMAKE_BUILD_TYPE=Release -DIDEM_APP=all -DCMAKE_PREFIX_PATH="$P" \
  >"$T/configure.log" 2>&1 || { cat "$T/configure.log" >&2; fail "find_package(idem COMPONENTS <all>)"; }
cmake --build "$T/app" >"$T/build.log" 2>&1 || { cat "$T/build.log" >&2; fail "the application does not build"; }
"$T/app/app" >"$T/out" || { cat "$T/out" >&2; fail "the CMake application failed"; }
ok "find_package(idem COMPONENTS ${components[*]}): built and ran"
export PKG_CONFIG_PATH=$LIB/pkgconfig
pcs=()
for c in "${components[@]}"; do pcs+=("idem-$c"); done
flags=$(pkg-config --cflags --libs "${pcs[@]}") || fail "pkg-config ${pcs[*]}"
# shellcheck disable=SC2086
c++ -std=c++20 -O1 -o "$T/app-pc" "$HERE/app/all.cc" $flags || fail "pkg-config's flags do not build the application"
"$T/app-pc" >"$T/out" || { cat "$T/out" >&2; fail "the pkg-config application failed"; }
ok "pkg-config ${pcs[*]}: built and ran"
# idem::open brings only the adapters asked for: open alone needs no
# PostgreSQL, Redis, RabbitMQ or Kafka and opens SQLite and the embedded
# queue; open with kafka opens kafka:// too, linking idem::open only.
open_app() {
  local name=$1 with=$2
  cmake -S "$HERE/open_app" -B "$T/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$P" \
    "-DIDEM_OPEN_WITH=$with" >"$T/$name.log" 2>&1 || { cat "$T/$name.log" >&2; fail "find_package(idem COMPONENTS open $with)"; }
  cmake --build "$T/$name" >>"$T/$name.log" 2>&1 || { cat "$T/$name.log" >&2; fail "open_app ($with) does not build"; }
  "$T/$name/open_app" >"$T/$name.out" || { cat "$T/$name.out" >&2; fail "open_app ($with) failed"; }
}
open_app open-alone ""
grep -qx "stores: sqlite" "$T/open-alone.out" || { cat "$T/open-alone.out" >&2; fail "open alone: store schemes"; }
grep -qx "sources: embedded" "$T/open-alone.out" || { cat "$T/open-alone.out" >&2; fail "open alone: source schemes"; }
grep -q "does not link idem::kafka" "$T/open-alone.out" || { cat "$T/open-alone.out" >&2; fail "open alone: kafka:// not named as not linked"; }
ok "find_package(idem COMPONENTS open): no other adapter loaded, SQLite and embedded open, kafka:// named as not linked"
open_app open-kafka "kafka"
grep -qx "sources: embedded kafka" "$T/open-kafka.out" || { cat "$T/open-kafka.out" >&2; fail "open kafka: source schemes"; }
grep -q "nosuchkey" "$T/open-kafka.out" || { cat "$T/open-kafka.out" >&2; fail "open kafka: kafka:// not parsed by the adapter"; }
ok "find_package(idem COMPONENTS open kafka): kafka:// opens through idem::open, no other adapter loaded"
echo "install (all): $passed passed, 0 failed"
