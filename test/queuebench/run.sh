#!/usr/bin/env bash
# Issue 4's queueing scenarios end to end: usher bench against usher serve in front of two
# simulated workers (usher sim), all on loopback. Every run gets a fresh gateway; the workers
# stay up. Bounded: with the defaults about 6 minutes of runs; each bench has a duration and a
# drain bound, and every process started here is stopped on exit.
#
#   0. Capacity: one interactive tenant keeps the pool saturated (bench --max-inflight caps what is
#      outstanding); its tokens/s in the steady windows is the capacity C and C over the tokens of
#      one request the capacity R in requests/s. Interactive, since standard and batch may never
#      take the interactive reserve.
#   1. Protection: 3 interactive tenants at 0.1 R each, one batch tenant at 3 R; (a) no batch,
#      (b) with batch (priority queue), (c) with batch and queue.fifo: true.
#   2. Fairness: four standard tenants, f1 sending 10x the others, all above their fair share;
#      tokens served per tenant per window and Jain's index. With REPLICAS=N (N > 1), N gateway
#      replicas in front of the same two workers, sharing one redis-server started here, and the
#      bench sends its requests round robin over them (bench --replica-url), as an even
#      round-robin load balancer would: the fairness of the fleet, not of one replica. With
#      REDIS_CUT=S, redis-server is killed in the middle of the arrivals and a fresh one starts on
#      its port S seconds later. Printed too: each worker's peak of requests held at once, by
#      the sim's own count (usher_sim_requests_peak; the sims are started afresh for the run).
#   3. Deadlines: a burst of 2 R from four standard tenants with different X-Usher-Deadline-Ms,
#      after a short warm-up so the queue has measured the service time; refusal latencies from
#      the gateway's access log (the bench report keeps no latency of failed requests) and from
#      curl probes with a deadline too short to make.
#   4. Engine modes (issue 14's goals): the gateway's DEFAULT config (no max_concurrency, no
#      priority hand-down, default queue) in front of two sims in each of MODES: "slots" (fixed
#      slots, as llama-server: M_SLOTS per worker) and "kv" (continuous batching bounded by the KV
#      cache, as vLLM: KV_SEQS sequences, KV_TOKENS of KV cache and KV_BATCHED tokens per step
#      per worker); and for each, each of BATCHES: "decode" (batch requests shaped like the
#      interactive ones: IN prompt, OUT output tokens) and "prefill" (P_IN-token prompts,
#      P_OUT output tokens, a code-completion service). Per case: capacity runs (saturating, one
#      per request shape) give C_i and C_b in tokens/s and R_i, R_b in req/s; then (a)
#      interactive i1..i3 at 0.1 R_i each alone and (b) the same beside batch at 3 R_b, sent by a
#      second bench process with its own lengths. Printed: interactive TTFT p50/p99, p99 over
#      (a)'s, and batch's share of what interactive leaves: (batch t/s / C_b) / (1 - int t/s / C_i),
#      and the interactive TTFT attainment of (a) and (b) as the gateway judged it, and by the sims' own
#      count the mean sequences computing over the steady windows and those of requests cancelled while
#      running (busy, lost: slots idle against work thrown away by preemption). With REPLICAS=N (N > 1)
#      every run goes through N replicas sharing a redis-server, spread as REPLICA_SPREAD says; each
#      replica's routing counters are kept beside the run (NAME.metrics-K.txt).
#   5. Goodput on a real trace (issues 29 and 31): the Azure conversation trace at LOADS times the
#      fleet's capacity, the default config; requests that met the default objectives a second,
#      as the gateway judged them. Run it with FLEET=mixed and FLEET=pd to compare fleets.
#
# Lengths are spread (SPREAD) by default: with fixed lengths, requests dispatched together end
# together, and the pool frees its slots in waves, which a fixed-length run mistakes for queueing.
#
#   test/queuebench/run.sh                     # scenarios 1-3, defaults below
#   SCENARIOS="1" DURATION=30 test/queuebench/run.sh
#   SCENARIOS="2" REPLICAS=3 test/queuebench/run.sh   # fairness across three replicas
#   SCENARIOS="4" MODES=slots BATCHES=prefill test/queuebench/run.sh
#
# Reports (bench JSON and tables, gateway logs) go to $OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."

TIME_SCALE=${TIME_SCALE:-1}        # usher sim --time-scale
SEQS=${SEQS:-8}                    # per worker: sim --max-num-seqs = the gateway's max_concurrency
IN=${IN:-256}                      # prompt tokens (words) per request
OUT=${OUT:-64}                     # max_tokens per request (the sim always generates all)
SPREAD=${SPREAD:-0.5}              # lengths uniform in IN, OUT x (1 ± SPREAD); 0: fixed lengths
CAP_DURATION=${CAP_DURATION:-20}   # seconds of arrivals of the capacity run
DURATION=${DURATION:-60}           # seconds of arrivals of each protection run
FAIR_DURATION=${FAIR_DURATION:-60} # seconds of arrivals of the fairness run
DL_DURATION=${DL_DURATION:-20}     # seconds of the deadline burst
WINDOW=${WINDOW:-5}                # seconds: throughput windows of scenarios 0 and 1
FAIR_WINDOW=${FAIR_WINDOW:-10}     # seconds: fairness windows
QUEUE_CAP=${QUEUE_CAP:-64}         # queue.max_queued_per_tenant
RESERVE=${RESERVE:-}               # queue.interactive_reserve (empty: the default, 0.10; scenario 4
                                   # too, but for its no-reserve variant)
HANDOFF=${HANDOFF:-0}              # 1: sims schedule by priority, the gateway hands the class down
                                   #    (priority_handoff) and admits OVERCOMMIT x SEQS per worker,
                                   #    so an interactive request takes a batch request's slot
                                   #    in the worker at once instead of waiting for one to end
OVERCOMMIT=${OVERCOMMIT:-2}        # with HANDOFF=1: gateway max_concurrency = OVERCOMMIT x SEQS
DEADLINES=${DEADLINES:-"1000 2000 4000 8000"} # X-Usher-Deadline-Ms of tenants d1..d4
PROBE_DEADLINE=${PROBE_DEADLINE:-100}         # X-Usher-Deadline-Ms of the curl probes
DRAIN=${DRAIN:-20s}                # bench --drain
SEED=${SEED:-1}
SCENARIOS=${SCENARIOS:-"1 2 3"}
SIMS=${SIMS:-2}                    # workers (usher sim), each with the settings below
FLEET=${FLEET:-mixed}              # scenario 4, kv mode: mixed (every sim serves whole requests) or pd
                                   # (disaggregated: the first PREFILL_SIMS sims --role prefill, the rest decode)
PREFILL_SIMS=${PREFILL_SIMS:-$((SIMS / 2))} # FLEET=pd: how many of the sims prefill
REPLICAS=${REPLICAS:-1}            # scenarios 2 and 4: gateway replicas sharing one redis-server
REPLICA_SPREAD=${REPLICA_SPREAD:-even} # with REPLICAS > 1: even (round robin), skewed (half to the
                                   # first replica) or pinned (each tenant to one replica: f1 alone
                                   # with f4 on the first)
