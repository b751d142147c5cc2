#!/usr/bin/env bash
# The version is written once, in project(idem VERSION ...), and everything
# installed says the same: this tree's core component installed into a
# temporary prefix, then
#  - include/idem/version.h: IDEM_VERSION_MAJOR/MINOR/PATCH/STRING, and
#    idem::Version() of the linked library, in a program built with
#    find_package(idem MAJOR.MINOR REQUIRED COMPONENTS core);
#  - idemConfigVersion.cmake: the same MAJOR.MINOR is accepted (and the exact
#    version); an earlier or later minor, or another major, is refused
#    (0.x: every incompatible change moves the minor; doc/migration.md);
#  - idem-core.pc: its Version;
#  - the installed idem command (when built): idem --version.
# The expected version is CMake's PROJECT_VERSION, passed in.
# usage: version_test.sh SOURCE_DIR BUILD_DIR EXPECTED_VERSION
set -euo pipefail
BUILD=$2 WANT=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
passed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAILED: $*" >&2; exit 1; }
[[ "$WANT" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] || fail "expected version '$WANT' is not MAJOR.MINOR.PATCH"
MAJOR=${BASH_REMATCH[1]} MINOR=${BASH_REMATCH[2]} PATCH=${BASH_REMATCH[3]}

P=$T/prefix
cmake --install "$BUILD" --prefix "$P" --component core >/dev/null
H=$P/include/idem/version.h
test -f "$H" || fail "include/idem/version.h is not installed with the core component"
for m in "MAJOR $MAJOR" "MINOR $MINOR" "PATCH $PATCH" "STRING \"$WANT\""; do
  grep -q "^#define IDEM_VERSION_$m\$" "$H" || fail "version.h does not define IDEM_VERSION_$m"
done
ok "installed idem/version.h defines $WANT"

# A program that reads the version, as a user's does.
mkdir "$T/app"
cat >"$T/app/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(version_app LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(idem $MAJOR.$MINOR REQUIRED COMPONENTS core)
add_executable(app app.cc)
target_link_libraries(app PRIVATE idem::core)
CM
cat >"$T/app/app.cc" <<'CC'
#include <iostream>

#include "idem/version.h"

static_assert(IDEM_VERSION_MAJOR >= 0 && IDEM_VERSION_MINOR >= 0 && IDEM_VERSION_PATCH >= 0);
int main() {
  std::cout << IDEM_VERSION_MAJOR << "." << IDEM_VERSION_MINOR << "." << IDEM_VERSION_PATCH << " "
            << IDEM_VERSION_STRING << " " << idem::Version() << "\n";
}
CC
cmake -S "$T/app" -B "$T/app/b" -G Ninja -DCMAKE_PREFIX_PATH="$P" >"$T/configure.log" 2>&1 ||
  { cat "$T/configure.log" >&2; fail "find_package(idem $MAJOR.$MINOR COMPONENTS core) refused its own install"; }
cmake --build "$T/app/b" >"$T/build.log" 2>&1 || { cat "$T/build.log" >&2; fail "the version program does not build"; }
got=$("$T/app/b/app")
[ "$got" = "$WANT $WANT $WANT" ] || fail "macros, IDEM_VERSION_STRING, idem::Version(): '$got', want '$WANT' each"
ok "find_package(idem $MAJOR.$MINOR): macros, IDEM_VERSION_STRING and idem::Version() say $WANT"

# Which requested versions the install satisfies.
accepts() {  # accepts YES|NO VERSION_ARGS...
  local want=$1; shift
  local d=$T/fp-$passed-$RANDOM
  mkdir "$d"
  printf 'cmake_minimum_required(VERSION 3.25)\nproject(fp CXX)\nfind_package(idem %s QUIET NO_MODULE)\nif(NOT idem_FOUND)\n  message(FATAL_ERROR "not found")\nendif()\nmessage(STATUS "found idem ${idem_VERSION}")\n' "$*" \
    >"$d/CMakeLists.txt"
  if cmake -S "$d" -B "$d/b" -DCMAKE_PREFIX_PATH="$P" >"$d/log" 2>&1; then
    [ "$want" = YES ] || { cat "$d/log" >&2; fail "find_package(idem $*) accepted $WANT"; }
    grep -q "found idem $WANT\$" "$d/log" || { cat "$d/log" >&2; fail "find_package(idem $*): idem_VERSION is not $WANT"; }
  else
    [ "$want" = NO ] || { cat "$d/log" >&2; fail "find_package(idem $*) refused $WANT"; }
  fi
}
accepts YES "$MAJOR.$MINOR"
accepts YES "$MAJOR.$MINOR.0"
accepts YES "$WANT EXACT"
refused=()
if [ "$MINOR" -gt 0 ]; then refused+=("$MAJOR.$((MINOR - 1))"); fi
refused+=("$MAJOR.$((MINOR + 1))" "$((MAJOR + 1)).0")
for v in "${refused[@]}"; do accepts NO "$v"; done
ok "find_package accepts $MAJOR.$MINOR, $MAJOR.$MINOR.0 and $WANT EXACT; refuses ${refused[*]}"

CFG=$(dirname "$(find "$P" -name idemConfig.cmake)")
pcv=$(PKG_CONFIG_PATH=$CFG/../../pkgconfig pkg-config --modversion idem-core) || fail "pkg-config idem-core"
[ "$pcv" = "$WANT" ] || fail "idem-core.pc says $pcv"
ok "idem-core.pc: Version $WANT"

if [ -x "$BUILD/tools/idem/idem" ]; then
  cmake --install "$BUILD" --prefix "$P" --component tools >/dev/null
  got=$("$P/bin/idem" --version)
  [ "$got" = "idem $WANT" ] || fail "installed idem --version: '$got'"
  ok "installed idem --version: $got"
fi
echo "install (version): $passed passed, 0 failed"
