#!/usr/bin/env bash
# The cost of the gateway hop, side by side in one run on loopback: the same simulated worker
# reached directly, through nginx, through Go's own httputil.ReverseProxy with a tuned Transport
# (test/hopbench/reverseproxy, the limit of the stack usher is built on), through the least a Go
# net/http proxy can do (test/hopbench/bareproxy: upstream I/O on the handler's own goroutine, no
# Transport, no work: the floor of the stack) and through usher, all four proxies round robin over
# the same two workers. Closed loop (wrk), per path and mode
# (chat: a whole answer; stream: SSE): req/s, latency p50/p99 and CPU seconds per 10,000
# requests (utime + stime from /proc/PID/stat of the proxy's processes). Then the added latency
# at a steady open loop (usher bench, Poisson arrivals) at each OPEN_RATES, client side against
# direct, for the four proxies: nginx's is what the machine itself adds to a hop (two more
# loopback connections and wake-ups), the floor under any proxy's. Bounded: ROUNDS x MODES x 5 runs of DURATION, then 5 x OPEN_RATES runs of
# OPEN_DURATION.
#
#   test/hopbench/run.sh                     # defaults: 3 rounds of 5s, wrk -t1 -c32, chat and stream
#   MODES=chat ROUNDS=1 test/hopbench/run.sh
#   OPEN_RATES=0 test/hopbench/run.sh        # skip the open-loop phase
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-5s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-chat stream}
TOKENS=${TOKENS:-16}        # output tokens per request
BASE_PORT=${BASE_PORT:-18000}
OPEN_RATES=${OPEN_RATES:-500 1000}   # req/s of the open-loop phase; 0 skips it
OPEN_DURATION=${OPEN_DURATION:-10s}

for tool in nginx wrk jq; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get install -y -qq nginx wrk jq >/dev/null; else
      echo "hopbench needs: sudo apt-get install -y nginx wrk jq" >&2; exit 1; fi
  fi
done

go build -o bin/usher ./cmd/usher
go build -o bin/hop-reverseproxy ./test/hopbench/reverseproxy
go build -o bin/hop-bareproxy ./test/hopbench/bareproxy
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

sim1=$((BASE_PORT + 1)); sim2=$((BASE_PORT + 2)); rp_port=$((BASE_PORT + 85)); bare_port=$((BASE_PORT + 86)); nginx_port=$((BASE_PORT + 80)); usher_port=$((BASE_PORT + 90))
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
database: {url: "sqlite:$tmp/usher.db"} # its own ledger, not usher.db in the checkout
YAML
bin/usher serve --config "$tmp/usher.yaml" >"$tmp/usher.log" 2>&1 &
usher_pid=$!
pids+=($usher_pid)
bin/hop-reverseproxy -listen 127.0.0.1:$rp_port "http://127.0.0.1:$sim1" "http://127.0.0.1:$sim2" >"$tmp/rp.log" 2>&1 &
rp_pid=$!
pids+=($rp_pid)
bin/hop-bareproxy -listen 127.0.0.1:$bare_port "http://127.0.0.1:$sim1" "http://127.0.0.1:$sim2" >"$tmp/bare.log" 2>&1 &
bare_pid=$!
pids+=($bare_pid)

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
nginx_pid=$!
pids+=($nginx_pid)

for port in $sim1 $sim2 $nginx_port $rp_port $bare_port $usher_port; do
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 || curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
done
sleep 1

# cpu_ticks PID...: utime + stime of the processes and their threads, in clock ticks.
cpu_ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
procs_of() { # name: the PIDs whose CPU a path costs (nginx: its master and workers)
  case $1 in
    direct) echo ;;
    nginx) echo "$nginx_pid $(pgrep -P "$nginx_pid" | tr '\n' ' ')" ;;
    reverseproxy) echo "$rp_pid" ;;
    bare) echo "$bare_pid" ;;
    usher) echo "$usher_pid" ;;
  esac
}
url_of() { case $1 in direct) echo "http://127.0.0.1:$sim1";; nginx) echo "http://127.0.0.1:$nginx_port";;
  reverseproxy) echo "http://127.0.0.1:$rp_port";; bare) echo "http://127.0.0.1:$bare_port";; usher) echo "http://127.0.0.1:$usher_port";; esac; }
hz=$(getconf CLK_TCK)
paths="direct nginx reverseproxy bare usher"