REDIS_CUT=${REDIS_CUT:-0}          # scenario 2 with REPLICAS > 1: seconds redis-server is down from the
                                   # middle of the arrivals (killed, then a fresh one on its port)
# Scenario 4 (engine modes); its runs are M_CAP_DURATION + 2 x M_DURATION seconds of arrivals a
# case, one more M_CAP_DURATION for a prefill batch: about 12 minutes for the 4 cases.
MODES=${MODES:-"slots kv"}         # sim --mode of the scenario-4 cases
BATCHES=${BATCHES:-"decode prefill"} # batch shapes of the scenario-4 cases
M_SLOTS=${M_SLOTS:-4}              # slots mode: sim --slots per worker
KV_SEQS=${KV_SEQS:-256}            # kv mode: sim --max-num-seqs per worker
KV_TOKENS=${KV_TOKENS:-4096}       # kv mode: sim --kv-cache-tokens per worker (binds before KV_SEQS)
KV_BATCHED=${KV_BATCHED:-2048}     # kv mode: sim --max-num-batched-tokens per worker
P_IN=${P_IN:-520}                  # prefill batch: prompt tokens
P_OUT=${P_OUT:-7}                  # prefill batch: max_tokens
BATCH_ANSWER=${BATCH_ANSWER:-whole} # scenario 4's batch tenant asks for whole answers (as batch jobs
                                   # do; the gateway may then preempt one until its answer is
                                   # sent) or, with "stream", streams them
M_DURATION=${M_DURATION:-30}       # seconds of arrivals of each scenario-4 protection run
M_CAP_DURATION=${M_CAP_DURATION:-15} # seconds of arrivals of each scenario-4 capacity run
M_INFLIGHT=${M_INFLIGHT:-128}      # bench --max-inflight of the scenario-4 capacity runs
M_CAP=${M_CAP:-}                   # scenario 4: "C_i R_i C_p R_p", the capacities the loads and the
                                   # batch share are of (tokens/s and req/s, interactive then prefill
                                   # batch, as the report's cap line prints them) instead of this
                                   # fleet's, measured: run a pd fleet at a mixed fleet's load
CONCURRENCY=${CONCURRENCY:-}       # more of routing.concurrency, as YAML members, e.g.
                                   # "prefill_piece_tokens: 0" (the default) for an A/B run
# Scenario 4's A/B of the protections: each case runs its (b) run once per variant, V_ROUNDS
# times over, the variants interleaved, against one capacity and one (a) run. A variant is the
# default config with one mechanism off:
#   default        nothing changed
#   no-reserve     queue.interactive_reserve: 0
#   no-preemption  server.disable_preemption: true
#   no-budget      routing.concurrency.lower_prefill_tokens: 1000000000 (no prefill budget)
#   no-pieces      routing.concurrency.prefill_piece_tokens: -1
#   NAME=PATH      the default config served by the usher binary at PATH (a build without a
#                  mechanism, or another commit)
VARIANTS=${VARIANTS:-default}
V_ROUNDS=${V_ROUNDS:-1}
# Scenario 5 (goodput on a real trace): the Azure LLM inference trace (conversation service,
# ../shared/traces, absent in a user's clone: the scenario then says so and is skipped) replayed
# through the default config in front of SIMS kv-mode sims (FLEET mixed or pd) at each of LOADS
# times the fleet's capacity in requests a second, token counts divided by G_TOKEN_SCALE.
G_TRACE=${G_TRACE:-../shared/traces/azure_conv_2023.csv}
G_TOKEN_SCALE=${G_TOKEN_SCALE:-4}
LOADS=${LOADS:-"0.5 1 2"}
G_DURATION=${G_DURATION:-40}       # seconds of arrivals of each scenario-5 run
G_CAP_R=${G_CAP_R:-}               # scenario 5: the capacity R in req/s the loads are of (empty:
                                   # measured on this fleet); give one fleet's R to compare fleets
                                   # at the same req/s
OUT_DIR=${OUT_DIR:-artifacts/queuebench}
MODEL=demo-7b

for tool in jq curl awk column; do
  command -v "$tool" >/dev/null 2>&1 || { echo "queuebench needs $tool" >&2; exit 1; }
done

# USHER_BIN runs another build of usher as the gateway (an A/B against an earlier commit); the
# sims and the bench are this tree's.
go build -o bin/usher ./cmd/usher
gateway_bin=${USHER_BIN:-bin/usher}
mkdir -p "$OUT_DIR"
echo "queuebench: TIME_SCALE=$TIME_SCALE SEQS=$SEQS IN=$IN OUT=$OUT SPREAD=$SPREAD CAP_DURATION=$CAP_DURATION DURATION=$DURATION" \
  "FAIR_DURATION=$FAIR_DURATION DL_DURATION=$DL_DURATION WINDOW=$WINDOW FAIR_WINDOW=$FAIR_WINDOW QUEUE_CAP=$QUEUE_CAP" \
  "RESERVE=${RESERVE:-default} HANDOFF=$HANDOFF OVERCOMMIT=$OVERCOMMIT DEADLINES=\"$DEADLINES\" PROBE_DEADLINE=$PROBE_DEADLINE DRAIN=$DRAIN SEED=$SEED" \
  "SCENARIOS=\"$SCENARIOS\" SIMS=$SIMS FLEET=$FLEET PREFILL_SIMS=$PREFILL_SIMS REPLICAS=$REPLICAS REPLICA_SPREAD=$REPLICA_SPREAD REDIS_CUT=$REDIS_CUT MODES=\"$MODES\" BATCHES=\"$BATCHES\" M_SLOTS=$M_SLOTS KV_SEQS=$KV_SEQS KV_TOKENS=$KV_TOKENS KV_BATCHED=$KV_BATCHED" \
  "P_IN=$P_IN P_OUT=$P_OUT M_DURATION=$M_DURATION M_CAP_DURATION=$M_CAP_DURATION M_INFLIGHT=$M_INFLIGHT M_CAP=\"$M_CAP\" CONCURRENCY=\"$CONCURRENCY\"" \
  "VARIANTS=\"$VARIANTS\" V_ROUNDS=$V_ROUNDS; $(nproc) cores"
