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

# step WHAT COMMAND...: says WHAT, runs COMMAND, and while it runs says every
# $USHER_PROGRESS_EVERY seconds that it still does, with the step's own time; returns its status.
# The ticker is a child that ends with the step, or by itself once this shell is gone.
step() {
  local what=$1 t0 ticker rc=0
  shift
  t0=$(date +%s)
  say "$what"
  (
    trap - EXIT
    while sleep "$USHER_PROGRESS_EVERY"; do
      kill -0 "$$" 2>/dev/null || exit 0
      say "still $what ($(( $(date +%s) - t0 )) s)"
    done
  ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$rc" -eq 0 ]; then say "$what: done in $(( $(date +%s) - t0 )) s"; fi
  return "$rc"
}
