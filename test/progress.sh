# Progress lines for the long steps of the tests' setup (test/deps.sh, test/realengine/build.sh),
# sourced by them. Lines go to file descriptor 3, which the sourcing script points at its stderr,
# so a step's own output redirected to a log or /dev/null never takes them along.
#
#   PROGRESS_PREFIX=name        the word every line starts with
#   USHER_SETUP_START           epoch seconds the setup began (exported: the elapsed time runs on
#                               across the scripts); default now
#   USHER_PROGRESS_EVERY        seconds between "still ..." lines of a running step; default 30

exec 3>&2
export USHER_SETUP_START="${USHER_SETUP_START:-$(date +%s)}"
USHER_PROGRESS_EVERY="${USHER_PROGRESS_EVERY:-30}"

# say MESSAGE: one line with the time elapsed since the setup began.
say() { echo "${PROGRESS_PREFIX:-setup} [$(( $(date +%s) - USHER_SETUP_START )) s]: $*" >&3; }

# start_ticker WHAT: in a child, says every $USHER_PROGRESS_EVERY seconds that WHAT still runs,
# with the time since now; the child's PID is left in $ticker for stop_ticker, and it ends by
# itself once this shell is gone.
start_ticker() {
  local what=$1 t0
  t0=$(date +%s)
  (
    trap - EXIT
    while sleep "$USHER_PROGRESS_EVERY"; do
      kill -0 "$$" 2>/dev/null || exit 0
      say "still $what ($(( $(date +%s) - t0 )) s)"
    done
  ) &
  ticker=$!
}

stop_ticker() {
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
}

# step WHAT COMMAND...: says WHAT, runs COMMAND, and while it runs says every
# $USHER_PROGRESS_EVERY seconds that it still does, with the step's own time; returns its status.
step() {
  local what=$1 t0 ticker rc=0
  shift
  t0=$(date +%s)
  say "$what"
  start_ticker "$what"
  "$@" || rc=$?
  stop_ticker
  if [ "$rc" -eq 0 ]; then say "$what: done in $(( $(date +%s) - t0 )) s"; fi
  return "$rc"
}