tmp=$(mktemp -d)
pids=()
gw_pids=()
sim_pids=()
cleanup() {
  for p in "${pids[@]}" "${sim_pids[@]}" "${gw_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -s "$tmp/redis.pid" ]; then kill "$(cat "$tmp/redis.pid")" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# addr_from LOG PATTERN: waits up to 10 s for the listening address in a log line.
addr_from() {
  local a
  for _ in $(seq 100); do
    a=$(grep -m1 "$2" "$1" 2>/dev/null | grep -oE '127\.0\.0\.1:[0-9]+' | head -1 || true)
    if [ -n "$a" ]; then echo "$a"; return; fi
    sleep 0.1
  done
  echo "no address in $1:" >&2; cat "$1" >&2; exit 1
}

wants() { [[ " $SCENARIOS " == *" $1 "* ]]; }

# start_sims ARGS...: two fresh simulated workers with usher sim ARGS; sets sims (host:port each).
sims=()
start_sims() {
  stop_sims
  sims=()
  local i role
  for i in $(seq "$SIMS"); do
    role=()
    if [ "$FLEET" = pd ]; then role=(--role "$(sim_role "$i")"); fi
    # Removed first: the new process truncates the log only once it starts, and addr_from
    # would meanwhile read the address of the sim it replaces (stopped, so refusing).
    rm -f "$tmp/sim-$i.log"
    bin/usher sim --listen 127.0.0.1:0 --time-scale "$TIME_SCALE" --seed "$i" "$@" "${role[@]}" >"$tmp/sim-$i.log" 2>&1 &
    sim_pids+=($!)
    sims+=("$(addr_from "$tmp/sim-$i.log" 'usher sim serving')")
  done
}
# sim_role I: the role of sim I (1-based) in a FLEET=pd fleet: the first PREFILL_SIMS prefill, the
# rest decode.
sim_role() { if [ "$1" -le "$PREFILL_SIMS" ]; then echo prefill; else echo decode; fi; }
# worker_lines EXTRA: the config's worker list, one line per sim (EXTRA: more members of each).
worker_lines() {
  local i role
  for i in "${!sims[@]}"; do
    role=
    if [ "$FLEET" = pd ]; then role=", role: $(sim_role $((i + 1)))"; fi
    echo "    - {id: sim-$((i + 1)), url: \"http://${sims[$i]}\", models: [$MODEL]$role${1:-}}"
  done
}
stop_sims() {
  for p in "${sim_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  sim_pids=()
}

sim_policy=fcfs; worker_conc=$SEQS; handoff=false
if [ "$HANDOFF" = 1 ]; then sim_policy=priority; worker_conc=$((OVERCOMMIT * SEQS)); handoff=true; fi

key() { echo "sk-queuebench-$1"; }
tenant_yaml() {
  local t
  for t in cap i1 i2 i3 bulk f1 f2 f3 f4 d1 d2 d3 d4 warm probe; do
    echo "  - id: $t"
    echo "    keys: [{name: $t, sha256: $(printf %s "$(key "$t")" | sha256sum | cut -d' ' -f1)}]"
  done
}

# start_gateway NAME FIFO: a fresh gateway with an empty queue; sets GW (host:port).
start_gateway() {
  stop_gateway
  gateway_config "$@" >"$OUT_DIR/$1.yaml"
  launch_gateway "$1"
}
# start_fleet NAME FIFO: REPLICAS fresh gateways NAME-r1.. in front of the same workers, sharing a
# fresh redis-server, each with its own database; sets GW (the first) and GWS (all, host:port).
start_fleet() {
  stop_gateway
  gateway_config "$@" >"$OUT_DIR/$1.yaml"
  launch_fleet "$1"
}
# launch_fleet NAME [BIN]: REPLICAS gateways NAME-r1.. serving NAME.yaml (with BIN, default the
# gateway binary), sharing a fresh redis-server, each with its own database; sets GW (the first)
# and GWS (all, host:port).
launch_fleet() {
  start_redis
  local all=() r
  for r in $(seq "$REPLICAS"); do
    rm -f "$tmp/$1-r$r.db"*
    {
      cat "$OUT_DIR/$1.yaml"
      echo "redis: {url: \"$redis_url\"}"
      echo "database: {url: \"sqlite:$tmp/$1-r$r.db\"}"
    } >"$OUT_DIR/$1-r$r.yaml"
    launch_gateway "$1-r$r" "${2:-$gateway_bin}"
    all+=("$GW")
  done
  GWS=("${all[@]}")
  GW=${GWS[0]}
}
# start_redis: a fresh redis-server on a free loopback port, without persistence; sets redis_url.
redis_pid=
start_redis() {
  command -v redis-server >/dev/null || { echo "queuebench: REPLICAS needs redis-server" >&2; exit 1; }
  stop_redis
  local port
  for _ in 1 2 3; do
    port=$((30000 + RANDOM % 30000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no >"$tmp/redis.log" 2>&1 &
    redis_pid=$!
    pids+=("$redis_pid")
    for _ in $(seq 50); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then redis_url="redis://127.0.0.1:$port/0"; return 0; fi
      sleep 0.1
    done
    stop_redis
  done
  echo "queuebench: redis-server does not start:" >&2; cat "$tmp/redis.log" >&2; exit 1
}
stop_redis() {
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; redis_pid=; fi
  if [ -s "$tmp/redis.pid" ]; then kill "$(cat "$tmp/redis.pid")" 2>/dev/null || true; : >"$tmp/redis.pid"; fi
}
# cut_redis AT SECONDS: after AT seconds kills the fleet's redis-server, and SECONDS later starts
# a fresh one (empty) on its port, whose pid it leaves in $tmp/redis.pid. Run it in the
# background.
cut_redis() {
  local port=${redis_url##*:}
  port=${port%%/*}
  sleep "$1"
  echo "--- redis-server killed ($(date -u +%T))" >&2
  kill "$redis_pid" 2>/dev/null || true
  sleep "$2"
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no >"$tmp/redis-2.log" 2>&1 &
  echo $! >"$tmp/redis.pid"
  echo "--- redis-server started again on $port ($(date -u +%T))" >&2
}
# sim_peaks: each worker's usher_sim_requests_peak, "sim-1 N, sim-2 M".
sim_peaks() {
  local i out=()
  for i in "${!sims[@]}"; do
    out+=("sim-$((i + 1)) $(curl -fs "http://${sims[$i]}/metrics" | awk '$1 == "usher_sim_requests_peak" { print $2 }')")
  done
  (IFS=,; echo "${out[*]}" | sed 's/,/, /g')
}
# gateway_config NAME FIFO: the configuration of a gateway with an empty queue, on stdout.
gateway_config() {
  {
    echo "server: {listen: \"127.0.0.1:0\"}"
    echo "routing:"
    echo "  policy: least_request"
    echo "  health: {interval: 1s}"
    if [ -n "$CONCURRENCY" ]; then echo "  concurrency: {$CONCURRENCY}"; fi
    echo "  workers:"
    worker_lines ", max_concurrency: $worker_conc, priority_handoff: $handoff"
    echo "queue:"
    echo "  fifo: $2"
    echo "  max_queued_per_tenant: $QUEUE_CAP"
    if [ -n "$RESERVE" ]; then echo "  interactive_reserve: $RESERVE"; fi
    echo "tenants:"
    tenant_yaml
    echo "log: {level: info, format: json}"
  }
}
# start_default_gateway NAME: a fresh gateway with the default config: workers with no
# max_concurrency and no priority_handoff, no queue section. Only the health interval is set,
# so the workers are in service within a second of start.
start_default_gateway() {
  stop_gateway
  local v=${2:-default} v_server= v_queue= v_conc= bin=$gateway_bin
  case $v in
    default) ;;
    no-reserve) v_queue="interactive_reserve: 0" ;;
    no-preemption) v_server=", disable_preemption: true" ;;
    no-budget) v_conc="lower_prefill_tokens: 1000000000" ;;
    no-pieces) v_conc="prefill_piece_tokens: -1" ;;
    *=*) bin=${v#*=} ;;
    *) echo "queuebench: unknown variant $v" >&2; exit 1 ;;
  esac
  if [ -z "$v_queue" ] && [ -n "$RESERVE" ]; then v_queue="interactive_reserve: $RESERVE"; fi
  {
    echo "server: {listen: \"127.0.0.1:0\"$v_server}"
    if [ -n "$v_queue" ]; then echo "queue: {$v_queue}"; fi
    echo "routing:"
    echo "  health: {interval: 1s}"
    conc=()
    if [ -n "$CONCURRENCY" ]; then conc+=("$CONCURRENCY"); fi
    if [ -n "$v_conc" ]; then conc+=("$v_conc"); fi
    if [ ${#conc[@]} -gt 0 ]; then (IFS=,; echo "  concurrency: {${conc[*]}}"); fi
    echo "  workers:"
    worker_lines
    echo "tenants:"
    tenant_yaml
    echo "log: {level: info, format: json}"
  } >"$OUT_DIR/$1.yaml"
  if [ "$REPLICAS" -le 1 ]; then
    launch_gateway "$1" "$bin"
  else
    launch_fleet "$1" "$bin"
  fi
}
# launch_gateway NAME [BIN]: serves NAME.yaml (with BIN, default the gateway binary); sets GW
# (host:port) and GWS (GW alone) once it answers a completion.
launch_gateway() {
  rm -f "$OUT_DIR/$1.gateway.log" # as in start_sims: a log of an earlier run of that name
  # A ledger of its own in the scratch directory (a fleet's replicas have theirs already), not
  # usher.db in the checkout, which every run would share.
  if ! grep -q '^database:' "$OUT_DIR/$1.yaml"; then
    rm -f "$tmp/$1.db"*
    echo "database: {url: \"sqlite:$tmp/$1.db\"}" >>"$OUT_DIR/$1.yaml"
  fi
  "${2:-$gateway_bin}" serve --config "$OUT_DIR/$1.yaml" >"$OUT_DIR/$1.gateway.log" 2>&1 &
  gw_pids+=($!)
  GW=$(addr_from "$OUT_DIR/$1.gateway.log" 'usher is serving')
  for _ in $(seq 100); do curl -fs "http://$GW/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fs -o /dev/null "http://$GW/v1/chat/completions" -H "Authorization: Bearer $(key warm)" \
    -d "{\"model\":\"$MODEL\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"ready\"}]}" ||
    { echo "gateway $1 does not serve" >&2; cat "$OUT_DIR/$1.gateway.log" >&2; exit 1; }
  GWS=("$GW")
}
# stop_gateway: stops every gateway (replica) started, and the fleet's redis-server.
stop_gateway() {
  local p
  for p in "${gw_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  gw_pids=()
  stop_redis
}

# run_bench NAME ARGS...: one bench run against the current gateway (round robin over the
# replicas, when there are several); report in NAME.json.
run_bench() {
  local name=$1 g replicas=(); shift
  for g in "${GWS[@]:1}"; do replicas+=(--replica-url "http://$g/v1"); done
  echo "--- $name (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  bin/usher bench --url "http://$GW/v1" "${replicas[@]}" --replica-spread "$REPLICA_SPREAD" --model "$MODEL" --random-input-len "$IN" --random-output-len "$OUT" \
    --random-spread "$SPREAD" --seed "$SEED" --drain "$DRAIN" --quiet --out "$OUT_DIR/$name.json" "$@" >"$OUT_DIR/$name.txt" 2>&1 ||
    { echo "bench $name failed:" >&2; cat "$OUT_DIR/$name.txt" >&2; exit 1; }
}

# steady REPORT WINDOW DURATION TENANTS...: mean tokens/s (prompt + output) of the tenants over
# the windows that lie wholly inside the arrivals, the first one (warm-up) left out.
steady() {
  local rep=$1 win=$2 dur=$3; shift 3
  jq -r --argjson w "$win" --argjson n "$((dur / win))" --args '
    [$ARGS.positional[] as $t | .fairness.tokens[$t] // [] | .[1:$n]] | transpose
    | map(add) as $per | if ($per | length) == 0 then 0 else ($per | add) / ($per | length) / $w end
  ' "$@" <"$rep"
}
jget() { jq -r "$2" "$1"; }
f1() { awk -v x="$1" 'BEGIN { printf "%.1f", x }'; }
calc() { awk "BEGIN { printf \"%.${2:-3}f\", $1 }"; }

# --- 0: capacity (for scenarios 1-3) -----------------------------------------------------------
if wants 1 || wants 2 || wants 3; then
  start_sims --max-num-seqs "$SEQS" --scheduling-policy "$sim_policy"
  start_gateway capacity false
  run_bench capacity --tenant "cap=$(key cap)::interactive" --rate 200 --max-inflight $((SEQS * 6)) \
    --duration "${CAP_DURATION}s" --window "${WINDOW}s"
  C=$(steady "$OUT_DIR/capacity.json" "$WINDOW" "$CAP_DURATION" cap)
  PER_REQ=$(jget "$OUT_DIR/capacity.json" '(.overall.prompt_tokens + .overall.output_tokens) / .overall.ok')
  R=$(calc "$C / $PER_REQ" 2)
  echo
  echo "== capacity: 2 workers x max_concurrency $SEQS, sim time-scale $TIME_SCALE, $IN prompt + $OUT output tokens (± $SPREAD)"
  echo "   saturating run: C = $(f1 "$C") tokens/s (prompt + output) = R = $R req/s at $(f1 "$PER_REQ") tokens/request;"
  echo "   TTFT p50 $(f1 "$(jget "$OUT_DIR/capacity.json" .overall.ttft_ms.p50)") ms, E2E p50 $(f1 "$(jget "$OUT_DIR/capacity.json" .overall.e2e_ms.p50)") ms, queue p50 $(f1 "$(jget "$OUT_DIR/capacity.json" .overall.queue_ms.p50)") ms"
fi

# --- 1: protection -----------------------------------------------------------------------------
if wants 1; then
  IR=$(calc "$R * 0.1" 3)
  BR=$(calc "$R * 3" 3)
  inter=(--tenant "i1=$(key i1)::interactive:$IR" --tenant "i2=$(key i2)::interactive:$IR" --tenant "i3=$(key i3)::interactive:$IR")
  batch=(--tenant "bulk=$(key bulk)::batch:$BR")
  common=(--duration "${DURATION}s" --window "${WINDOW}s")
  start_gateway protect-a false
  run_bench protect-a "${inter[@]}" "${common[@]}"
  start_gateway protect-b false
  run_bench protect-b "${inter[@]}" "${batch[@]}" "${common[@]}"
  start_gateway protect-c true
  run_bench protect-c "${inter[@]}" "${batch[@]}" "${common[@]}"
  stop_gateway

  echo
  echo "== 1. protection: interactive i1..i3 at $IR req/s each (0.1 R each, 0.3 R in all), batch 'bulk' at $BR req/s (3 R);"
  echo "   ${DURATION}s of arrivals; throughput in tokens/s over the ${WINDOW}s windows inside the arrivals but the first;"
  echo "   queue.max_queued_per_tenant $QUEUE_CAP, interactive_reserve ${RESERVE:-0.10 (default)}; C = $(f1 "$C") tokens/s"
  a_p99=$(jget "$OUT_DIR/protect-a.json" '.classes[] | select(.name=="interactive") | .ttft_ms.p99')
  printf "%-22s %9s %9s %9s %8s %10s %10s %10s %10s %11s %9s\n" run "TTFT p50" "p99" "p99/(a)" "int ok" "int fail" "int tok/s" "unused" "batch t/s" "batch/unus" "batch 429"
  for run in a b c; do
    rep="$OUT_DIR/protect-$run.json"
    label=$(case $run in a) echo "(a) no batch";; b) echo "(b) batch, priority";; c) echo "(c) batch, fifo";; esac)
    p50=$(jget "$rep" '.classes[] | select(.name=="interactive") | .ttft_ms.p50')
    p99=$(jget "$rep" '.classes[] | select(.name=="interactive") | .ttft_ms.p99')
    iok=$(jget "$rep" '[.tenants[] | select(.name|startswith("i")) | .ok] | add')
    ifail=$(jget "$rep" '[.tenants[] | select(.name|startswith("i")) | .failed + .dropped] | add')
    it=$(steady "$rep" "$WINDOW" "$DURATION" i1 i2 i3)
    bt=$(steady "$rep" "$WINDOW" "$DURATION" bulk)
    unused=$(calc "$C - $it" 1)
    b429=$(jget "$rep" '[.tenants[] | select(.name=="bulk") | .failures[]? | select(.status==429) | .count] | add // 0')
    ratio="-"; [ "$run" = a ] || ratio=$(calc "$bt / $unused" 2)
    printf "%-22s %9.1f %9.1f %9s %8s %10s %10.1f %10.1f %10.1f %11s %9s\n" "$label" "$p50" "$p99" "$(calc "$p99 / $a_p99" 2)" \
      "$iok" "$ifail" "$it" "$unused" "$bt" "$ratio" "$b429"
  done
  echo "   (TTFT in ms, of the interactive class; unused = C - interactive tokens/s; goals: (b) p99/(a) <= 1.5, (b) batch/unused >= 0.90)"
  for run in a b c; do
    echo "   interactive queue ms ($run): $(jget "$OUT_DIR/protect-$run.json" '.classes[] | select(.name=="interactive") | .queue_ms | "p50 \(.p50) p99 \(.p99) max \(.max)"')"
  done
fi

# --- 2: fairness -------------------------------------------------------------------------------
if wants 2; then
  SR=$(calc "$R * 0.4" 3)
  HR=$(calc "$R * 4" 3)
  fair_name=fairness
  # Fresh workers: their peak (usher_sim_requests_peak) is this run's alone.
  start_sims --max-num-seqs "$SEQS" --scheduling-policy "$sim_policy"
  cut_pid=
  if [ "$REPLICAS" -gt 1 ]; then
    fair_name=fairness-r$REPLICAS
    if [ "$REDIS_CUT" -gt 0 ]; then fair_name=$fair_name-cut$REDIS_CUT; fi
    start_fleet "$fair_name" false
    if [ "$REDIS_CUT" -gt 0 ]; then
      cut_redis $((FAIR_DURATION / 2)) "$REDIS_CUT" &
      cut_pid=$!
      pids+=("$cut_pid")
    fi
  else
    start_gateway "$fair_name" false
  fi
  run_bench "$fair_name" --tenant "f1=$(key f1)::standard:$HR" --tenant "f2=$(key f2)::standard:$SR" \
    --tenant "f3=$(key f3)::standard:$SR" --tenant "f4=$(key f4)::standard:$SR" \
    --duration "${FAIR_DURATION}s" --window "${FAIR_WINDOW}s"
  if [ -n "$cut_pid" ]; then wait "$cut_pid" || true; fi
  peaks=$(sim_peaks)
  stop_gateway
  rep="$OUT_DIR/$fair_name.json"
  n=$((FAIR_DURATION / FAIR_WINDOW))
  echo
  echo "== 2. fairness: four standard tenants of one tier (weight 1), f1 at $HR req/s (4 R), f2..f4 at $SR req/s (0.4 R)"
  echo "   each; lengths spread ±$SPREAD; ${FAIR_DURATION}s of arrivals; tokens (prompt + output) served per ${FAIR_WINDOW}s window;"
  echo "   $REPLICAS gateway replica(s)$([ "$REPLICAS" -gt 1 ] && echo " sharing one Redis, the requests spread $REPLICA_SPREAD over them")"
  if [ -n "$cut_pid" ]; then
    echo "   redis-server killed at $((FAIR_DURATION / 2))s of the arrivals, a fresh one ${REDIS_CUT}s later"
  fi
  jq -r --argjson n "$n" '
    (["window"] + [range(0; $n) | "\(. * '"$FAIR_WINDOW"')s"]) as $head
    | ($head | @tsv),
      (.fairness.tokens | to_entries[] | [.key] + [.value[0:$n][] | floor | tostring] | @tsv),
      (["Jain"] + [.fairness.jain[0:$n][] | . * 1000 | round / 1000 | tostring] | @tsv)
  ' "$rep" | column -t
  echo "   Jain over the windows inside the arrivals: mean $(jq -r --argjson n "$n" '.fairness.jain[0:$n] | add / length | . * 1000 | round / 1000' "$rep"), min $(jq -r --argjson n "$n" '.fairness.jain[0:$n] | min | . * 1000 | round / 1000' "$rep")"
  echo "   f1's share of the tokens over those windows: $(jq -r --argjson n "$n" '[.fairness.tokens[] | .[0:$n] | add] as $all
    | [.fairness.tokens.f1 // [] | .[0:$n] | add] | .[0] // 0 | . / ($all | add) * 1000 | round / 10' "$rep")% (a fair share: 25%)"
  echo "   bench's own: $(grep '^fairness' "$OUT_DIR/$fair_name.txt")"
  echo "   per tenant: $(jq -r '[.tenants[] | "\(.name) ok \(.ok) 429 \([.failures[]? | select(.status==429) | .count] | add // 0) out tok/s \(.output_tokens_per_second | . * 10 | round / 10)"] | join("; ")' "$rep")"
  if [ "$REPLICAS" -gt 1 ]; then
    for r in $(seq "$REPLICAS"); do
      # grep: go-redis logs its failed dials as plain text beside the JSON lines.
      echo "   replica $r answered (200, by tenant): $(grep '^{' "$OUT_DIR/$fair_name-r$r.gateway.log" | jq -rs '[.[] | select(.msg == "request" and .status == 200 and (.tenant | test("^f[1-4]$")))]
        | group_by(.tenant) | map("\(.[0].tenant) \(length)") | join(", ")')"
    done
  fi
  echo "   each worker's peak of requests held at once (running + waiting, the sim's count): $peaks (max_concurrency $worker_conc)"
  echo "   (goal: Jain >= 0.95)"
fi

# --- 3: deadlines ------------------------------------------------------------------------------
if wants 3; then
  DR=$(calc "$R * 0.5" 3)
  read -r -a dl <<<"$DEADLINES"
  start_gateway deadlines false
  run_bench deadlines-warm --tenant "warm=$(key warm)::interactive" --rate "$R" --requests $((SEQS * 4))
  probes="$OUT_DIR/deadlines-probes.txt"
  : >"$probes"
  (
    for _ in $(seq $((DL_DURATION * 4))); do
      curl -s -o /dev/null --max-time 30 -w '%{http_code} %{time_total}\n' "http://$GW/v1/chat/completions" \
        -H "Authorization: Bearer $(key probe)" -H 'X-Usher-Priority: standard' -H "X-Usher-Deadline-Ms: $PROBE_DEADLINE" \
        -d "{\"model\":\"$MODEL\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"probe\"}]}" >>"$probes" || true
      sleep 0.25
    done
  ) &
  probe_pid=$!
  pids+=($probe_pid)
  run_bench deadlines --tenant "d1=$(key d1)::standard:$DR:${dl[0]}" --tenant "d2=$(key d2)::standard:$DR:${dl[1]}" \
    --tenant "d3=$(key d3)::standard:$DR:${dl[2]}" --tenant "d4=$(key d4)::standard:$DR:${dl[3]}" \
    --duration "${DL_DURATION}s" --window "${WINDOW}s"
  wait "$probe_pid" || true
  stop_gateway
  rep="$OUT_DIR/deadlines.json"
  echo
  echo "== 3. deadlines: d1..d4 at $DR req/s each (2 R in all) for ${DL_DURATION}s, standard class, deadlines ${DEADLINES} ms;"
  echo "   after a warm-up of $((SEQS * 4)) requests. 'dispatch max' is the longest X-Usher-Queue-Ms of a dispatched request;"
  echo "   'late done' is bench's count of OK requests that ended after their deadline"
  printf "%-7s %8s %6s %6s %8s %9s %9s %6s %12s %9s %9s %10s\n" tenant deadline sent ok "dl_unre" "q_full" "504 dl_ex" other "dispatch max" "TTFT p99" "E2E p99" "late done"
  for i in 0 1 2 3; do
    t="d$((i + 1))"
    jq -r --arg t "$t" --argjson d "${dl[$i]}" '.tenants[] | select(.name==$t) |
      def n(s; c): [.failures[]? | select(.status==s and .code==c) | .count] | add // 0;
      [$t, $d, .sent, .ok, n(429; "deadline_unreachable"), n(429; "queue_full"), n(504; "deadline_exceeded"),
       (.failed - n(429; "deadline_unreachable") - n(429; "queue_full") - n(504; "deadline_exceeded")),
       .queue_ms.max, (.ttft_ms.p99 | floor), (.e2e_ms.p99 | floor), .deadline_misses] | @tsv' "$rep" |
      awk -F'\t' '{ printf "%-7s %8s %6s %6s %8s %9s %9s %6s %12s %9s %9s %10s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }'
  done
  echo "   dispatched after their deadline (X-Usher-Queue-Ms > deadline): $(jq -r --args '[.tenants as $ts | range(0; 4) as $i | $ts[] | select(.name == "d\($i + 1)") | select(.queue_ms.max > ($ARGS.positional[$i] | tonumber))] | length' --args "${dl[@]}" <"$rep") tenants with any"
  # The gateway's access log: ms from arrival to the answer, for every refusal.
  jq -rs '
    def pct(p): if length == 0 then "-" else .[((length - 1) * p / 100 | floor)] end;
    [.[] | select(.msg == "request" and .status == 429 and (.tenant | test("^d[1-4]$|^probe$")))] as $r
    | ($r | map(.ms) | sort) as $ms
    | "   refusals (429) at the gateway, from its access log (whole ms): \($ms | length); ms p50 \($ms | pct(50)), p99 \($ms | pct(99)), max \($ms | pct(100)); over 5 ms: \($ms | map(select(. > 5)) | length)",
      "   504 deadline_exceeded in the log: \([.[] | select(.msg == "request" and .status == 504)] | length)"
  ' "$OUT_DIR/deadlines.gateway.log"
  ok=$(awk '$1 == 200' "$probes" | wc -l)
  awk '$1 == 429 { printf "%.3f\n", $2 * 1000 }' "$probes" | sort -n | awk -v ok="$ok" -v d="$PROBE_DEADLINE" '
    { t[++n] = $1; if ($1 > 5) over++ }
    END { printf "   curl probes (deadline %s ms, time_total from send): %d refused, %d served; refusal ms p50 %.2f, max %.2f; over 5 ms: %d\n",
      d, n, ok, n ? t[int((n + 1) / 2)] : 0, n ? t[n] : 0, over }'
  echo "   (goals: none served after its deadline; every refusal within 5 ms of arrival)"
fi
# --- 4: engine modes (issue 14) ---------------------------------------------------------------
# cap_run NAME IN OUT: a saturating run of one interactive tenant with IN/OUT lengths on the
# current (default-config) gateway; sets CAP_C (tokens/s, prompt + output) and CAP_R (req/s).
cap_run() {
  run_bench "$1" --tenant "cap=$(key cap)::interactive" --rate 400 --max-inflight "$M_INFLIGHT" \
    --random-input-len "$2" --random-output-len "$3" --duration "${M_CAP_DURATION}s" --window "${WINDOW}s"
  CAP_C=$(steady "$OUT_DIR/$1.json" "$WINDOW" "$M_CAP_DURATION" cap)
  CAP_R=$(calc "$CAP_C / $(jget "$OUT_DIR/$1.json" '(.overall.prompt_tokens + .overall.output_tokens) / .overall.ok')" 3)
}
# capacity NAME IN OUT K: sets CAP_C and CAP_R as cap_run does, from the K-th pair of M_CAP (1:
# interactive, 2: prefill batch) when it is given, else measured by cap_run on a fresh default
# gateway NAME.
capacity() {
  if [ -n "$M_CAP" ]; then
    local caps
    read -r -a caps <<<"$M_CAP"
    CAP_C=${caps[$((2 * $4 - 2))]} CAP_R=${caps[$((2 * $4 - 1))]}
    return
  fi
  start_default_gateway "$1"
  cap_run "$1" "$2" "$3"
}
# int_attainment: the interactive requests the current gateway judged against their TTFT
# objective (the default one: 2x what the worker's cost model predicts for the prompt on an idle
# worker), as met/judged (pct%); requests served before the cost model predicts are unjudged.
int_attainment() {
  local met judged
  read -r met judged < <(gateway_judged usher_objective_ttft_total interactive)
  if [ "$judged" -eq 0 ]; then echo -; else echo "$met/$judged($(calc "100 * $met / $judged" 1)%)"; fi
}

# gateway_judged SERIES CLASS: the requests of CLASS the current gateway (every replica) counted
# in SERIES (usher_objective_*_total) as met and as judged (met or missed): "met judged".
gateway_judged() {
  local g
  for g in "${GWS[@]}"; do curl -fs "http://$g/metrics"; done | awk -v series="$1{" -v class="class=\"$2\"" '
    index($0, series) == 1 && index($0, class) {
      if ($0 ~ /verdict="met"/) met += $NF; else if ($0 ~ /verdict="missed"/) missed += $NF }
    END { printf "%d %d\n", met, met + missed }'
}

# engine_signals NAME DELAY: after DELAY seconds, the load metrics of both workers, for the report.
engine_signals() {
  sleep "$2"
  for a in "${sims[@]}"; do
    curl -s "http://$a/metrics" | grep -E '^(vllm:num_requests_(running|waiting)|vllm:kv_cache_usage_perc|llamacpp:requests_(processing|deferred))' |
      sed -E 's/\{[^}]*\}//; s/^(vllm|llamacpp)://' | awk '{ printf "%s=%g ", $1, $2 }'
    echo
  done >"$OUT_DIR/$1.signals.txt"
}
# sim_seconds: the sims' usher_sim_sequence_seconds_total and
# usher_sim_cancelled_sequence_seconds_total, each summed over the sims: "busy lost".
sim_seconds() {
  local a
  for a in "${sims[@]}"; do curl -s "http://$a/metrics"; done | awk '
    $1 == "usher_sim_sequence_seconds_total" { busy += $2 }
    $1 == "usher_sim_cancelled_sequence_seconds_total" { lost += $2 }
    END { printf "%.6f %.6f\n", busy, lost }'
}
# engine_time NAME: the sims' own count of the time sequences spent computing
# (usher_sim_sequence_seconds_total) and, of it, that of sequences cancelled while running
# (usher_sim_cancelled_sequence_seconds_total: preempted work thrown away), summed over the
# sims from the first steady window's start to the end of the arrivals, as the mean sequences
# computing and the mean of them thrown away: "busy lost". With SLOTS slots in all, busy against
# it is the slots' occupancy, and where a fleet's batch share falls short of one replica's, busy
# tells slots left idle from lost work thrown away.
engine_time() {
  local s0 s1 t0 t1
  sleep "$WINDOW"
  t0=$(date +%s.%N); s0=$(sim_seconds)
  sleep "$((M_DURATION - WINDOW))"
  t1=$(date +%s.%N); s1=$(sim_seconds)
  awk -v t0="$t0" -v t1="$t1" -v a="$s0" -v b="$s1" 'BEGIN {
    d = t1 - t0; split(a, x, " "); split(b, y, " ")
    printf "%.2f %.2f\n", (y[1] - x[1]) / d, (y[2] - x[2]) / d }' >"$OUT_DIR/$1.busy.txt"
}
if wants 4; then
  m4="$OUT_DIR/modes.txt"
  : >"$m4"
  : >"$OUT_DIR/modes-signals.txt"
  ip() { jget "$1" ".classes[] | select(.name==\"interactive\") | .ttft_ms.$2"; }
  for mode in $MODES; do
    if [ "$FLEET" = pd ] && [ "$mode" != kv ]; then
      echo "queuebench: FLEET=pd needs MODES=kv (only the kv mode's sims serve a role)" >&2; exit 1
    fi
    case $mode in
      # --cancel-poll: llama-server checks for the client of a whole answer once a second.
      slots) start_sims --mode slots --slots "$M_SLOTS" --cancel-poll 1s --close-after-stream
        shape="$M_SLOTS slots per worker (llama-server, its 1 s cancel check and closes after streams)" ;;
      kv)
        start_sims --mode kv --max-num-seqs "$KV_SEQS" --kv-cache-tokens "$KV_TOKENS" --max-num-batched-tokens "$KV_BATCHED"
        shape="max_num_seqs $KV_SEQS, $KV_TOKENS KV tokens, $KV_BATCHED tokens a step per worker (vLLM)" ;;
      *) echo "queuebench: unknown mode $mode (want slots or kv)" >&2; exit 1 ;;
    esac
    # The /props a router reads in slots mode, shown as the sim serves it.
    props=$(curl -sf "http://${sims[0]}/props" | jq -c '{total_slots, n_ctx: .default_generation_settings.n_ctx}' 2>/dev/null || echo "none (404)")
    capacity "m4-$mode-cap" "$IN" "$OUT" 1
    Ci=$CAP_C; Ri=$CAP_R
    for batch in $BATCHES; do
      case $batch in
        decode) b_in=$IN; b_out=$OUT; Cb=$Ci; Rb=$Ri ;;
        prefill)
          b_in=$P_IN; b_out=$P_OUT
          capacity "m4-$mode-cap-prefill" "$b_in" "$b_out" 2
          Cb=$CAP_C; Rb=$CAP_R ;;
        *) echo "queuebench: unknown batch $batch (want decode or prefill)" >&2; exit 1 ;;
      esac
      echo "m4 $mode/$batch: C_i $Ci R_i $Ri C_b $Cb R_b $Rb${M_CAP:+ (M_CAP)}" >>"$OUT_DIR/modes-signals.txt"
      IR=$(calc "$Ri * 0.1" 3)
      BR=$(calc "$Rb * 3" 3)
      # The interactive bench connects from another loopback address: it is not the batch
      # client, whose backlog may reach usher's per-client connection bound.
      inter=(--tenant "i1=$(key i1)::interactive:$IR" --tenant "i2=$(key i2)::interactive:$IR" --tenant "i3=$(key i3)::interactive:$IR"
        --duration "${M_DURATION}s" --window "${WINDOW}s" --local-addr 127.0.0.2)
      name="m4-$mode-$batch"
      start_default_gateway "$name-a"
      run_bench "$name-a" "${inter[@]}"
      attain_a=$(int_attainment)
      a="$OUT_DIR/$name-a.json"
      for round in $(seq "$V_ROUNDS"); do
        for variant in $VARIANTS; do
          vname=${variant%%=*}
          run="$name-b"
          if [ "$VARIANTS" != default ] || [ "$V_ROUNDS" != 1 ]; then run="$name-b-$vname-r$round"; fi
          start_default_gateway "$run" "$variant"
          # At most 250 outstanding, under usher's per-client connection bound (256).
          run_bench "$run-batch" --tenant "bulk=$(key bulk)::batch:$BR::$BATCH_ANSWER" --random-input-len "$b_in" --random-output-len "$b_out" \
            --duration "${M_DURATION}s" --window "${WINDOW}s" --max-inflight 250 &
          batch_pid=$!
          engine_signals "$run" "$((M_DURATION / 2))" &
          sig_pid=$!
          engine_time "$run" &
          time_pid=$!
          run_bench "$run" "${inter[@]}"
          wait "$batch_pid" || { echo "batch bench of $run failed" >&2; exit 1; }
          wait "$sig_pid" || true
          wait "$time_pid" || true
          attain=$(int_attainment)
          # The routing counters of each replica (reserve takes, share exchanges, preemptions), for the record.
          for g in "${!GWS[@]}"; do
            curl -fs "http://${GWS[$g]}/metrics" | grep -E '^usher_(routing_reserve|routing_share_exchanges|preempted)' >"$OUT_DIR/$run.metrics-$((g + 1)).txt" || true
          done
          stop_gateway
          b="$OUT_DIR/$run.json"; bb="$OUT_DIR/$run-batch.json"
          it=$(steady "$b" "$WINDOW" "$M_DURATION" i1 i2 i3)
          bt=$(steady "$bb" "$WINDOW" "$M_DURATION" bulk)
          printf "%-6s %-8s %-14s %8.2f %8.2f %9.1f %9.1f %9.1f %9.1f %8s %9.1f %9.1f %8s %8s %6s %6s %6s %14s %14s %6s %6s\n" "$mode" "$batch" "$vname/$round" "$Ri" "$Rb" \
            "$(ip "$a" p50)" "$(ip "$a" p99)" "$(ip "$b" p50)" "$(ip "$b" p99)" "$(calc "$(ip "$b" p99) / $(ip "$a" p99)" 2)" \
            "$it" "$bt" "$(calc "($bt / $Cb) / (1 - $it / $Ci)" 2)" \
            "$(jget "$b" '[.tenants[] | select(.name|startswith("i")) | .failed + .dropped] | add')" \
            "$(jget "$bb" '.tenants[0].ok')" "$(jget "$bb" '[.tenants[0].failures[]? | select(.status==429) | .count] | add // 0')" \
            "$(jget "$bb" '.tenants[0].dropped')" "$attain_a" "$attain" $(cat "$OUT_DIR/$run.busy.txt" 2>/dev/null || echo "- -") >>"$m4"
        done
      done
      echo "$mode/$batch: /props $props; engine signals mid-run (the last b), per worker: $(paste -sd';' "$OUT_DIR/$run.signals.txt")" >>"$OUT_DIR/modes-signals.txt"
    done
  done
  stop_sims
  echo
  echo "== 4. engine modes: the DEFAULT gateway config (no max_concurrency, hand-down off) in front of $SIMS sims ($FLEET fleet);"
  echo "   slots: $M_SLOTS slots per worker; kv: max_num_seqs $KV_SEQS, $KV_TOKENS KV tokens, $KV_BATCHED tokens a step per worker;"
  echo "   interactive i1..i3 at 0.1 R_i each ($IN prompt + $OUT output tokens), batch at 3 R_b (decode: the same lengths;"
  echo "   prefill: $P_IN prompt + $P_OUT output tokens, answers: $BATCH_ANSWER), lengths ± $SPREAD; ${M_DURATION}s of arrivals; R in req/s, TTFT in ms,"
  echo "   t/s = tokens/s (prompt + output) over the ${WINDOW}s windows inside the arrivals but the first"
  printf "%-6s %-8s %-14s %8s %8s %9s %9s %9s %9s %8s %9s %9s %8s %8s %6s %6s %6s %14s %14s %6s %6s\n" mode batch variant/round R_i R_b "(a) p50" "(a) p99" "(b) p50" "(b) p99" \
    "p99/(a)" "int t/s" "batch t/s" "b/unused" "int fail" "b ok" "b 429" "b drop" "(a) met" "(b) met" busy lost
  cat "$m4"
  sed 's/^/   /' "$OUT_DIR/modes-signals.txt"
  echo "   (TTFT percentiles are over answered requests; 'int fail' counts interactive requests not answered by the end of"
  echo "   the drain ($DRAIN), 'b drop' batch arrivals bench dropped at its in-flight bound; 'int met/judged' the (b) run's"
  echo "   interactive requests the gateway judged against the default TTFT objective (2x the idle prediction plus a step) and met;"
  echo "   busy, lost: the mean sequences the sims computed over the steady windows (slot mode: slots busy of $((M_SLOTS * SIMS))) and, of them,"
  echo "   those of requests cancelled while running (preempted: work thrown away), by the sims' own count"
  echo "   goals, issue 14: (b) p99/(a) <= 1.5 (moonshot 1.15); b/unused = (batch t/s / C_b) / (1 - int t/s / C_i) >= 0.90)"
fi


if wants 5; then
  if [ ! -f "$G_TRACE" ]; then
    echo "== 5. goodput on a trace: skipped, $G_TRACE is absent (the traces are beside the project's checkout, not in it)"
  else
    g5="$OUT_DIR/goodput.txt"
    : >"$g5"
    # The trace's own pace and mean lengths, after the token scale.
    read -r g_rate g_in g_out < <(awk -F, -v ts="$G_TOKEN_SCALE" 'NR == 2 { split($1, a, /[ :]/); t0 = a[2] * 3600 + a[3] * 60 + a[4] }
      NR > 1 { split($1, a, /[ :]/); t = a[2] * 3600 + a[3] * 60 + a[4]; n++; i += $2 / ts; o += $3 / ts }
      END { printf "%.3f %d %d\n", n / (t - t0), i / n, o / n }' "$G_TRACE")
    start_sims --mode kv --max-num-seqs "$KV_SEQS" --kv-cache-tokens "$KV_TOKENS" --max-num-batched-tokens "$KV_BATCHED"
    if [ -n "$G_CAP_R" ]; then
      CAP_R=$G_CAP_R
    else
      start_default_gateway "g5-cap"
      cap_run "g5-cap" "$g_in" "$g_out"
    fi
    for load in $LOADS; do
      scale=$(calc "$load * $CAP_R / $g_rate" 3)
      rows=$(calc "$g_rate * $scale * $G_DURATION" 0)
      run="g5-load$load"
      start_default_gateway "$run"
      run_bench "$run" --tenant "trace=$(key bulk)" --workload trace --trace "$G_TRACE" --time-scale "$scale" \
        --token-scale "$G_TOKEN_SCALE" --trace-limit "$rows"
      read -r met judged < <(gateway_judged usher_objective_requests_total standard)
      stop_gateway
      r="$OUT_DIR/$run.json"
      printf "%-6s %6s %8.2f %8s %7s %8s %10s %9.1f %9.1f %9.1f %9s\n" "$FLEET" "$load" "$(calc "$load * $CAP_R" 2)" "$(jget "$r" '.overall.ok')" \
        "$(jget "$r" '.overall.failed + .overall.dropped')" "$met/$judged" "$(calc "$met / $G_DURATION" 2)" \
        "$(jget "$r" '.overall.ttft_ms.p50')" "$(jget "$r" '.overall.ttft_ms.p99')" "$(jget "$r" '.overall.itl_ms.p99')" \
        "$(calc "$(jget "$r" '.overall.output_tokens')" 0)" >>"$g5"
    done
    stop_sims
    echo
    echo "== 5. goodput on $G_TRACE (token counts / $G_TOKEN_SCALE: mean $g_in prompt + $g_out output tokens; its pace $g_rate req/s),"
    echo "   the default config in front of $SIMS kv-mode sims ($FLEET fleet), capacity R = $(f1 "$CAP_R") req/s; ${G_DURATION}s of arrivals a load"
    printf "%-6s %6s %8s %8s %7s %8s %10s %9s %9s %9s %9s\n" fleet load "req/s" ok failed "met/jdg" "goodput/s" "TTFT p50" "TTFT p99" "ITL p99" "out tok"
    cat "$g5"
    echo "   (met/jdg: requests the gateway judged against the default objectives, standard class: TTFT within 3x the idle"
    echo "   prediction, and TPOT; goodput/s = met / the arrivals' seconds; requests before the cost model predicts are unjudged)"
  fi
fi
echo
echo "reports: $OUT_DIR"
