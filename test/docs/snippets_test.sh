#!/usr/bin/env bash
# The docs' code is tested: every ```cpp block of README.md and doc/*.md is
# compiled and linked against the INSTALLED library (cmake --install, then
# find_package(idem COMPONENTS ...)), all of them in one generated CMake
# project (one executable per block: one configure, one build).
#
# The convention, for whoever writes the docs:
#  - A block containing `int main(` is a whole program: compiled as it is,
#    linked, and run in an empty directory of its own; it must exit 0 within
#    60 s. So a whole program in the docs needs no server: show code that
#    needs one as a fragment.
#  - Any other block is a fragment. Its `#include` lines go to file scope;
#    every other line goes, in order, into a block inside the body of
#      idem::Status Fragment(<the prelude below>) { { <fragment> } return idem::Status::OK(); }
#    so a fragment is statements (no function definitions; lambdas are
#    fine), may `return` a Status (or a Result's status()), and may use the
#    prelude's names without declaring them (or declare its own: they shadow).
#  - A block that must not be compiled (pseudo-code) is fenced ```cpp-ignore
#    (any fence other than exactly ```cpp is not compiled): avoid it.
#  - Every block compiles without a warning under -Wall -Wextra (-Werror
#    here), as users build it: with the C++ compiler CMake finds (g++), and
#    again with clang++ when it is installed. (g++ warns about a designated
#    initializer that leaves out a member without a default member
#    initializer: every member of a public struct has one, `{}` at least.)
# Compiler errors name the doc's own file and line (#line directives), and
# the test says which block failed (file and the line of its ```cpp fence).
# usage: snippets_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$1 BUILD=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# The prelude: the names a fragment may use without declaring them. Keep it
# tiny: a reader sees none of it.
PRELUDE='#include <string>

#include "idem/claims.h"
#include "idem/inbox.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/status.h"

struct Provider {  // your payment provider'"'"'s client
  idem::Result<std::string> Charge(const std::string&, const std::string&) { return std::string("ch_1"); }
};

