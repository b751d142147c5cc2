#!/usr/bin/env bash
# The default build (SQLite + the embedded queue; no option given) where no
# PostgreSQL, Redis, RabbitMQ, Kafka or cpp-httplib
# development files are visible (hide_dev_files.sh): it configures, builds
# the libraries and the idem command, installs only those components'
# libraries and headers, and an application builds against the install with
# find_package(idem COMPONENTS sqlite embedded) and with pkg-config, and runs.
# usage: minimal_test.sh SOURCE_DIR WORK_DIR   (WORK_DIR is emptied first)
set -euo pipefail
SRC=$(cd "$1" && pwd) W=$2
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${IDEM_HIDE_DEV_FILES_INNER:-}" != 1 ]; then
  exec bash "$HERE/hide_dev_files.sh" bash "$0" "$@"
fi
rm -rf "$W" && mkdir -p "$W"
W=$(cd "$W" && pwd)
passed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAILED: $*" >&2; exit 1; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

# 1. Configure with the defaults; only the tools on (no tests, bench, examples).
# Compiled without optimisation: this test is about what is built and
# installed, and -O0 compiles in a third of the time.
cmake -S "$SRC" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O0 "${launcher[@]}" \
  -DIDEM_BUILD_TESTS=OFF -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_BUILD_TOOLS=ON >"$W/configure.log" 2>&1 ||
  { cat "$W/configure.log" >&2; fail "the default configuration does not configure without the optional components' files"; }
for o in POSTGRES REDIS HTTP HTTPLIB AMQP KAFKA KILL_POINTS ALL; do
  grep -q "^IDEM_WITH_$o:BOOL=OFF$" "$W/build/CMakeCache.txt" || fail "IDEM_WITH_$o is not OFF by default"
done
for o in SQLITE EMBEDDED TESTING; do
  grep -q "^IDEM_WITH_$o:BOOL=ON$" "$W/build/CMakeCache.txt" || fail "IDEM_WITH_$o is not ON by default"
done
ok "configured with the defaults (SQLite, embedded, the test kit on; the rest off)"
cmake --build "$W/build" -j "${IDEM_TEST_JOBS:-2}" >"$W/build.log" 2>&1 || { tail -50 "$W/build.log" >&2; fail "the default build does not build"; }
ok "built the libraries and the idem command"

# 2. The command with only SQLite + embedded: what is built works; what is
# not says which option builds it, exit status 2.
IDEM=$W/build/tools/idem/idem
"$IDEM" --help >"$W/help" || fail "idem --help"
grep -q "demo .*not built: configure with -DIDEM_WITH_HTTP=ON" "$W/help" || fail "idem --help does not say how to build demo"
expect2() {
  local what=$1 pattern=$2; shift 2
  local rc=0
  "$@" >"$W/out" 2>"$W/err" || rc=$?
  [ "$rc" -eq 2 ] || { cat "$W/err" >&2; fail "$what: exit $rc, expected 2"; }
  grep -q -- "$pattern" "$W/err" || { cat "$W/err" >&2; fail "$what: the message does not name $pattern"; }
  ok "$what: exit 2, names $pattern"
}
expect2 "idem demo" "-DIDEM_WITH_HTTP=ON" "$IDEM" demo
expect2 "idem chaos" "-DIDEM_WITH_KILL_POINTS=ON" "$IDEM" chaos
expect2 "idem provider" "-DIDEM_WITH_HTTPLIB=ON" "$IDEM" provider
expect2 "idem bench call-first" "-DIDEM_WITH_HTTP=ON" "$IDEM" bench call-first
expect2 "idem schema on postgres://" "IDEM_WITH_POSTGRES" "$IDEM" schema --store postgres://u@127.0.0.1:1/db
expect2 "idem run on redis://" "IDEM_WITH_REDIS" "$IDEM" run --store "sqlite:$W/x.db" --source "redis://127.0.0.1:1?stream=s"
expect2 "idem publish on kafka://" "IDEM_WITH_KAFKA" "$IDEM" publish --source "kafka://127.0.0.1:1?topic=t" --messages 1
mkdir -p "$W/cli"
"$IDEM" publish --source "embedded:$W/cli/queue.db?queue=q" --messages 3 >/dev/null ||
  fail "idem publish on the embedded queue"
"$IDEM" run --source "embedded:$W/cli/queue.db?queue=q" --store "sqlite:$W/cli/idem.db" --drain >/dev/null ||
  fail "idem run on the embedded queue and SQLite"
"$IDEM" schema --store "sqlite:$W/cli/idem.db" >/dev/null || fail "idem schema on SQLite"
ok "idem publish, run (embedded queue, SQLite) and schema run"

