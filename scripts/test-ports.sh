#!/usr/bin/env bash
# Free ports for the tests' throwaway servers (sourced by scripts/test-*.sh).
# A server is asked for a first port (the configured IDEM_TEST_*_PORT, or a
# test's own); it takes the first port from there on that nothing on the
# machine listens on, so a developer's own Redis on 26391 (say) does not
# keep the tests from running. The port taken is in the server's state
# directory (STATE_DIR/port, STATE_DIR/url), where the tests read it.

# port_free PORT: nothing listens on PORT (on 127.0.0.1 or any other
# address) and nothing answers a connection to 127.0.0.1:PORT.
port_free() {
  local p=$1
  [ "$p" -ge 1 ] && [ "$p" -le 65535 ] || return 1
  if command -v ss >/dev/null && ss -Htln "sport = :$p" 2>/dev/null | grep -q .; then return 1; fi
  ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null
}

# free_port FIRST [SPAN]: prints the first port P >= FIRST such that P ..
# P+SPAN-1 are all free (SPAN: how many consecutive ports the server takes;
# 1 by default). Looks at the next 200 candidates; exits 3 when none is free.
free_port() {
  local first=$1 span=${2:-1} p k ok
  for ((p = first; p < first + 200 * span && p + span - 1 <= 65535; p += span)); do
    ok=1
    for ((k = 0; k < span; k++)); do port_free $((p + k)) || { ok=0; break; }; done
    if [ "$ok" = 1 ]; then echo "$p"; return 0; fi
  done
  echo "no free port on 127.0.0.1 from $first on (${span} consecutive)" >&2
  return 3
}

# say_port WHO FIRST PORT: tells (on stderr) which port a server takes
# when the first one was taken.
say_port() {
  [ "$2" = "$3" ] || echo "$1: port $2 on 127.0.0.1 is in use: using $3" >&2
}
