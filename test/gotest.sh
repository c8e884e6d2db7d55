#!/usr/bin/env bash
# Runs make test's go test command (the arguments), with a line every 30 s while it runs: go test
# prints a package's result only when the package ends, and the end-to-end package runs for
# minutes. Nothing is printed after go test's own last line; the exit status is go test's.
set -uo pipefail
cd "$(dirname "$0")/.."
PROGRESS_PREFIX=test
. test/progress.sh
start_ticker "running go test"
"$@"
rc=$?
stop_ticker
exit "$rc"
