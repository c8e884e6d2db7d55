#!/usr/bin/env bash
# The cost model's accuracy (issue 31, item 2): how close each worker's predicted TTFT, made
# when a request was placed, comes to the TTFT the engine gave it. usher serve with its default
# config in front of two workers of one engine kind at a time: "slots" (two usher sim --mode
# slots, fixed slots as llama-server), "kv" (two usher sim --mode kv, continuous batching and
# chunked prefill as vLLM) and "llama" (two real llama-servers, when test/realengine has built
# one; skipped otherwise). Per kind: a capacity run (saturating, bench --max-inflight bounds what
# is outstanding) gives R in req/s; then one standard tenant streams at each of LOADS x R, mixed
# prompt lengths (IN ± SPREAD), for DURATION seconds each. The gateway's access log carries, per
# request, engine_ttft_ms (from sending to the worker to its first event: the time the model
# learns) and ttft_pred_ms (what the worker's model predicted at placement for the request's
# real token counts); the capacity run teaches the models first, and the first WARMUP requests
# of each kind's first load run are left out as well. Printed per kind and load: the error |pred-measured| /
# measured at p50 and p90, and its TPOT counterpart. Goals: TTFT within 15% (p50), 35% (p90).
# Bounded: per kind CAP_DURATION + LOADS x DURATION seconds of arrivals, each followed by at
# most DRAIN; everything started here is stopped on exit.
#
#   test/costbench/run.sh                                  # about 8 minutes with the defaults
#   KINDS=slots LOADS="0.5" DURATION=10 CAP_DURATION=5 WARMUP=10 test/costbench/run.sh   # a smoke run
#
# Reports (bench JSON, gateway access logs, the error table) go to $OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."

KINDS=${KINDS:-slots kv llama}     # engine kinds to run; llama is skipped without llama-server
LOADS=${LOADS:-0.3 0.7 1.0}        # offered load, in multiples of the capacity R
DURATION=${DURATION:-60}           # seconds of arrivals per load
CAP_DURATION=${CAP_DURATION:-20}   # seconds of arrivals of the capacity run
DRAIN=${DRAIN:-20s}                # bench --drain after each run
WARMUP=${WARMUP:-50}               # requests at the start of each kind's first load run left out
IN=${IN:-512}                      # mean prompt tokens (sim: words)
OUT=${OUT:-64}                     # mean max_tokens
SPREAD=${SPREAD:-0.8}              # lengths uniform in IN, OUT x (1 ± SPREAD)
SLOTS=${SLOTS:-4}                  # slots per worker (sim --slots, llama-server -np)
KV_SEQS=${KV_SEQS:-64}             # kv sims: --max-num-seqs
TIME_SCALE=${TIME_SCALE:-1}        # usher sim --time-scale
LLAMA_MODEL=${LLAMA_MODEL:-small}  # micro or small (test/realengine/build.sh)
LLAMA_THREADS=${LLAMA_THREADS:-1}  # llama-server -t
LLAMA_IN=${LLAMA_IN:-256}          # llama-server: mean prompt tokens (CPU prefill is slow)
LLAMA_OUT=${LLAMA_OUT:-32}         # llama-server: mean max_tokens
SEED=${SEED:-1}
OUT_DIR=${OUT_DIR:-artifacts/costbench}
MODEL=demo-7b
KEY=sk-costbench-std

for tool in jq curl awk python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "costbench needs $tool" >&2; exit 1; }
done
if [ -z "${USHER:-}" ]; then go build -o bin/usher ./cmd/usher; fi
USHER=${USHER:-bin/usher}
mkdir -p "$OUT_DIR"
: >"$OUT_DIR/errors.txt"

engine_pids=()
gw_pid=
cleanup() {
  for p in "${engine_pids[@]}" $gw_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
stop_engines() {
  for p in "${engine_pids[@]}" $gw_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  engine_pids=() gw_pid=
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { # URL: up to 30 s
  for _ in $(seq 300); do curl -fs "$1" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "costbench: $1 did not come up" >&2; exit 1
}

# start_kind KIND: two engines of KIND and a gateway with the default config in front of them.
start_kind() {
  local kind=$1 engines=() port dir
  for i in 1 2; do
    port=$(free_port)
    case $kind in
      slots | kv)
        local flags=(--mode "$kind" --time-scale "$TIME_SCALE" --seed "$i")
        if [ "$kind" = slots ]; then flags+=(--slots "$SLOTS"); else flags+=(--max-num-seqs "$KV_SEQS"); fi
        timeout 3600 "$USHER" sim --listen "127.0.0.1:$port" "${flags[@]}" >"$OUT_DIR/$kind-engine-$i.log" 2>&1 &
        ;;
      llama)
        dir=$(test/realengine/build.sh --dir)
        timeout 3600 "$dir/bin/llama-server" -m "$dir/models/$LLAMA_MODEL.gguf" -a "$MODEL" --host 127.0.0.1 --port "$port" \
          --metrics -np "$SLOTS" -c $((SLOTS * 4096)) -t "$LLAMA_THREADS" >"$OUT_DIR/$kind-engine-$i.log" 2>&1 &
        ;;
    esac
    engine_pids+=($!)
    engines+=("127.0.0.1:$port")
  done
  for e in "${engines[@]}"; do wait_up "http://$e/health"; done
  local gw sha
  gw=127.0.0.1:$(free_port)
  sha=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)
  rm -f "$OUT_DIR/$kind.db"*
  cat >"$OUT_DIR/$kind-gateway.yaml" <<YAML
