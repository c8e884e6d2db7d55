#!/usr/bin/env bash
# Runs make test's go test command (the arguments), with a line every 30 s while it runs: go test
# prints a package's result only when the package ends, and the end-to-end package runs for
# minutes. Nothing is printed after go test's own last line; the exit status is go test's.
set -uo pipefail
cd "$(dirname "$0")/.."
PROGRESS_PREFIX=test
. test/progress.sh
t0=$(date +%s)
(
  trap - EXIT
  while sleep "$USHER_PROGRESS_EVERY"; do
    kill -0 "$$" 2>/dev/null || exit 0
    say "go test is still running ($(( $(date +%s) - t0 )) s)"
  done
) &
ticker=$!
"$@"
rc=$?
kill "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
exit "$rc"
