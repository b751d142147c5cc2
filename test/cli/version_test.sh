#!/usr/bin/env bash
# idem --version and idem version print the project's version (CMake's
# PROJECT_VERSION, passed in: never written here), in text and in JSON, with
# exit status 0; idem --help lists the command; bad usage is exit 2.
# usage: version_test.sh IDEM_BINARY EXPECTED_VERSION
set -uo pipefail
IDEM=$1 WANT=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0 pass=0
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"

[[ "$WANT" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "FAIL: expected version '$WANT' is not MAJOR.MINOR.PATCH"; exit 1; }
for form in "--version" "version"; do
  check "$form" 0 "$IDEM" $form && is "$form-text" "$T/out" "idem $WANT"
  is "$form-quiet-stderr" "$T/err" ""
  check "$form --json" 0 "$IDEM" $form --json && is "$form-json" "$T/out" "{\"version\":\"$WANT\"}"
done
check version-help 0 "$IDEM" version --help
has version-help-usage "$T/out" "usage: idem version"
has version-help-json "$T/out" "--json"
check help 0 "$IDEM" --help
has help-lists-version "$T/out" "^  version +Print the version"
has help-names-flag "$T/out" "idem --version"
check version-stray-argument 2 "$IDEM" version 1.0
check version-unknown-flag 2 "$IDEM" --version --short
has version-unknown-flag-named "$T/err" "unknown flag --short"
echo "version: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