declare -A rps p50 p99 cpu
run() { # mode name
  local procs before after out n
  procs=$(procs_of "$2"); before=$(cpu_ticks $procs)
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$tmp/post-$1.lua" "$(url_of "$2")/v1/chat/completions")
  after=$(cpu_ticks $procs)
  if grep -q "Non-2xx" <<<"$out"; then echo "$2 ($1): non-2xx answers:"; echo "$out"; exit 1; fi
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  rps[$1,$2]+="$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$out") "
  p50[$1,$2]+="$(awk '$1=="50%" {print $2}' <<<"$out") "
  p99[$1,$2]+="$(awk '$1=="99%" {print $2}' <<<"$out") "
  if [ "$2" != direct ]; then cpu[$1,$2]+="$(awk -v t=$((after - before)) -v hz="$hz" -v n="$n" 'BEGIN{printf "%.2f", t / hz / n * 10000}') "; fi
}
for mode in $MODES; do
  stream=false; [ "$mode" = stream ] && stream=true
  cat >"$tmp/post-$mode.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"demo-7b","stream":$stream,"max_tokens":$TOKENS,"messages":[{"role":"user","content":"measure the hop of the gateway please"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
LUA
done
for r in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    for name in $paths; do run "$mode" "$name"; done
  done
done

mean() { awk '{s=0; for(i=1;i<=NF;i++) s+=$i; print s/NF}' <<<"$1"; }
ratio() { awk -v a="$(mean "$1")" -v b="$(mean "$2")" 'BEGIN{printf "%.2f", a/b}'; }
echo
echo "gateway hop: tokens=$TOKENS wrk -t$THREADS -c$CONNS, $DURATION a run, $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in $MODES; do
  echo
  echo "mode $mode (each round: req/s | p50 | p99 | CPU s per 10,000 requests)"
  for name in $paths; do
    printf "  %-13s %-26s | %-26s | %-26s | %s\n" "$name" "${rps[$mode,$name]}" "${p50[$mode,$name]}" "${p99[$mode,$name]}" "${cpu[$mode,$name]:-}"
  done
  echo "  usher/reverseproxy req/s $(ratio "${rps[$mode,usher]}" "${rps[$mode,reverseproxy]}"), usher/nginx $(ratio "${rps[$mode,usher]}" "${rps[$mode,nginx]}"); CPU per request usher/reverseproxy $(ratio "${cpu[$mode,usher]}" "${cpu[$mode,reverseproxy]}")"
done

if [ "$OPEN_RATES" != 0 ]; then
  open_bench() { # name rate: one open-loop run; prints its E2E p50 and p99 (µs)
    bin/usher bench --url "$(url_of "$1")/v1" --model demo-7b --random-input-len 8 --random-output-len "$TOKENS" --ignore-eos \
      --rate "$2" --duration "$OPEN_DURATION" --max-inflight 4096 --quiet --out "$tmp/open-$1.json" \
      --tenant "bench=$key:::::whole" >"$tmp/open-$1.txt" 2>&1 || { cat "$tmp/open-$1.txt"; exit 1; }
    jq -r '"\(.overall.ok) \(.overall.failed + .overall.dropped) \(.overall.e2e_ms.p50 * 1000 | round) \(.overall.e2e_ms.p99 * 1000 | round)"' "$tmp/open-$1.json"
    jq -r '(.overall.failures // [])[] | "    failed: \(.)"' "$tmp/open-$1.json" >&2
  }
  for rate in $OPEN_RATES; do
    echo
    echo "open loop at $rate req/s for $OPEN_DURATION (chat, $TOKENS tokens): E2E latency, and added over direct"
    read -r ok bad d50 d99 <<<"$(open_bench direct "$rate")"
    printf "  %-13s %6s ok %4s failed  p50 %6s µs  p99 %7s µs\n" direct "$ok" "$bad" "$d50" "$d99"
    for name in nginx reverseproxy bare usher; do
      read -r ok bad q50 q99 <<<"$(open_bench "$name" "$rate")"
      printf "  %-13s %6s ok %4s failed  p50 %6s µs  p99 %7s µs  added p50 %5s µs  p99 %6s µs\n" "$name" "$ok" "$bad" "$q50" "$q99" $((q50 - d50)) $((q99 - d99))
    done
  done
fi
