#!/usr/bin/env bash
# Issue 14's protection table on real engines: usher serve in front of three llama.cpp
# llama-server workers (2 slots each, the random-weight "small" model of test/realengine with
# the real Qwen2 tokenizer), driven by two usher bench processes at once, one per tenant, so each
# class has its own request shape. All on loopback; every process started here is stopped on
# exit. Bounded: with the defaults about 15 minutes of runs per engine setting (below).
#
#   0. Capacity: a batch-shaped load keeps every slot busy (bench --max-inflight = the slots,
#      max_concurrency = the slots); its requests/s over the run, drain included, is the
#      capacity R. The machine's other load moves R: read batch/R as a rough share.
#   1. Interactive alone: 0.5 req/s, 64-word (~74-token) prompts, max_tokens 16.
#   2. The same beside a batch flood at FLOOD x R: (b) default config, (c) queue.fifo: true,
#      (d) max_concurrency set by hand to the slots (skipped when MAXCONC is empty).
#   3. Prefill-heavy (PREFILL=1): batch of ~500-token prompts and 7 output tokens at FLOOD x its
#      own capacity, default config.
#   Each run's gateway is fresh; WARM_PER_WORKER streamed standard requests a worker teach its cost
#   model first, so that the interactive requests are judged against the default TTFT and TPOT
#   objectives (the table's "int met" and "tpot met").
#
# The whole table is made once per engine setting in ENGINE_VARIANTS (issue 31, item 5), the
# engines restarted between: by default "stock" (llama-server's own step, --batch-size 2048 and
# --ubatch-size 512) and then "b128" (-b 128 -ub 128: a step prefills at most 128 prompt tokens,
# so an interactive prompt that arrives behind a batch prompt waits for a short step, at some
# cost in prefill throughput). Each variant is NAME or NAME:FLAGS (extra llama-server flags),
# separated by ";"; its reports go to $OUT_DIR/NAME. With the defaults about 30 minutes.
#
#   test/enginebench/run.sh
#   DURATION=20 PREFILL=0 test/enginebench/run.sh
#   RUNS="alone default" test/enginebench/run.sh      # only those runs (capacity is always measured)
#   ENGINE_VARIANTS=stock test/enginebench/run.sh     # llama-server's own settings only
#   ENGINE_VARIANTS="b256:-b 256 -ub 256" test/enginebench/run.sh
#   USHER=/tmp/usher-old test/enginebench/run.sh       # that binary, not one built here
#   REPLICAS=3 RUNS=prefill test/enginebench/run.sh    # three gateways in front of the same engines
#   USHER_VARIANTS="base=/tmp/a new=/tmp/b" V_ROUNDS=3 RUNS=prefill test/enginebench/run.sh
#
# With USHER_VARIANTS (NAME=BINARY, space-separated) each run but the capacity and alone runs is
# made V_ROUNDS times (default 1) for every variant, interleaved (round 1 of each, then round 2),
# on the same engines and against the same capacity runs: an A/B in one invocation, each of its
# rows named RUN-NAME-ROUND. The spread between rounds of one build at three replicas is as
# large as the differences sought (docs/benchmarks.md, twenty-first session): read the rounds
# together, not one against one.
#
# With REPLICAS=N (N > 1) every run goes through N gateway replicas sharing a redis-server
# started here (the fleet's split of each worker), each with its own SQLite ledger; both bench
# processes send round robin over them (bench --replica-url), and the table's "int met" sums
# the replicas' verdicts. The warm-up is N times as long: each replica's cost models learn from
# their own answers only.
#
# The engine is built by test/realengine/build.sh when missing (about 6 minutes, once).
# Reports (bench JSON, gateway and engine logs) go to $OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."

WORKERS=${WORKERS:-3}
SLOTS=${SLOTS:-2}                  # llama-server -np
THREADS=${THREADS:-1}              # llama-server -t
MODEL=${MODEL:-small}              # micro or small (test/realengine/build.sh)
I_RATE=${I_RATE:-0.5}              # interactive req/s
I_IN=${I_IN:-64}                   # interactive prompt words (one token each, plus the template)
I_OUT=${I_OUT:-16}                 # interactive max_tokens
B_IN=${B_IN:-64}                   # batch prompt words
B_OUT=${B_OUT:-64}                 # batch max_tokens
P_IN=${P_IN:-500}                  # prefill-heavy batch prompt words
P_OUT=${P_OUT:-7}                  # prefill-heavy batch max_tokens
FLOOD=${FLOOD:-3}                  # batch rate in multiples of the capacity R
CAP_DURATION=${CAP_DURATION:-20}   # seconds of the capacity runs
DURATION=${DURATION:-120}          # seconds of arrivals of each protection run (about 60
                                   # interactive requests, so p99 is not just the maximum; an
                                   # A/B of attainment wants 600: ~300 judged, docs/benchmarks.md)
