#!/usr/bin/env bash
# The learned concurrency limit against fixed ones on vLLM-like engines: two kv-mode simulated
# workers (usher sim --mode kv: 256 sequences, 100K KV tokens each), one heavy standard load
# (RATE req/s, 256-token prompts, 128 output tokens, both +-50%), the gateway with its default
# config, then with max_concurrency fixed at each of FIXED, one after the other on the same sims.
# Prints output tokens/s and TTFT per run, and the learned limits' moves. Bounded: (1 + FIXED)
# runs of DURATION of arrivals plus DRAIN.
#
#   test/limitbench/run.sh
#   FIXED="64" DURATION=20s test/limitbench/run.sh
#   USHER_BIN=/tmp/usher-old test/limitbench/run.sh   # the gateway of another build
set -euo pipefail
cd "$(dirname "$0")/../.."

RATE=${RATE:-120}
DURATION=${DURATION:-40s}
DRAIN=${DRAIN:-15s}
FIXED=${FIXED:-64 128}
BASE_PORT=${BASE_PORT:-19100}
MODEL=demo-7b
KEY=sk-limitbench-std

command -v jq >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && apt-get install -y -qq jq >/dev/null; } || { echo "limitbench needs jq" >&2; exit 1; }
go build -o bin/usher ./cmd/usher
gateway_bin=${USHER_BIN:-bin/usher}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
for i in 1 2; do
  bin/usher sim --listen "127.0.0.1:$((BASE_PORT + i))" --mode kv --seed "$i" >"$tmp/sim-$i.log" 2>&1 &
  pids+=($!)
done
sha=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)
gw=127.0.0.1:$((BASE_PORT + 10))
echo "limitbench: two kv-mode sims, standard load at $RATE req/s for $DURATION; gateway $gateway_bin"
run() { # NAME WORKER_EXTRA
  local name=$1 extra=$2 pid
  cat >"$tmp/$name.yaml" <<YAML
server: {listen: "$gw"}
routing:
  health: {interval: 1s}
  workers:
    - {id: sim-1, url: "http://127.0.0.1:$((BASE_PORT + 1))", models: [$MODEL]$extra}
    - {id: sim-2, url: "http://127.0.0.1:$((BASE_PORT + 2))", models: [$MODEL]$extra}
tenants:
  - id: std
    keys: [{name: std, sha256: $sha}]
log: {level: info, format: json}
database: {url: "sqlite:$tmp/$name.db"} # its own ledger, not usher.db in the checkout
YAML
  "$gateway_bin" serve --config "$tmp/$name.yaml" >"$tmp/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -fs "http://$gw/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  sleep 2
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  bin/usher bench --url "http://$gw/v1" --model $MODEL --tenant "std=$KEY::standard:$RATE" \
    --random-input-len 256 --random-output-len 128 --random-spread 0.5 --seed 1 \
    --max-inflight 250 --duration "$DURATION" --drain "$DRAIN" --window 5s --quiet --out "$tmp/$name.json" >"$tmp/$name.txt" 2>&1 || true
  jq -r --arg n "$name" --arg l "$load" '.overall | "  \($n|.+"          "|.[0:10]) ok \(.ok) failed \(.failed + .dropped)  output tok/s \(.output_tokens_per_second|round)  TTFT p50 \(.ttft_ms.p50|round) ms p99 \(.ttft_ms.p99|round) ms  (load average \($l))"' "$tmp/$name.json"
  local moves; moves=$(grep '"worker concurrency limit"' "$tmp/$name.log" | jq -r '"\(.worker) \(.from)->\(.to)"' | tr '\n' ' ' | cut -c1-300 || true)
  [ -n "$moves" ] && echo "             limits: $moves"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
run default ""
for n in $FIXED; do run "fixed$n" ", max_concurrency: $n"; done