# 3. The install: only these components' libraries, headers, CMake and .pc files.
P=$W/prefix
cmake --install "$W/build" --prefix "$P" >/dev/null
LIB=$(dirname "$(find "$P" -name idemConfig.cmake)")/../..
LIB=$(cd "$LIB" && pwd)
# (libidem_sql.a: the SQL stores' shared code; libidem_sqlite_driver.a: the SQLite driver under the
# store, the queue and the test kit: internal libraries the static idem_sqlite, idem_embedded link.)
libs=$(cd "$LIB" && ls libidem_*.a | tr '\n' ' ')
[ "$libs" = "libidem_core.a libidem_embedded.a libidem_open.a libidem_sql.a libidem_sqlite.a libidem_sqlite_driver.a libidem_testing.a " ] || fail "installed libraries: $libs"
pcs=$(cd "$LIB/pkgconfig" && ls | tr '\n' ' ')
[ "$pcs" = "idem-core.pc idem-embedded.pc idem-open.pc idem-sql.pc idem-sqlite.pc idem-sqlite_driver.pc idem-testing.pc " ] || fail "installed .pc files: $pcs"
for h in inbox.h consumer.h store.h status.h open.h version.h sqlite/store.h embedded/queue.h testing/harness.h testing/fake_env.h; do
  test -f "$P/include/idem/$h" || fail "include/idem/$h is not installed"
done
for d in postgres redis http httplib amqp kafka; do
  test ! -e "$P/include/idem/$d" || fail "include/idem/$d is installed by a build without it"
done
for h in sqlite/fault_vfs.h testing/fault_vfs.h testing/kill_points.h; do
  test ! -e "$P/include/idem/$h" || fail "include/idem/$h (kill points, fault VFS) is installed by a production build"
done
ok "installed: $libs; include/idem/ without the components not built"
if grep -rq "IDEM_KILL_POINTS\|IDEM_HAVE_" "$LIB/cmake/idem" "$LIB/pkgconfig"; then
  fail "a build define is in the installed CMake or pkg-config files"
fi
if nm -A "$LIB"/libidem_*.a 2>/dev/null | grep -q " U .*HitKillPoint"; then
  fail "the production libraries call kill points"
fi
if nm -C "$LIB"/libidem_*.a 2>/dev/null | grep -q "FaultVfs\|ArmKillPoint"; then
  fail "the fault VFS or the kill points' arming API is compiled into a library of a production build"
fi
ok "no build define in the installed files; no kill point, no fault VFS in the libraries"

# 4. An application: CMake find_package, then pkg-config.
cmake -S "$HERE/app" -B "$W/app" -G Ninja -DCMAKE_BUILD_TYPE=Release -DIDEM_APP=minimal -DCMAKE_PREFIX_PATH="$P" \
  >"$W/app-configure.log" 2>&1 || { cat "$W/app-configure.log" >&2; fail "find_package(idem COMPONENTS sqlite embedded)"; }
cmake --build "$W/app" >"$W/app-build.log" 2>&1 || { cat "$W/app-build.log" >&2; fail "the application does not build"; }
mkdir "$W/run1"
"$W/app/app" "$W/run1" | grep -q "applied 1 of 2 deliveries" || fail "the CMake application did not apply the message once"
ok "find_package(idem COMPONENTS sqlite embedded): built and ran"
export PKG_CONFIG_PATH=$LIB/pkgconfig
# shellcheck disable=SC2046
c++ -std=c++20 -O1 -o "$W/app-pc" "$HERE/app/minimal.cc" $(pkg-config --cflags --libs idem-sqlite idem-embedded) ||
  fail "pkg-config --cflags --libs idem-sqlite idem-embedded does not build the application"
mkdir "$W/run2"
"$W/app-pc" "$W/run2" | grep -q "applied 1 of 2 deliveries" || fail "the pkg-config application did not apply the message once"
ok "pkg-config idem-sqlite idem-embedded: built and ran"

# 5. A component not installed, and one that does not exist: refused, named.
refused() {
  local what=$1 pattern=$2
  mkdir -p "$W/bad-$what"
  printf 'cmake_minimum_required(VERSION 3.25)\nproject(bad CXX)\nfind_package(idem REQUIRED COMPONENTS %s)\n' "$what" \
    >"$W/bad-$what/CMakeLists.txt"
  if cmake -S "$W/bad-$what" -B "$W/bad-$what/b" -DCMAKE_PREFIX_PATH="$P" >"$W/bad.log" 2>&1; then
    fail "find_package(idem COMPONENTS $what) was accepted"
  fi
  grep -q "$pattern" "$W/bad.log" || { cat "$W/bad.log" >&2; fail "find_package(idem COMPONENTS $what): no '$pattern'"; }
  ok "find_package(idem COMPONENTS $what) refused: $pattern"
}
refused postgres "component postgres is not installed"
refused kafka "component kafka is not installed"
refused nosuchthing "there is no component 'nosuchthing'"
echo "install (minimal): $passed passed, 0 failed"