ALONE_DURATION=${ALONE_DURATION:-$DURATION} # seconds of the alone run, which only the p99/alone
                                   # column reads
DRAIN=${DRAIN:-10s}                # bench --drain: outstanding requests are cut after this
MAXCONC=${MAXCONC-$SLOTS}          # run (d)'s max_concurrency; empty skips (d)
PREFILL=${PREFILL:-1}              # 1: run 3
BATCH_ANSWER=${BATCH_ANSWER:-whole} # batch asks for whole answers, as batch jobs do (usher may
                                   # preempt one until its answer is sent); "stream" streams
SEED=${SEED:-1}
CONCURRENCY=${CONCURRENCY:-}       # more of routing.concurrency for every gateway, as YAML members,
                                   # e.g. "prefill_piece_tokens: -1" (pieces off) for an A/B run
RUNS=${RUNS:-alone default fifo maxconc prefill} # the runs below to make; alone is always made
ENGINE_VARIANTS=${ENGINE_VARIANTS:-stock; b128:-b 128 -ub 128} # llama-server settings, see above
OUT_DIR=${OUT_DIR:-artifacts/enginebench}
CACHE_RAM=${CACHE_RAM:-1024}       # llama-server --cache-ram, MiB per engine: its own default (8192)
                                   # fills 24 GiB with three engines within a 40-minute A/B, and
                                   # the machine then runs out of memory (twenty-second session)
ENGINE_CPUS=${ENGINE_CPUS:-}       # CPU lists (taskset -c) the engines run on, one per engine and
                                   # taken in turn: "1" all on CPU 1, "0 1" alternating; empty: anywhere
USHER_CPUS=${USHER_CPUS:-}         # CPU list the gateways and bench processes run on, e.g. "0"
WARM_PER_WORKER=${WARM_PER_WORKER:-40} # streamed requests a worker before each run, so the cost models judge (0: none)
REPLICAS=${REPLICAS:-1}            # gateway replicas sharing a redis-server (see above)
USHER_VARIANTS=${USHER_VARIANTS:-} # NAME=BINARY ...: an interleaved A/B of usher builds (see above)
V_ROUNDS=${V_ROUNDS:-1}            # rounds of each variant with USHER_VARIANTS
# An engine lives at most ENGINE_LIFETIME seconds (so an interrupted bench leaves none running):
# by default what the planned runs take, 15 minutes a run beyond DURATION. (A fixed hour ended
# the last run of a long A/B with every engine gone, twenty-third session.)
planned=$((3 + $(wc -w <<<"$RUNS") * V_ROUNDS * ($(wc -w <<<"$USHER_VARIANTS") > 0 ? $(wc -w <<<"$USHER_VARIANTS") : 1)))
ENGINE_LIFETIME=${ENGINE_LIFETIME:-$((planned * (DURATION + 900)))}

for tool in jq curl awk; do
  command -v "$tool" >/dev/null 2>&1 || { echo "enginebench needs $tool" >&2; exit 1; }
done
if [ "$REPLICAS" -gt 1 ]; then
  command -v redis-server >/dev/null 2>&1 || { echo "enginebench: REPLICAS needs redis-server" >&2; exit 1; }
