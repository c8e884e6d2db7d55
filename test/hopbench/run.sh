#!/usr/bin/env bash
# The cost of the gateway hop: the same simulated worker reached directly, through nginx (round
# robin over two workers) and through usher (round_robin over the same two), side by side, on
# loopback, with wrk as a closed-loop load. Bounded: ROUNDS x 3 runs of DURATION each.
#
#   test/hopbench/run.sh                 # defaults: 2 rounds, 10s runs, 64 connections
#   MODE=stream DURATION=20s test/hopbench/run.sh
#   OPEN_RATE=0 test/hopbench/run.sh     # skip the open-loop added-latency phase
#
# Then, unless OPEN_RATE is 0, the added latency at a steady open loop: usher bench at OPEN_RATE
# req/s (Poisson arrivals) for OPEN_DURATION, once straight at a worker and once through usher;
# it prints both sides' latency percentiles and usher's own histogram of the time a request spent
# in usher itself (usher_gateway_overhead_seconds, bucket bounds).
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-2}
MODE=${MODE:-chat}          # chat (non-streaming) or stream (SSE)
TOKENS=${TOKENS:-16}        # output tokens per request
BASE_PORT=${BASE_PORT:-18000}
OPEN_RATE=${OPEN_RATE:-1000}   # req/s of the open-loop phase; 0 skips it
OPEN_DURATION=${OPEN_DURATION:-20s}

for tool in nginx wrk; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get install -y -qq nginx wrk >/dev/null; else
      echo "hopbench needs: sudo apt-get install -y nginx wrk" >&2; exit 1; fi
  fi
done

go build -o bin/usher ./cmd/usher
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

sim1=$((BASE_PORT + 1)); sim2=$((BASE_PORT + 2)); nginx_port=$((BASE_PORT + 80)); usher_port=$((BASE_PORT + 90))
for port in $sim1 $sim2; do
  bin/usher sim --listen 127.0.0.1:$port --time-scale 0.000001 --max-num-seqs 1024 >"$tmp/sim-$port.log" 2>&1 &
  pids+=($!)
done

key=sk-hopbench-key
cat >"$tmp/usher.yaml" <<YAML
server:
  listen: 127.0.0.1:$usher_port
routing:
  policy: round_robin
  workers:                # limits fixed at 1024: the hop's cost is measured, not limit learning
    - {id: sim-1, url: "http://127.0.0.1:$sim1", models: [demo-7b], max_concurrency: 1024}
    - {id: sim-2, url: "http://127.0.0.1:$sim2", models: [demo-7b], max_concurrency: 1024}
tenants:
  - id: bench
    keys: [{name: bench, sha256: $(printf %s "$key" | sha256sum | cut -d' ' -f1)}]
log:
  level: warn
YAML
bin/usher serve --config "$tmp/usher.yaml" >"$tmp/usher.log" 2>&1 &
pids+=($!)

cat >"$tmp/nginx.conf" <<NGINX
worker_processes auto;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fcgi; uwsgi_temp_path $tmp/uwsgi; scgi_temp_path $tmp/scgi;
  upstream sims { server 127.0.0.1:$sim1; server 127.0.0.1:$sim2; keepalive 512; }
  server {
    listen 127.0.0.1:$nginx_port;
    location / {
      proxy_pass http://sims;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
nginx -c "$tmp/nginx.conf" &
pids+=($!)

stream=false; [ "$MODE" = stream ] && stream=true
cat >"$tmp/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"demo-7b","stream":$stream,"max_tokens":$TOKENS,"messages":[{"role":"user","content":"measure the hop of the gateway please"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
LUA

for port in $sim1 $sim2 $nginx_port $usher_port; do
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 || curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
done
sleep 1

declare -A rps p50 p99
run() { # name url
  local out; out=$(wrk -t2 -c"$CONNS" -d"$DURATION" --latency -s "$tmp/post.lua" "$2")
  if grep -q "Non-2xx" <<<"$out"; then echo "$1: non-2xx answers:"; echo "$out"; exit 1; fi
  rps[$1]+="$(awk '/Requests\/sec/ {print $2}' <<<"$out") "
  p50[$1]+="$(awk '$1=="50%" {print $2}' <<<"$out") "
  p99[$1]+="$(awk '$1=="99%" {print $2}' <<<"$out") "
}
for r in $(seq "$ROUNDS"); do
  run direct "http://127.0.0.1:$sim1/v1/chat/completions"
  run nginx "http://127.0.0.1:$nginx_port/v1/chat/completions"
  run usher "http://127.0.0.1:$usher_port/v1/chat/completions"
done

echo
echo "gateway hop, mode=$MODE tokens=$TOKENS conns=$CONNS duration=$DURATION rounds=$ROUNDS (per round: req/s, p50, p99)"
printf "%-8s %-30s %-24s %-24s\n" path "req/s" "p50" "p99"
for name in direct nginx usher; do
  printf "%-8s %-30s %-24s %-24s\n" "$name" "${rps[$name]}" "${p50[$name]}" "${p99[$name]}"
done
mean() { awk '{s=0; for(i=1;i<=NF;i++) s+=$i; print s/NF}' <<<"$1"; }
echo "usher/nginx throughput ratio: $(awk -v u="$(mean "${rps[usher]}")" -v n="$(mean "${rps[nginx]}")" 'BEGIN{printf "%.2f", u/n}')"

if [ "$OPEN_RATE" != 0 ]; then
  open_bench() { # name url: one open-loop run; prints its E2E p50 and p99 (µs)
    bin/usher bench --url "$2/v1" --model demo-7b --random-input-len 8 --random-output-len "$TOKENS" --ignore-eos \
      --rate "$OPEN_RATE" --duration "$OPEN_DURATION" --max-inflight 4096 --quiet --out "$tmp/open-$1.json" \
      --tenant "bench=$key:::::whole" >"$tmp/open-$1.txt" 2>&1 || { cat "$tmp/open-$1.txt"; exit 1; }
    jq -r '"\(.overall.ok) ok, \(.overall.failed + .overall.dropped) failed or dropped; E2E p50 \(.overall.e2e_ms.p50 * 1000 | round) µs, p99 \(.overall.e2e_ms.p99 * 1000 | round) µs"' "$tmp/open-$1.json"
  }
  echo
  echo "added latency, open loop at $OPEN_RATE req/s for $OPEN_DURATION (mode chat, $TOKENS tokens):"
  echo "  direct: $(open_bench direct "http://127.0.0.1:$sim1")"
  before=$(curl -fs "http://127.0.0.1:$usher_port/metrics" | grep '^usher_gateway_overhead_seconds_bucket' || true)
  echo "  usher:  $(open_bench usher "http://127.0.0.1:$usher_port")"
  # usher's own view: the overhead histogram's buckets, this run only (after less before).
  curl -fs "http://127.0.0.1:$usher_port/metrics" | grep '^usher_gateway_overhead_seconds_bucket' |
    awk -v before="$before" 'BEGIN { n = split(before, lines, "\n"); for (i = 1; i <= n; i++) { split(lines[i], f, " "); b[f[1]] = f[2] } }
      { le = $1; sub(/.*le="/, "", le); sub(/".*/, "", le); c[++k] = $2 - b[$1]; bound[k] = le }
      END { total = c[k]; for (i = 1; i <= k; i++) { if (!p50 && c[i] >= total * 0.5) p50 = bound[i]; if (!p99 && c[i] >= total * 0.99) p99 = bound[i] }
        printf "  usher_gateway_overhead_seconds over %d requests: p50 <= %s s, p99 <= %s s (bucket bounds)\n", total, p50, p99 }'
fi
