# The command tests' checks (sourced by cli_test.sh and version_test.sh).
# Each counts into the caller's $pass and $fails; output of check goes to
# $T/out and $T/err.
check() {  # check NAME WANT_RC CMD... ; output in $T/out
  local name=$1 want=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL $name: exit $rc, want $want"; sed 's/^/  stdout: /' "$T/out" | head -5; sed 's/^/  stderr: /' "$T/err" | head -5
    fails=$((fails + 1)); return 1
  fi
  pass=$((pass + 1))
}
ok() {  # ok NAME CMD... : passes when CMD succeeds
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL $name: $*"; fails=$((fails + 1)); fi
}
has() {  # has NAME FILE PATTERN
  if grep -qE -- "$3" "$2"; then pass=$((pass + 1)); else echo "FAIL $1: '$3' not in $2:"; head -5 "$2"; fails=$((fails + 1)); fi
}
is() {  # is NAME FILE EXACT_CONTENT
  if [ "$(cat "$2")" = "$3" ]; then pass=$((pass + 1)); else
    echo "FAIL $1: got '$(cat "$2")', want '$3'"; fails=$((fails + 1)); fi
}
free_port() {  # free_port FROM [SPAN]: a port in [FROM, FROM+SPAN) nothing answers on now
  local p
  for _ in $(seq 50); do
    p=$(($1 + RANDOM % ${2:-1000}))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || break
  done
  echo "$p"
}