fi
for v in $USHER_VARIANTS; do
  [[ $v == ?*=?* && -x ${v#*=} ]] || { echo "enginebench: USHER_VARIANTS: \"$v\" is not NAME=an executable" >&2; exit 1; }
done
dir=$(test/realengine/build.sh)
if [ -z "${USHER:-}" ]; then go build -o bin/usher ./cmd/usher; fi
USHER=${USHER:-bin/usher}          # the usher binary under test
mkdir -p "$OUT_DIR"
echo "enginebench: $WORKERS x llama-server -np $SLOTS -t $THREADS, model $MODEL; interactive $I_RATE req/s ${I_IN}w/$I_OUT;" \
  "batch ${B_IN}w/$B_OUT at ${FLOOD}x capacity; prefill batch ${P_IN}w/$P_OUT (PREFILL=$PREFILL); DURATION=$DURATION ALONE_DURATION=$ALONE_DURATION" \
  "CAP_DURATION=$CAP_DURATION DRAIN=$DRAIN MAXCONC=${MAXCONC:-skip} BATCH_ANSWER=$BATCH_ANSWER SEED=$SEED CONCURRENCY=\"$CONCURRENCY\"" \
  "ENGINE_VARIANTS=\"$ENGINE_VARIANTS\" REPLICAS=$REPLICAS CACHE_RAM=$CACHE_RAM ENGINE_CPUS=\"$ENGINE_CPUS\" USHER_CPUS=\"$USHER_CPUS\"; $(nproc) cores"

pids=()
gw_pids=()
redis_pid=
cleanup() {
  for p in "${pids[@]}" "${gw_pids[@]}" $redis_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# With ENGINE_CPUS and USHER_CPUS the engines and usher's processes keep to their own cores, so that
# an engine's speed does not follow what the others are doing, as on an accelerator of its own
# (three one-thread engines, the gateway and the bench on two shared cores prefill a 74-token piece
# in 72 ms at p10 and 290 at p90: docs/benchmarks.md, twenty-second session).
usher_on=()
if [ -n "$USHER_CPUS" ]; then usher_on=(taskset -c "$USHER_CPUS"); fi
read -ra engine_cpus <<<"$ENGINE_CPUS"

# start_engines FLAGS...: WORKERS llama-servers with FLAGS beside the common ones; logs in $RUN_DIR.
engines=()
start_engines() {
  engines=()
  local engine_on=()
  for i in $(seq "$WORKERS"); do
    port=$(free_port)
    if [ ${#engine_cpus[@]} -gt 0 ]; then engine_on=(taskset -c "${engine_cpus[$(((i - 1) % ${#engine_cpus[@]}))]}"); fi
    timeout "$ENGINE_LIFETIME" ${engine_on[@]+"${engine_on[@]}"} "$dir/bin/llama-server" -m "$dir/models/$MODEL.gguf" -a "$MODEL" --host 127.0.0.1 --port "$port" \
      --metrics --log-timestamps -np "$SLOTS" -c $((SLOTS * 4096)) -t "$THREADS" --cache-ram "$CACHE_RAM" "$@" >"$RUN_DIR/llama-$i.log" 2>&1 &
    pids+=($!)
    engines+=("127.0.0.1:$port")
  done
  for e in "${engines[@]}"; do
    for _ in $(seq 300); do curl -fs "http://$e/health" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -fs "http://$e/health" >/dev/null || { echo "llama-server $e is not healthy (see $RUN_DIR)" >&2; exit 1; }
  done
}
# engines_alive NAME: fails, saying so, when an engine exited before run NAME ended (the run is void).
engines_alive() {
  local p
  for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null || { echo "enginebench: a llama-server exited during $1 (see $RUN_DIR/llama-*.log): the run is void" >&2; exit 1; }
  done
}
stop_engines() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

key() { echo "sk-enginebench-$1"; }
addr_from() { # LOG PATTERN: waits up to 10 s for the listening address in a log line
  local a
  for _ in $(seq 100); do
    a=$(grep -m1 "$2" "$1" 2>/dev/null | grep -oE '127\.0\.0\.1:[0-9]+' | head -1 || true)
    if [ -n "$a" ]; then echo "$a"; return; fi
    sleep 0.1
  done
  echo "no address in $1:" >&2; cat "$1" >&2; exit 1
}

# start_gateway NAME FIFO MAXCONC: a fresh gateway (empty queue); MAXCONC empty keeps the default.
start_gateway() {
  stop_gateway
  {
    echo "server: {listen: \"127.0.0.1:0\"}"
    echo "routing:"
    local conc=()
    if [ -n "$CONCURRENCY" ]; then conc+=("$CONCURRENCY"); fi
    if [ ${#conc[@]} -gt 0 ]; then (IFS=,; echo "  concurrency: {${conc[*]}}"); fi
    echo "  workers:"
    local i=0
    for e in "${engines[@]}"; do
      i=$((i + 1))
      echo "    - {id: llama-$i, url: \"http://$e\", models: [$MODEL]${3:+, max_concurrency: $3}}"
    done
    echo "queue: {fifo: $2}"
    echo "tenants:"
    for t in chat bulk warm; do
      echo "  - {id: $t, keys: [{name: $t, sha256: $(printf %s "$(key "$t")" | sha256sum | cut -d' ' -f1)}]}"
    done
    echo "log: {level: info, format: json}"
  } >"$RUN_DIR/$1.yaml"
  GWS=()
  if [ "$REPLICAS" -le 1 ]; then
    launch_gateway "$1"
    return
  fi
  local port r
  port=$(free_port)
  ${usher_on[@]+"${usher_on[@]}"} redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no >"$RUN_DIR/$1.redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  for r in $(seq "$REPLICAS"); do
    rm -f "$RUN_DIR/$1-r$r.db"
    {
      cat "$RUN_DIR/$1.yaml"
      echo "redis: {url: \"redis://127.0.0.1:$port/0\"}"
      echo "database: {url: \"sqlite:$RUN_DIR/$1-r$r.db\"}"
    } >"$RUN_DIR/$1-r$r.yaml"
    launch_gateway "$1-r$r"
  done
  GW=${GWS[0]}
}
# launch_gateway NAME: serves NAME.yaml; appends its address to GWS and sets GW to it.
launch_gateway() {
  ${usher_on[@]+"${usher_on[@]}"} "$USHER" serve --config "$RUN_DIR/$1.yaml" >"$RUN_DIR/$1.gateway.log" 2>&1 &
  gw_pids+=($!)
  GW=$(addr_from "$RUN_DIR/$1.gateway.log" 'usher is serving')
  for _ in $(seq 100); do curl -fs "http://$GW/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  GWS+=("$GW")
}
# stop_gateway: stops every replica started, and their redis-server.
stop_gateway() {
  local p
  for p in "${gw_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  gw_pids=()
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; redis_pid=; fi
}

# bench NAME IN OUT ARGS...: one bench process against the current gateway; report in NAME.json.
bench() {
  local name=$1 in=$2 out=$3 g replicas=(); shift 3
  for g in "${GWS[@]:1}"; do replicas+=(--replica-url "http://$g/v1"); done
  ${usher_on[@]+"${usher_on[@]}"} "$USHER" bench --url "http://$GW/v1" ${replicas[@]+"${replicas[@]}"} --model "$MODEL" --random-input-len "$in" --random-output-len "$out" \
    --ignore-eos --seed "$SEED" --drain "$DRAIN" --quiet --out "$RUN_DIR/$name.json" "$@" >"$RUN_DIR/$name.txt" 2>&1 ||
    { echo "bench $name failed:" >&2; cat "$RUN_DIR/$name.txt" >&2; exit 1; }
}

# capacity NAME IN OUT: saturating batch-shaped run; prints requests/s.
capacity() {
  start_gateway "$1" false "$SLOTS"
  echo "--- $1 (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  bench "$1" "$2" "$3" --tenant "bulk=$(key bulk)::batch" --rate 200 --max-inflight $((WORKERS * SLOTS)) \
    --duration "${CAP_DURATION}s"
  stop_gateway # capacity runs in a command substitution: its gateway is not the caller's to stop
  jq -r '.overall.ok / .elapsed_seconds | . * 1000 | round / 1000' "$RUN_DIR/$1.json"
}

# run NAME FIFO MAXCONC [BATCH_IN BATCH_OUT BATCH_RATE]: interactive, with a batch flood when given.
run() {
  local name=$1 fifo=$2 conc=$3
  start_gateway "$name" "$fifo" "$conc"
  echo "--- $name (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  # Every gateway starts with its workers' cost models unlearnt, and judges no request against a
  # default objective until a worker's model has its 32 streamed answers: a standard tenant's
  # WARM_PER_WORKER short streamed requests a worker teach them first (not in the table). Each
  # replica learns its own, so REPLICAS times as many: at three replicas 360, about 90 s of the
  # engines' work, so the warm-up may drain for 120 s (with the runs' 10 s, half of them were
  # cancelled and each replica's models learnt from about 18 answers a worker).
  if [ "$WARM_PER_WORKER" -gt 0 ]; then
    bench "$name.warm" "$I_IN" "$I_OUT" --tenant "warm=$(key warm)::standard" --rate 20 \
      --max-inflight 250 --requests $((WORKERS * WARM_PER_WORKER * REPLICAS)) --drain 120s
  fi
  local bpid=
  if [ $# -gt 3 ]; then
    # At most 250 outstanding: usher's per-client connection bound is 256, and a backlog of 250
    # keeps every slot busy; arrivals beyond it are counted as dropped by the bench.
    bench "$name.batch" "$4" "$5" --tenant "bulk=$(key bulk)::batch:$6::$BATCH_ANSWER" --max-inflight 250 --duration "${DURATION}s" &
    bpid=$!
  fi
  # From another loopback address: the interactive client is not the batch client, whose
  # backlog may reach usher's per-client connection bound (256).
  bench "$name.interactive" "$I_IN" "$I_OUT" --tenant "chat=$(key chat)::interactive:$I_RATE" --duration "${RUN_DURATION:-$DURATION}s" \
    --local-addr 127.0.0.2
  if [ -n "$bpid" ]; then wait "$bpid"; fi
  judged ttft >"$RUN_DIR/$name.attainment"
  judged tpot >"$RUN_DIR/$name.tpot"
  keep_metrics "$name"
  engines_alive "$name"
  stop_gateway
}

# keep_metrics NAME: each replica's routing, preemption and objective counters, in NAME-rN.metrics.
keep_metrics() {
  local g r=0
  for g in "${GWS[@]}"; do
    r=$((r + 1))
    curl -fs "http://$g/metrics" | grep -E '^usher_(routing_|preempted|objective_)' >"$RUN_DIR/$1-r$r.metrics" || true
  done
}

# runs_of NAME FIFO MAXCONC [BATCH_IN BATCH_OUT BATCH_RATE]: run NAME, or with USHER_VARIANTS
# NAME-VARIANT-ROUND for each of V_ROUNDS rounds and each variant, with that variant's binary;
# adds what it ran to runs.
runs_of() {
  local name=$1 k v; shift
  if [ -z "$USHER_VARIANTS" ]; then
    run "$name" "$@"
    runs+=("$name")
    return
  fi
  for k in $(seq "$V_ROUNDS"); do
    for v in $USHER_VARIANTS; do
      USHER=${v#*=} run "$name-${v%%=*}-$k" "$@"
      runs+=("$name-${v%%=*}-$k")
    done
  done
}

# judged ttft|tpot: the interactive requests the current gateway judged against their TTFT
# objective (the default: 2x the serving worker's idle prediction plus one step) or TPOT
# objective (2x the idle step), as met/judged.
judged() {
  local g
  for g in "${GWS[@]}"; do curl -fs "http://$g/metrics"; done | awk -v family="usher_objective_$1_total{" '
    index($0, family) == 1 && index($0, "class=\"interactive\"") {
      if ($0 ~ /verdict="met"/) met += $NF; else if ($0 ~ /verdict="missed"/) missed += $NF }
    END { printf "%d/%d\n", met, met + missed }'
}

# suite NAME FLAGS...: the whole table on engines started with FLAGS; reports in $OUT_DIR/NAME.
suite() {
  local variant=$1; shift
  RUN_DIR=$OUT_DIR/$variant
  mkdir -p "$RUN_DIR"
  echo "=== engine setting $variant: llama-server ${*:-(its defaults)}" >&2
  start_engines "$@"
  local R BR RP PR runs
  R=$(capacity capacity "$B_IN" "$B_OUT")
  BR=$(awk -v r="$R" -v f="$FLOOD" 'BEGIN { printf "%.3f", r * f }')
  wanted() { [[ " $RUNS " == *" $1 "* ]]; }
  RUN_DURATION=$ALONE_DURATION run alone false ""
  runs=(alone)
  if wanted default; then runs_of default false "" "$B_IN" "$B_OUT" "$BR"; fi
  if wanted fifo; then runs_of fifo true "" "$B_IN" "$B_OUT" "$BR"; fi
  if [ -n "$MAXCONC" ] && wanted maxconc; then runs_of maxconc false "$MAXCONC" "$B_IN" "$B_OUT" "$BR"; fi
  if [ "$PREFILL" = 1 ] && wanted prefill; then
    RP=$(capacity capacity-prefill "$P_IN" "$P_OUT")
    PR=$(awk -v r="$RP" -v f="$FLOOD" 'BEGIN { printf "%.3f", r * f }')
    runs_of prefill false "" "$P_IN" "$P_OUT" "$PR"
  fi

  echo
  echo "== interactive TTFT beside a batch flood: $WORKERS llama-server x $SLOTS slots (model $MODEL, -t $THREADS${*:+, $*}: setting $variant), ${DURATION}s of arrivals each"
  echo "   capacity R = $R req/s at ${B_IN}w/$B_OUT (batch at $BR req/s)${RP:+; prefill-heavy R = $RP req/s at ${P_IN}w/$P_OUT (batch at $PR req/s)}"
  a99=$(jq -r '.overall.ttft_ms.p99' "$RUN_DIR/alone.interactive.json")
  printf "%-36s %9s %9s %9s %7s %8s %9s %10s %8s %11s %8s %8s\n" run "TTFT p50" "p99" "p99/alone" "int ok" "int cut" "queue p99" "batch ok/s" "batch/R" "batch tok/s" "int met" "tpot met"
  for r in "${runs[@]}"; do
    i="$RUN_DIR/$r.interactive.json"
    label=$(case ${r%%-*} in
      alone) echo "(a) interactive alone" ;;
      default) echo "(b) + batch, default config" ;;
      fifo) echo "(c) + batch, queue.fifo: true" ;;
      maxconc) echo "(d) + batch, max_concurrency $MAXCONC" ;;
      prefill) echo "(e) + prefill-heavy batch, default" ;;
    esac)
    if [[ $r == *-* ]]; then label="${label%%,*} ${r#*-}"; fi
    bok=- bfrac=- btok=-
    if [ -f "$RUN_DIR/$r.batch.json" ]; then
      b="$RUN_DIR/$r.batch.json"
      cap=$R; [ "${r%%-*}" = prefill ] && cap=$RP
      bok=$(jq -r '.overall.ok / .elapsed_seconds | . * 100 | round / 100' "$b")
      bfrac=$(awk -v x="$bok" -v c="$cap" 'BEGIN { printf "%.2f", x / c }')
      btok=$(jq -r '(.overall.prompt_tokens + .overall.output_tokens) / .elapsed_seconds | round' "$b")
    fi
    printf "%-36s %9.0f %9.0f %9.2f %7s %8s %9.0f %10s %8s %11s %8s %8s\n" "$label" \
      "$(jq -r .overall.ttft_ms.p50 "$i")" "$(jq -r .overall.ttft_ms.p99 "$i")" \
      "$(jq -r --argjson a "$a99" '.overall.ttft_ms.p99 / $a' "$i")" \
      "$(jq -r .overall.ok "$i")" "$(jq -r '.overall.failed + .overall.dropped' "$i")" \
      "$(jq -r .overall.queue_ms.p99 "$i")" "$bok" "$bfrac" "$btok" "$(cat "$RUN_DIR/$r.attainment")" "$(cat "$RUN_DIR/$r.tpot" 2>/dev/null || echo -)"
  done
  echo "   (TTFT and queue in ms, of the interactive requests served; int cut: failed or still waiting when the drain"
  echo "    ended; batch ok/s and tokens/s (prompt + output) over the bench's elapsed time, drain included;"
  echo "    int met, tpot met: interactive requests that met the default TTFT and TPOT objectives, of those judged (after a warm-up of"
  echo "    $WARM_PER_WORKER streamed requests a worker; a worker's first 32 streamed answers are never judged);"
  echo "    goal (issue 14): (b) p99/alone <= 1.5 and batch/R >= 0.9 of what interactive leaves)"
  echo "reports: $RUN_DIR"
  stop_engines
}

IFS=';' read -ra variants <<<"$ENGINE_VARIANTS"
for v in "${variants[@]}"; do
  v=$(echo "$v" | sed 's/^ *//; s/ *$//')
  [ -n "$v" ] || continue
  name=${v%%:*}
  flags=()
  if [[ $v == *:* ]]; then read -ra flags <<<"${v#*:}"; fi
  suite "$name" ${flags[@]+"${flags[@]}"}
done
