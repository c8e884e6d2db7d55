#!/usr/bin/env bash
# Issue 10's slow-body attack, bounded, on loopback: SLOW connections of a tenant (its key, so
# the body is read) trickle a request body at one byte a second from SOURCES loopback addresses
# (so the per-client bound alone does not decide it), reconnecting whenever usher closes them,
# while REAL closed-loop clients send real requests through usher to a simulated worker; prints
# the real requests' latency percentiles (the goal: p99 < 1 s) and usher's connection metrics.
#
#   test/slowbench/run.sh                       # 20,000 slow connections, 8 real clients, 30 s
#   SLOW=5000 DURATION=10s test/slowbench/run.sh
#
# Each process may open at most `ulimit -Hn` files: the script raises the soft limit to it, and
# splits the flood over PROCS processes. usher's own connection bound follows its limit
# (server.max_connections: half of it less 256).
set -euo pipefail
cd "$(dirname "$0")/../.."

SLOW=${SLOW:-20000}
PROCS=${PROCS:-4}
SOURCES=${SOURCES:-100}       # 127.0.0.2 ... 127.0.0.(SOURCES+1)
REAL=${REAL:-8}
RAMP=${RAMP:-20s}
DURATION=${DURATION:-30s}
BASE_PORT=${BASE_PORT:-18500}

ulimit -n "$(ulimit -Hn)"
echo "file descriptor limit: $(ulimit -n)"

go build -o bin/usher ./cmd/usher
go build -o bin/slowbench ./test/slowbench
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

sim=$((BASE_PORT + 1)); usher_port=$((BASE_PORT + 90))
bin/usher sim --listen 127.0.0.1:$sim --time-scale 0.001 --max-num-seqs 256 >"$tmp/sim.log" 2>&1 &
pids+=($!)
key=sk-slowbench-key
cat >"$tmp/usher.yaml" <<YAML
server:
  listen: 127.0.0.1:$usher_port
routing:
  workers:
    - {id: sim-1, url: "http://127.0.0.1:$sim", models: [demo-7b], max_concurrency: 64}
tenants:
  - id: bench
    keys: [{name: bench, sha256: $(printf %s "$key" | sha256sum | cut -d' ' -f1)}]
log:
  level: info
database: {url: "sqlite:$tmp/usher.db"} # its own ledger, not usher.db in the checkout
YAML
bin/usher serve --config "$tmp/usher.yaml" >"$tmp/usher.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do curl -fs "http://127.0.0.1:$usher_port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
grep 'connection bounds' "$tmp/usher.log" || true

per=$((SLOW / PROCS)); spread=$((SOURCES / PROCS))
for i in $(seq 0 $((PROCS - 1))); do
  first=$((2 + i * spread)); last=$((first + spread - 1))
  bin/slowbench -target 127.0.0.1:$usher_port -slow "$per" -sources "127.0.0.$first-$last" -ramp "$RAMP" -key "$key" \
    2>"$tmp/flood-$i.log" &
  pids+=($!)
done
sleep "${RAMP%s}"
sleep 5
echo "flood after the ramp ($SLOW connections over $SOURCES addresses, $PROCS processes):"
for i in $(seq 0 $((PROCS - 1))); do tail -n1 "$tmp/flood-$i.log"; done

status=0
bin/slowbench -target 127.0.0.1:$usher_port -real "$REAL" -duration "$DURATION" -key "$key" || status=$?

echo "flood at the end:"
for i in $(seq 0 $((PROCS - 1))); do tail -n1 "$tmp/flood-$i.log"; done
echo "usher:"
curl -fs "http://127.0.0.1:$usher_port/metrics" | grep -E '^usher_connections_' || true
grep -c 'too many open files' "$tmp/usher.log" | sed 's/^/"too many open files" log lines: /' || true
exit $status