idem::Status Fragment([[maybe_unused]] const idem::Message& message,  // the message being handled
                      [[maybe_unused]] idem::Source& source,          // a source
                      [[maybe_unused]] idem::Inbox& inbox,            // an inbox on a store
                      [[maybe_unused]] idem::Claims& claims,          // idem::Claims on any ClaimStore
                      [[maybe_unused]] Provider& provider,
                      [[maybe_unused]] const std::string& idempotency_key,  // an HTTP request'"'"'s key and body
                      [[maybe_unused]] const std::string& body) {'

# 1. Extract: s<N>.where (file, fence line), s<N>.all (the block as it is),
# s<N>.inc (its #include lines) and s<N>.body (the rest), each line preceded
# by a #line directive naming its place in the doc.
mkdir "$T/p"
(cd "$SRC" && awk -v out="$T/p" '
  function at(f) { printf "#line %d \"%s\"\n", FNR, FILENAME > f }
  FNR == 1 { if (fence) { print FILENAME_PREV ": unclosed ``` fence" > "/dev/stderr"; bad = 1 } fence = 0; cpp = 0 }
  { FILENAME_PREV = FILENAME }
  !fence && /^[ \t]*```cpp[ \t]*$/ { fence = 1; cpp = 1; n++; b = out "/s" n; printf "%s\t%d\n", FILENAME, FNR > (b ".where"); next }
  !fence && /^[ \t]*```/ { fence = 1; next }
  fence && /^[ \t]*```[ \t]*$/ { fence = 0; if (cpp) { close(b ".where"); close(b ".all"); close(b ".inc"); close(b ".body") } cpp = 0; next }
  cpp { at(b ".all"); print > (b ".all")
        if ($0 ~ /^[ \t]*#[ \t]*include[ \t]/) { at(b ".inc"); print > (b ".inc") } else { at(b ".body"); print > (b ".body") } }
  END { if (fence) { print FILENAME ": unclosed ``` fence" > "/dev/stderr"; bad = 1 } exit bad }
' README.md doc/*.md)

# 2. Generate one source per block, and the project.
programs=() fragments=()
for w in "$T"/p/s*.where; do
  s=$(basename "$w" .where)
  touch "$T/p/$s.inc" "$T/p/$s.body" "$T/p/$s.all"
  if grep -q 'int main(' "$T/p/$s.all"; then
    cp "$T/p/$s.all" "$T/p/$s.cc"
    programs+=("$s")
  else
    { cat "$T/p/$s.inc"; printf '#line 1 "snippets_test.sh: the prelude"\n%s\n{\n' "$PRELUDE"; cat "$T/p/$s.body"
      printf '#line 1 "snippets_test.sh: after the fragment"\n}\nreturn idem::Status::OK();\n}\nint main() {}\n'; } >"$T/p/$s.cc"
    fragments+=("$s")
  fi
done
all=("${programs[@]}" "${fragments[@]}")
if [ ${#all[@]} -eq 0 ]; then
  echo "no \`\`\`cpp block found in README.md or doc/*.md: the extraction is broken" >&2; exit 1
fi
where() { tr '\t' ':' <"$T/p/$1.where"; }
cat >"$T/p/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(idem_doc_snippets LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
find_package(idem REQUIRED COMPONENTS sqlite embedded postgres redis http httplib redis_streams amqp kafka sqs pubsub dynamodb open testing)
find_package(GTest REQUIRED)  # doc/testing.md's blocks are GoogleTest programs
foreach(s IN ITEMS ${all[*]})
  add_executable(\${s} \${s}.cc)
  target_compile_options(\${s} PRIVATE -Wall -Wextra -Werror)
  target_link_libraries(\${s} PRIVATE idem::core idem::sqlite idem::embedded idem::postgres idem::redis
                        idem::http idem::httplib idem::redis_streams idem::amqp idem::kafka idem::sqs idem::pubsub
                        idem::dynamodb idem::open idem::testing
                        GTest::gtest)
endforeach()
CM

# 3. Install, configure once, build all (going on past failures).
cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null
failed=0
# build DIR [CMAKE ARGS...]: configure the project in DIR and build every
# block; each block that does not compile (or warns) or link is a failure.
build() {
  local dir=$1 s
  shift
  cmake -S "$T/p" -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$T/prefix" "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log" >&2; echo "the snippets' project does not configure against the installed idem" >&2; exit 1; }
  cmake --build "$dir" -- -k 0 >"$dir.build.log" 2>&1 || true
  for s in "${all[@]}"; do
    if [ ! -x "$dir/$s" ]; then
      echo "FAILED $(where "$s"): this \`\`\`cpp block does not compile without warnings, or does not link ($(basename "$dir")):" >&2
      cmake --build "$dir" --target "$s" 2>&1 | grep -v '^\[\|^ninja: build stopped\|^FAILED: ' | sed 's/^/  /' >&2 || true
      failed=$((failed + 1))
    fi
  done
}
build "$T/b"
if command -v clang++ >/dev/null; then
  build "$T/b-clang" -DCMAKE_CXX_COMPILER=clang++
fi

# 4. Run the whole programs, each in an empty directory.
ran=0
for s in "${programs[@]}"; do
  [ -x "$T/b/$s" ] || continue
  mkdir "$T/run-$s"
  rc=0
  (cd "$T/run-$s" && timeout 60 "$T/b/$s") >"$T/$s.out" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "ran $(where "$s"):"
    sed 's/^/  /' "$T/$s.out"
    ran=$((ran + 1))
  else
    if [ "$rc" -eq 124 ]; then why="did not end within 60 s"; else why="exited $rc"; fi
    echo "FAILED $(where "$s"): this program $why when run:" >&2
    sed 's/^/  /' "$T/$s.out" >&2
    failed=$((failed + 1))
  fi
done
echo "docs: ${#all[@]} \`\`\`cpp blocks (${#programs[@]} programs, ${#fragments[@]} fragments), $ran run, $failed failed"
[ "$failed" -eq 0 ]
