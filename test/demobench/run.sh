#!/usr/bin/env bash
# The demo against its own banner's bench line (issue 30's demo goal): `usher demo` as a newcomer
# starts it, then the banner's line with the interactive tenant alone, with both tenants twice,
# IDLE of nothing, and with both again. Prints interactive TTFT p50/p99 per run, the p99 over
# alone, the interactive requests the gateway judged to meet their default TTFT objective, batch
# requests served, and every learned-limit move the gateway logged. Bounded: four
# runs of 30 s of arrivals (plus their drains) and IDLE.
#
#   test/demobench/run.sh
#   IDLE=1m test/demobench/run.sh
#   USHER_BIN=/tmp/usher-old test/demobench/run.sh   # the demo of another build
#   OUT_DIR=/tmp/demo test/demobench/run.sh          # keep the demo's log (access log) and reports
set -euo pipefail
cd "$(dirname "$0")/../.."

IDLE=${IDLE:-10m}
LISTEN=${LISTEN:-127.0.0.1:19300}

command -v jq >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && apt-get install -y -qq jq >/dev/null; } || { echo "demobench needs jq" >&2; exit 1; }
if [ -z "${USHER_BIN:-}" ]; then go build -o bin/usher ./cmd/usher; fi
bin=$(realpath "${USHER_BIN:-bin/usher}")
tmp=$(mktemp -d)
demo=
cleanup() {
  [ -n "$demo" ] && kill "$demo" 2>/dev/null; wait 2>/dev/null || true
  if [ -n "${OUT_DIR:-}" ]; then mkdir -p "$OUT_DIR" && cp "$tmp"/*.log "$tmp"/*.json "$OUT_DIR"/ 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

(cd "$tmp" && exec "$bin" demo --listen "$LISTEN" >"$tmp/demo.log" 2>&1) &
demo=$!
for _ in $(seq 100); do grep -q ' bench --url' "$tmp/demo.log" 2>/dev/null && break; sleep 0.1; done
line=$(grep ' bench --url' "$tmp/demo.log" | head -1) || { echo "the demo printed no bench line:" >&2; cat "$tmp/demo.log" >&2; exit 1; }
# The banner's line, as a newcomer pastes it, without its HTML report.
read -r -a both <<<"${line% --html report.html}"
both=("$bin" "${both[@]:1}")
alone=()
skip=0
for a in "${both[@]}"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  if [ "$a" = --tenant ]; then skip=2; fi
  if [ "$skip" = 2 ]; then skip=0; pending=$a; continue; fi
  if [ -n "${pending:-}" ]; then
    case $a in bulk=*) ;; *) alone+=("$pending" "$a") ;; esac
    pending=; continue
  fi
  alone+=("$a")
done
echo "demobench: $bin demo on $LISTEN; the banner's bench line, alone (chat only) and beside (chat + bulk); idle $IDLE before the last"

# ttft VERDICT: the gateway's count of interactive requests judged VERDICT against their TTFT
# objective so far (the demo's default objective; /metrics).
ttft() { curl -s "http://$LISTEN/metrics" | awk -v v="verdict=\"$1\"" '/^usher_objective_ttft_total/ && /class="interactive"/ && index($0, v) { n += $NF } END { print n + 0 }'; }
alone_p99=
run() { # NAME ARGS...
  local name=$1; shift
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  local met0 missed0; met0=$(ttft met); missed0=$(ttft missed)
  (cd "$tmp" && "$@" --quiet --out "$tmp/$name.json" >"$tmp/$name.txt" 2>&1) || true
  local met missed; met=$(($(ttft met) - met0)); missed=$(($(ttft missed) - missed0))
  local p50 p99 n batch
  p50=$(jq -r '.classes[] | select(.name=="interactive") | .ttft_ms.p50 | round' "$tmp/$name.json")
  p99=$(jq -r '.classes[] | select(.name=="interactive") | .ttft_ms.p99 | round' "$tmp/$name.json")
  n=$(jq -r '.classes[] | select(.name=="interactive") | .ok' "$tmp/$name.json")
  batch=$(jq -r '[.classes[] | select(.name=="batch") | .ok] | first // 0' "$tmp/$name.json")
  [ -z "$alone_p99" ] && alone_p99=$p99
  printf '  %-16s interactive TTFT p50/p99 %s/%s ms (%s requests), %sx alone, objective met %s of %s judged; batch served %s  (%s, load average %s)\n' \
    "$name" "$p50" "$p99" "$n" "$(awk -v a="$p99" -v b="$alone_p99" 'BEGIN { printf "%.2f", a / b }')" "$met" "$((met + missed))" "$batch" "$(date -u +%H:%M:%S)" "$load"
}
run alone "${alone[@]}"
run beside "${both[@]}"
run "beside again" "${both[@]}"
echo "  idle for $IDLE"
sleep "$IDLE"
run "after idle" "${both[@]}"
echo "  learned-limit moves logged: $(grep -c 'worker concurrency limit' "$tmp/demo.log" || true)"
grep 'worker concurrency limit' "$tmp/demo.log" | sed 's/^/    /' | cut -c1-200 | tail -20 || true
