#!/usr/bin/env bash
# A rolling restart of two usher replicas behind nginx, under steady streamed load from
# `usher bench`, against the same load without a restart: failed requests (by status and code)
# and TTFT p99. The replicas share one Redis; three simulated workers serve them. Each replica is
# stopped with SIGTERM (settle, then grace), waited for, started again and waited for ready
# before the next one goes. nginx retries a refused connection on the other replica, as a
# Kubernetes Service stops routing to a pod that is not ready. Bounded: two runs of DURATION.
#
#   test/rollbench/run.sh                 # defaults: 30s runs at 20 req/s
#   RATE=40 DURATION=40s test/rollbench/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-30s}
RATE=${RATE:-20}
TOKENS=${TOKENS:-64}          # output tokens per request
SETTLE=${SETTLE:-2s}          # server.shutdown_settle of the replicas
BASE_PORT=${BASE_PORT:-18200}

for tool in nginx redis-server python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get install -y -qq nginx redis-server python3 >/dev/null; else
      echo "rollbench needs: sudo apt-get install -y nginx redis-server python3" >&2; exit 1; fi
  fi
done

go build -o bin/usher ./cmd/usher
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

redis_port=$((BASE_PORT + 10)); nginx_port=$((BASE_PORT + 80))
redis-server --port $redis_port --bind 127.0.0.1 --save "" --appendonly no --loglevel warning >"$tmp/redis.log" 2>&1 &
pids+=($!)
sims=()
for i in 1 2 3; do
  port=$((BASE_PORT + i)); sims+=($port)
  bin/usher sim --listen 127.0.0.1:$port --time-scale 0.5 >"$tmp/sim-$port.log" 2>&1 &
  pids+=($!)
done

key=sk-rollbench-key
replica_ports=($((BASE_PORT + 91)) $((BASE_PORT + 92)))
for port in "${replica_ports[@]}"; do
  cat >"$tmp/usher-$port.yaml" <<YAML
server:
  listen: 127.0.0.1:$port
  shutdown_settle: $SETTLE
  shutdown_grace: 30s
routing:
  workers:
    - {id: sim-1, url: "http://127.0.0.1:${sims[0]}", models: [demo-7b]}
    - {id: sim-2, url: "http://127.0.0.1:${sims[1]}", models: [demo-7b]}
    - {id: sim-3, url: "http://127.0.0.1:${sims[2]}", models: [demo-7b]}
redis: {url: "redis://127.0.0.1:$redis_port/0"}
database: {url: "sqlite:$tmp/usher-$port.db"}
tiers: [{name: bench, default_class: interactive}]
tenants:
  - id: bench
    tier: bench
    keys: [{name: bench, sha256: $(printf %s "$key" | sha256sum | cut -d' ' -f1)}]
log: {level: warn}
YAML
done

declare -A replica_pid
start_replica() { # port
  bin/usher serve --config "$tmp/usher-$1.yaml" >>"$tmp/usher-$1.log" 2>&1 &
  replica_pid[$1]=$!
  pids+=($!)
  wait_ready "$1"
}
wait_ready() { # port
  for _ in $(seq 200); do curl -fs "http://127.0.0.1:$1/readyz" >/dev/null 2>&1 && return; sleep 0.05; done
  echo "replica on $1 not ready" >&2; exit 1
}
for port in "${replica_ports[@]}"; do start_replica "$port"; done

cat >"$tmp/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fcgi; uwsgi_temp_path $tmp/uwsgi; scgi_temp_path $tmp/scgi;
  upstream replicas {
    server 127.0.0.1:${replica_ports[0]} max_fails=1 fail_timeout=1s;
    server 127.0.0.1:${replica_ports[1]} max_fails=1 fail_timeout=1s;
    keepalive 64;
  }
  server {
    listen 127.0.0.1:$nginx_port;
    location / {
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_next_upstream error timeout;
    }
  }
}
NGINX
nginx -c "$tmp/nginx.conf" &
pids+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$nginx_port/healthz" >/dev/null 2>&1 && break; sleep 0.05; done

bench() { # name
  bin/usher bench --url "http://127.0.0.1:$nginx_port/v1" --model demo-7b --api-key "$key" --quiet \
    --workload random --random-input-len 256 --random-output-len "$TOKENS" --rate "$RATE" \
    --duration "$DURATION" --seed 7 --out "$tmp/$1.json" >/dev/null
}

roll() {
  sleep 5
  for port in "${replica_ports[@]}"; do
    local t0; t0=$(date +%s.%N)
    kill -TERM "${replica_pid[$port]}"
    local code=0; wait "${replica_pid[$port]}" || code=$?
    echo "replica :$port stopped (exit $code) after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1fs", b-a}')"
    start_replica "$port"
    sleep 3
  done
}

bench steady
bench rolling &
bencher=$!
roll
wait $bencher

python3 - "$tmp/steady.json" "$tmp/rolling.json" <<'PY'
import json, sys
print(f"{'run':<8} {'sent':>6} {'ok':>6} {'failed':>6} {'ttft p50':>9} {'ttft p99':>9}  failures")
for path, name in zip(sys.argv[1:], ["steady", "rolling"]):
    o = json.load(open(path))["overall"]
    fails = ", ".join(f"{f['status']} {f.get('code', '')}: {f['count']}".strip() for f in o.get("failures", []) or [])
    print(f"{name:<8} {o['sent']:>6} {o['ok']:>6} {o['failed']:>6} {o['ttft_ms']['p50']:>9.1f} {o['ttft_ms']['p99']:>9.1f}  {fails or '-'}")
PY
