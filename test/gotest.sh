#!/usr/bin/env bash
# Runs make test's go test command (the arguments), with a line every 30 s while it runs: go test
# prints a package's result only when the package ends, and the end-to-end package runs for
# minutes. When go test fails, a recap follows its own last line: the tests that failed and, when
# a test binary timed out, the tests it was running then (go test prints those at the head of a
# goroutine dump thousands of lines long, which a log's tail never shows). The exit status is go
# test's.
set -uo pipefail
cd "$(dirname "$0")/.."
PROGRESS_PREFIX=test
. test/progress.sh
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start_ticker "running go test"
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
stop_ticker
if [ "$rc" != 0 ]; then
  echo "--- recap of the failures above"
  # A timed-out test binary prints "panic: test timed out after D", then tab-indented "running
  # tests:" and a line per running test; every failed test prints "--- FAIL: Name".
  awk '/^panic: test timed out/ { print; running = 1; next }
       running && /^\t/ { print; next }
       running { running = 0 }
       /^[ \t]*--- FAIL: / || /^FAIL\t/ || /^panic: / { print }' "$out"
fi
exit "$rc"