server: {listen: "$gw"}
routing:
  health: {interval: 1s}
  workers:
    - {id: $kind-1, url: "http://${engines[0]}", models: [$MODEL]}
    - {id: $kind-2, url: "http://${engines[1]}", models: [$MODEL]}
tenants:
  - id: std
    keys: [{name: std, sha256: $sha}]
log: {level: info, format: json}
database: {url: "sqlite:$OUT_DIR/$kind.db"} # its own ledger, not usher.db in the checkout
YAML
  "$USHER" serve --config "$OUT_DIR/$kind-gateway.yaml" >"$OUT_DIR/$kind-gateway.log" 2>&1 &
  gw_pid=$!
  wait_up "http://$gw/readyz"
  GW=$gw
}

# bench NAME RATE MAXINFLIGHT IN OUT DURATION: one streamed standard tenant; prints nothing.
bench() {
  "$USHER" bench --url "http://$GW/v1" --model "$MODEL" --tenant "std=$KEY::standard:$2" \
    --random-input-len "$4" --random-output-len "$5" --random-spread "$SPREAD" --seed "$SEED" \
    --max-inflight "$3" --duration "${6}s" --drain "$DRAIN" --quiet --out "$OUT_DIR/$1.json" >"$OUT_DIR/$1.txt" 2>&1 || true
}

# errors LOG FROM TO: p50 and p90 of |pred-measured|/measured of TTFT and TPOT over the access
# log's lines FROM to TO, and how many requests had both.
errors() {
  awk -v f="$2" -v t="$3" 'NR >= f && NR <= t' "$1" | jq -rR 'fromjson? | select(.msg == "request")
    | [(if .ttft_pred_ms != null and .engine_ttft_ms != null then ((.ttft_pred_ms - .engine_ttft_ms) | fabs) / .engine_ttft_ms else "-" end),
       (if .tpot_pred_ms != null and .engine_tpot_ms != null then ((.tpot_pred_ms - .engine_tpot_ms) | fabs) / .engine_tpot_ms else "-" end)]
    | @tsv' |
    awk -F'\t' '$1 != "-" { t[nt++] = $1 } $2 != "-" { p[np++] = $2 }
      function q(a, n, f,   i, j, x) { if (n == 0) return "-"; for (i = 1; i < n; i++) { x = a[i]; for (j = i - 1; j >= 0 && a[j] > x; j--) a[j+1] = a[j]; a[j+1] = x }
        return sprintf("%.1f%%", 100 * a[int(f * (n - 1))]) }
      END { printf "%6d %9s %9s %9s %9s\n", nt, q(t, nt, 0.5), q(t, nt, 0.9), q(p, np, 0.5), q(p, np, 0.9) }'
}
# lines LOG: how many lines LOG has now.
lines() { wc -l <"$1"; }

printf "costbench: kinds %s, loads %s x R, %ss each, prompts %s ± %s%%, %s slots; %s cores, load average %s\n" \
  "$KINDS" "$LOADS" "$DURATION" "$IN" "$(awk -v s="$SPREAD" 'BEGIN { print 100 * s }')" "$SLOTS" "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT_DIR/errors.txt"
printf "%-6s %5s %8s %6s %9s %9s %9s %9s\n" kind load "req/s" n "TTFT p50" "TTFT p90" "TPOT p50" "TPOT p90" | tee -a "$OUT_DIR/errors.txt"
for kind in $KINDS; do
  in=$IN out=$OUT
  if [ "$kind" = llama ]; then
    if [ ! -x "$(test/realengine/build.sh --dir)/bin/llama-server" ]; then
      echo "llama: skipped (no llama-server; test/realengine/build.sh builds one)" | tee -a "$OUT_DIR/errors.txt"
      continue
    fi
    in=$LLAMA_IN out=$LLAMA_OUT
  fi
  start_kind "$kind"
  bench "$kind-capacity" 1000 $((4 * SLOTS)) "$in" "$out" "$CAP_DURATION"
  capacity=$(jq -r '.overall.requests_per_second' "$OUT_DIR/$kind-capacity.json" 2>/dev/null || echo 0)
  if ! awk -v c="$capacity" 'BEGIN { exit !(c > 0) }'; then
    echo "$kind: the capacity run served nothing (see $OUT_DIR/$kind-capacity.txt)" | tee -a "$OUT_DIR/errors.txt"
    stop_engines
    continue
  fi
  log=$OUT_DIR/$kind-gateway.log
  skip=$WARMUP
  for load in $LOADS; do
    rate=$(awk -v c="$capacity" -v l="$load" 'BEGIN { printf "%.3f", c * l }')
    from=$(($(lines "$log") + 1))
    bench "$kind-$load" "$rate" 1024 "$in" "$out" "$DURATION"
    to=$(lines "$log")
    if [ "$skip" -gt 0 ]; then
      # The first requests of the first run: past the WARMUP-th request line.
      from=$(awk -v f="$from" -v k="$skip" 'NR >= f && /"msg":"request"/ && ++n == k { print NR + 1; exit }' "$log")
      from=${from:-$((to + 1))}
      skip=0
    fi
    printf "%-6s %5s %8s %s\n" "$kind" "$load" "$rate" "$(errors "$log" "$from" "$to")" | tee -a "$OUT_DIR/errors.txt"
  done
  stop_engines
done
echo "(error = |ttft_pred_ms - engine_ttft_ms| / engine_ttft_ms over the gateway's access log, TPOT likewise;" \
  "goals: TTFT p50 <= 15%, p90 <= 35%; reports in $OUT_DIR)" | tee -a "$OUT_DIR/errors.txt"
