#!/usr/bin/env bash
# Routing policies side by side: for each policy, four simulated workers with finite KV caches
# behind usher, driven by `usher bench` on two workloads (SGLang's generated shared prefix and the
# Mooncake conversation trace), workers restarted between policies so each starts from cold
# caches. Prints one table per workload: the fleet's prefix-cache hit rate (the workers' own
# vllm:prefix_cache_hits_total / queries_total deltas), TTFT mean/p50/p99, throughput, the
# max/mean load over the four workers, failures. For Mooncake it also runs ONE simulated worker
# with the four's total KV cache and compute, straight from bench: the hit rate one shared cache
# of the same total size reaches, which each policy's hit rate is reported against.
#
# Loopback only, ports chosen by the kernel; every process it starts is stopped on exit. Bounded:
# each run is capped by RUN_TIMEOUT, about 12 minutes in all with the defaults. JSON reports and
# logs stay in $OUT.
#
#   test/policybench/run.sh                                   # every policy, both workloads
#   POLICIES="round_robin cache_aware" WORKLOADS=shared-prefix test/policybench/run.sh
#   SP_RATE=8 MC_LIMIT=900 test/policybench/run.sh            # lighter, shorter
#   USHER=/path/to/usher test/policybench/run.sh              # that binary, not bin/usher built here
#   POLICIES="cache_aware kv_aware" WORKLOADS=mooncake test/policybench/run.sh
#   REPLICAS=3 POLICIES="cache_aware kv_aware" WORKLOADS=mooncake test/policybench/run.sh
#   BENCH_FLAGS="--objective standard=300ms/30ms" MC_CEILING=0 MC_TIME_SCALE=24 ...  # goodput; no ceiling run
#   CA_PLACEMENT=predicted_ttft POLICIES=cache_aware WORKLOADS=mooncake ...  # cache_aware by predicted TTFT
#
# kv_aware's workers publish their KV events (`usher sim --kv-events-port`, vLLM's format) and
# the gateway subscribes to each. REPLICAS=N (default 1) runs N gateway replicas in front of the
# same workers, sharing one redis-server the script starts (cache_aware's trees share their
# inserts through it; kv_aware's replicas each subscribe to the events), and the bench sends its
# requests round robin over them, as a round-robin balancer would; reports are then named
# WORKLOAD-POLICY-rN, and the table compares the fleet's hit rate with one replica's run of the
# same policy when that report is in $OUT too.
set -euo pipefail
cd "$(dirname "$0")/../.."

POLICIES=${POLICIES:-round_robin least_request power_of_two consistent_hash prefix_hash cache_aware bucket}
WORKLOADS=${WORKLOADS:-shared-prefix mooncake}
WORKERS=${WORKERS:-4}
OUT=${OUT:-artifacts/policybench}
SEED=${SEED:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}  # seconds, bound on one bench run
REPLICAS=${REPLICAS:-1}
# BENCH_FLAGS: more flags for every `usher bench` run, split on spaces (e.g. an --objective, whose
# attainment and goodput the report then gives).
BENCH_FLAGS=${BENCH_FLAGS:-}

# shared-prefix: GROUPS x PROMPTS prompts, one pass, open loop at SP_RATE req/s (~43 s); round
# robin keeps the workers busy at that rate without collapsing (at 16 req/s it queues for
# seconds). Each group's prefix is ~2,050 tokens (128 blocks of 16); SP_KV holds about ten of
# them, so a worker keeps the quarter of the groups a cache-aware router sends it, not all 32.
SP_GROUPS=${SP_GROUPS:-32}
SP_PROMPTS=${SP_PROMPTS:-16}
SP_SYSTEM=${SP_SYSTEM:-2048}
SP_QUESTION=${SP_QUESTION:-128}
SP_OUTPUT=${SP_OUTPUT:-64}
SP_RATE=${SP_RATE:-12}
SP_KV=${SP_KV:-24576}
SP_SIM_SCALE=${SP_SIM_SCALE:-1}

# mooncake: the first MC_LIMIT rows, MC_TIME_SCALE times faster, token counts divided by
# MC_TOKEN_SCALE (one 512-token hash block becomes 32 tokens); 1800 rows span 600 s of the
# trace, 50 s here. Prompts average ~860 tokens, the largest ~7,700.
MC_TRACE=${MC_TRACE:-../shared/traces/mooncake_conversation.jsonl}
MC_TIME_SCALE=${MC_TIME_SCALE:-12}
MC_TOKEN_SCALE=${MC_TOKEN_SCALE:-16}
MC_LIMIT=${MC_LIMIT:-1800}
MC_KV=${MC_KV:-65536}
MC_SIM_SCALE=${MC_SIM_SCALE:-0.5}
MC_CEILING=${MC_CEILING:-1} # 0: no shared-cache ceiling run (%ceil is then "-")

# cache_aware mirrors at most max_bytes_per_worker of prompt text per worker; its documentation
# says to size it to the worker's prefix cache. Bench text runs ~5.3 bytes a token, so KV tokens
# x CA_BYTES_PER_TOKEN; 0 leaves the policy's default (1 MiB).
CA_BYTES_PER_TOKEN=${CA_BYTES_PER_TOKEN:-5}
# cache_aware's placement (routing.models.<model>.cache_aware.placement): empty for the default
# (thresholds), or predicted_ttft.
CA_PLACEMENT=${CA_PLACEMENT:-}

if ! command -v jq >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get install -y -qq jq >/dev/null; else
    echo "policybench needs: sudo apt-get install -y jq" >&2; exit 1; fi
fi
if [ ! -f "$MC_TRACE" ]; then
  # From a linked worktree the repository root is elsewhere; ../shared sits beside the main one.
  alt="$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null)/../../shared/traces/$(basename "$MC_TRACE")"
  [ -f "$alt" ] && MC_TRACE=$(realpath "$alt")
fi

if [ -n "${USHER:-}" ]; then usher=$(realpath "$USHER"); else
  go build -o bin/usher ./cmd/usher
  usher=$(realpath bin/usher)
fi
mkdir -p "$OUT"
tmp=$(mktemp -d)
pids=()
# stop_all stops every process started, the last started first (gateways before the Redis and
# the workers they use).
stop_all() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  pids=()
}
trap 'stop_all; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
tag=
[ "$REPLICAS" -gt 1 ] && tag="-r$REPLICAS"
sim_kv=()

key=sk-policybench-key
keyhash=$(printf %s "$key" | sha256sum | cut -d' ' -f1)

# start LOG CMD...: runs CMD in the background and sets addr to the address it logs it serves
# on; fails if it exits or logs none within 10 s.
start() {
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  addr=
  for _ in $(seq 100); do
    addr=$(grep -m1 -o 'addr=127\.0\.0\.1:[0-9]*' "$log" | cut -d= -f2) && [ -n "$addr" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# kv_port: a port P such that nothing listens on P or P+1 now (a sim's KV event publisher
# and its replay socket bind both; a sim that still finds one taken fails to start, and is
# started again on another).
kv_port() {
  local p
  for _ in $(seq 100); do
    p=$((30000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  return 1
}

# config POLICY FILE KV WORKER_ADDR...: a gateway configuration routing demo-7b with POLICY to
# workers of KV tokens; kv_aware reads the events at sim_kv (one "host:port,host:port" a
# worker); with a Redis URL in redis_url, the replicas share it; the database is FILE's own.
config() {
  local policy=$1 file=$2 kv=$3; shift 3
  local params= members=()
  if { [ "$policy" = cache_aware ] || [ "$policy" = kv_aware ]; } && [ "$CA_BYTES_PER_TOKEN" != 0 ]; then
    members+=("max_bytes_per_worker: $((kv * CA_BYTES_PER_TOKEN))")
  fi
  if [ "$policy" = cache_aware ] && [ -n "$CA_PLACEMENT" ]; then members+=("placement: $CA_PLACEMENT"); fi
  if [ ${#members[@]} -gt 0 ]; then
    params=", cache_aware: {$(IFS=,; echo "${members[*]}")}"
  fi
  if [ "$policy" = kv_aware ] && [ ${#sim_kv[@]} -gt 0 ]; then
    local ends= i=0
    for e in "${sim_kv[@]}"; do
      i=$((i + 1))
      ends="$ends${ends:+, }sim-$i: \"$e\""
    done
    params="$params, kv_aware: {endpoints: {$ends}}"
  fi
  {
    echo "server: {listen: 127.0.0.1:0}"
    echo "routing:"
    echo "  models: {demo-7b: {policy: $policy$params}}"
    echo "  workers:"
    local i=0
    for a in "$@"; do
      i=$((i + 1))
      echo "    - {id: sim-$i, url: \"http://$a\", models: [demo-7b]}"
    done
    echo "tenants:"
    echo "  - {id: bench, keys: [{name: bench, sha256: $keyhash}]}"
    echo "database: {url: \"sqlite:$file.db\"}"
    [ -n "${redis_url:-}" ] && echo "redis: {url: \"$redis_url\"}"
    echo "log: {level: info, format: text}"
  } >"$file"
}

# Keep the policies the binary accepts: a gateway with the policy must start.
accepted=()
for p in $POLICIES; do
  config "$p" "$tmp/check.yaml" "$SP_KV" 127.0.0.1:9
  if start "$tmp/check.log" "$usher" serve --config "$tmp/check.yaml"; then
    accepted+=("$p")
  else
    echo "policybench: skipping $p: usher serve refuses it: $(grep -m1 -v '^usher serve: config' "$tmp/check.log" | sed 's/^ *//')"
  fi
  stop_all
done
[ ${#accepted[@]} -gt 0 ] || { echo "policybench: no policy to run" >&2; exit 1; }

# sims COUNT KV SCALE [EXTRA...]: starts COUNT simulated workers; sets sim_addrs. With
# kv_events=1, each publishes its KV events; sim_kv is then where (else it is empty).
sims() {
  local count=$1 kv=$2 scale=$3; shift 3
  sim_addrs=() sim_kv=()
  for i in $(seq "$count"); do
    local ok= port= events=()
    for _ in 1 2 3; do
      if [ "${kv_events:-0}" = 1 ]; then
        port=$(kv_port) || { echo "policybench: no free port pair for KV events" >&2; exit 1; }
        events=(--kv-events-port "$port")
      fi
      if start "$tmp/sim-$i.log" "$usher" sim --listen 127.0.0.1:0 --kv-cache-tokens "$kv" --time-scale "$scale" "${events[@]}" "$@"; then
        ok=1; break
      fi
    done
    [ -n "$ok" ] || { cat "$tmp/sim-$i.log" >&2; exit 1; }
    sim_addrs+=("$addr")
    if [ -n "$port" ]; then sim_kv+=("127.0.0.1:$port,127.0.0.1:$((port + 1))"); fi
  done
}

# redis: starts a redis-server on a free loopback port, without persistence; sets redis_url.
redis() {
  command -v redis-server >/dev/null || { echo "policybench: REPLICAS needs redis-server" >&2; exit 1; }
  local port
  for _ in 1 2 3; do
    port=$(kv_port) || break
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no >"$tmp/redis.log" 2>&1 &
    pids+=("$!")
    for _ in $(seq 50); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then redis_url="redis://127.0.0.1:$port/0"; return 0; fi
      sleep 0.1
    done
  done
  cat "$tmp/redis.log" >&2; exit 1
}

workload_flags() {
  case $1 in
  shared-prefix)
    echo --workload shared-prefix --gsp-groups "$SP_GROUPS" --gsp-prompts-per-group "$SP_PROMPTS" \
      --gsp-system-prompt-len "$SP_SYSTEM" --gsp-question-len "$SP_QUESTION" \
      --gsp-output-len "$SP_OUTPUT" --rate "$SP_RATE" ;;
  mooncake)
    echo --workload trace --trace "$MC_TRACE" --time-scale "$MC_TIME_SCALE" \
      --token-scale "$MC_TOKEN_SCALE" --trace-limit "$MC_LIMIT" ;;
  esac
}

# bench NAME URL WORKLOAD SCRAPE_ADDR...: one bench run; its report is $OUT/NAME.json. URL may
# be several, separated by spaces: the requests go round robin over them.
bench() {
  local name=$1 urls=$2 workload=$3; shift 3
  local scrape=() url rest replicas=()
  for a in "$@"; do scrape+=(--scrape "http://$a"); done
  read -r url rest <<<"$urls"
  for u in $rest; do replicas+=(--replica-url "$u"); done
  # shellcheck disable=SC2046 # workload_flags is split on purpose; its values have no spaces
  if ! timeout "$RUN_TIMEOUT" "$usher" bench --url "$url" "${replicas[@]}" --model demo-7b --api-key "$key" --seed "$SEED" \
    --quiet --timeout 2m --drain 60s --out "$OUT/$name.json" "${scrape[@]}" $(workload_flags "$workload") $BENCH_FLAGS \
    >"$OUT/$name.txt" 2>"$OUT/$name.log"; then
    echo "policybench: $name: bench failed or timed out (see $OUT/$name.log)" >&2
    rm -f "$OUT/$name.json"
  fi
}

for wl in $WORKLOADS; do
  case $wl in
  shared-prefix) kv=$SP_KV scale=$SP_SIM_SCALE ;;
  mooncake)
    kv=$MC_KV scale=$MC_SIM_SCALE
    if [ ! -f "$MC_TRACE" ]; then echo "policybench: skipping mooncake: no trace at $MC_TRACE"; continue; fi
    if [ "$MC_CEILING" = 0 ]; then
      rm -f "$OUT/$wl-shared-cache.json"
    else
      # The ceiling: one worker with the fleet's KV cache and compute (WORKERS times faster).
      kv_events=0
      sims 1 $((kv * WORKERS)) "$(awk -v s="$scale" -v n="$WORKERS" 'BEGIN{print s/n}')" \
        --max-num-seqs $((256 * WORKERS)) --max-num-batched-tokens $((8192 * WORKERS))
      echo "policybench: $wl: shared-cache ceiling run (one worker, KV $((kv * WORKERS)) tokens)"
      bench "$wl-shared-cache" "http://${sim_addrs[0]}/v1" "$wl" "${sim_addrs[0]}"
      stop_all
    fi
    ;;
  *) echo "policybench: unknown workload $wl" >&2; exit 1 ;;
  esac
  for p in "${accepted[@]}"; do
    echo "policybench: $wl: $p${tag:+ ($REPLICAS replicas)}"
    kv_events=0
    [ "$p" = kv_aware ] && kv_events=1
    sims "$WORKERS" "$kv" "$scale"
    redis_url=
    [ "$REPLICAS" -gt 1 ] && redis
    urls=
    for r in $(seq "$REPLICAS"); do
      config "$p" "$tmp/usher-$r.yaml" "$kv" "${sim_addrs[@]}"
      log="$OUT/$wl-$p$tag.usher.log"
      [ "$REPLICAS" -gt 1 ] && log="$OUT/$wl-$p$tag.usher-$r.log"
      start "$log" "$usher" serve --config "$tmp/usher-$r.yaml" || { cat "$log" >&2; exit 1; }
      urls="$urls${urls:+ }http://$addr/v1"
    done
    bench "$wl-$p$tag" "$urls" "$wl" "${sim_addrs[@]}"
    stop_all
  done
done

rowfmt="%-16s %6s %6s %7s %7s %7s %7s %8s %8s %8s %5s\n"
# row FILE NAME CEILING: one line of the table from a bench report.
row() {
  local file=$1 name=$2 ceiling=$3
  if [ ! -f "$file" ]; then printf "%-16s %s\n" "$name" "(no report)"; return; fi
  jq -r --arg name "$name" --argjson n "$WORKERS" --argjson ceil "$ceiling" '
    def ratio(xs): (xs + [range(0; $n - (xs | length)) | 0]) as $x | ($x | add) as $t |
      if $t > 0 then ($x | max) / ($t / ($x | length)) else "-" end;
    [$name, .scrape.hit_rate * 100, (if $ceil > 0 then .scrape.hit_rate / $ceil * 100 else "-" end),
     .overall.ttft_ms.mean, .overall.ttft_ms.p50, .overall.ttft_ms.p99,
     .overall.requests_per_second, .overall.output_tokens_per_second,
     (if (.workers // []) | length > 0 then ratio([.workers[].requests]) else "-" end),
     (if (.scrape.workers // []) | length > 1 then ratio([.scrape.workers[].queries]) else "-" end),
     .overall.failed + .overall.dropped]
    | @tsv' "$file" | awk -F'\t' -v fmt="$rowfmt" '
    function f(v, p) { return v == "-" ? v : sprintf(p, v) }
    { printf fmt, $1, f($2, "%.1f"), f($3, "%.0f"), f($4, "%.0f"), f($5, "%.0f"), f($6, "%.0f"),
        f($7, "%.1f"), f($8, "%.0f"), f($9, "%.2f"), f($10, "%.2f"), $11 }'
}

echo
for wl in $WORKLOADS; do
  [ "$wl" = mooncake ] && [ ! -f "$MC_TRACE" ] && continue
  ceiling=0
  case $wl in
  shared-prefix)
    echo "shared-prefix: $SP_GROUPS groups x $SP_PROMPTS prompts, system $SP_SYSTEM + question $SP_QUESTION tokens, output $SP_OUTPUT, $SP_RATE req/s;"
    echo "  $WORKERS workers, KV $SP_KV tokens each, sim time scale $SP_SIM_SCALE" ;;
  mooncake)
    [ -f "$OUT/$wl-shared-cache.json" ] && ceiling=$(jq '.scrape.hit_rate' "$OUT/$wl-shared-cache.json")
    echo "mooncake: $(basename "$MC_TRACE") first $MC_LIMIT rows, time / $MC_TIME_SCALE, tokens / $MC_TOKEN_SCALE;"
    echo "  $WORKERS workers, KV $MC_KV tokens each, sim time scale $MC_SIM_SCALE; ceiling: 1 worker, KV $((MC_KV * WORKERS)), $WORKERS x compute" ;;
  esac
  # shellcheck disable=SC2059 # the format is ours
  printf "$rowfmt" policy "hit%" "%ceil" "ttft" "p50" "p99" "req/s" "outtok/s" "load-req" "load-tok" "fail"
  [ "$wl" = mooncake ] && row "$OUT/$wl-shared-cache.json" "(shared cache)" "$ceiling"
  for p in "${accepted[@]}"; do
    if [ -z "$tag" ] || [ -f "$OUT/$wl-$p.json" ]; then row "$OUT/$wl-$p.json" "$p" "$ceiling"; fi
    if [ -n "$tag" ]; then row "$OUT/$wl-$p$tag.json" "$p x$REPLICAS" "$ceiling"; fi
  done
  echo "routes (X-Usher-Route):"
  for p in "${accepted[@]}"; do
    for n in "$p" ${tag:+"$p$tag"}; do
      [ -f "$OUT/$wl-$n.json" ] &&
        printf "  %-16s %s\n" "$n" "$(jq -r '.overall.routes // {} | to_entries | map("\(.key)=\(.value)") | join(" ")' "$OUT/$wl-$n.json")"
    done
  done
  if [ -n "$tag" ]; then
    for p in "${accepted[@]}"; do
      [ -f "$OUT/$wl-$p.json" ] && [ -f "$OUT/$wl-$p$tag.json" ] || continue
      # shellcheck disable=SC2046 # two numbers
      set -- $(jq -rs '[.[0].scrape.hit_rate, .[1].scrape.hit_rate] | @tsv' "$OUT/$wl-$p.json" "$OUT/$wl-$p$tag.json")
      awk -v one="$1" -v fleet="$2" -v p="$p" -v n="$REPLICAS" 'BEGIN {
        of = one > 0 ? fleet / one : 0
        printf "  %s: %d replicas reach %.1f%% hit rate, one replica %.1f%%: %.0f%% of it (goal >= 95%%): %s\n",
          p, n, fleet * 100, one * 100, of * 100, of >= 0.95 ? "MET" : "NOT MET" }'
    done
  fi
  echo
done
echo "ttft in ms (mean, p50, p99); load-req / load-tok: most requests / prompt tokens on one worker over the"
echo "mean per worker; fail: failed + dropped requests. Reports and logs: $OUT"

# The goals of issue 5.
have() { [ -f "$OUT/$1.json" ]; }
if have shared-prefix-round_robin && have shared-prefix-cache_aware; then
  # shellcheck disable=SC2046 # four numbers
  set -- $(jq -rs --argjson n "$WORKERS" '
    ([.[1].workers[].requests] | . + [range(0; $n - length) | 0]) as $w |
    [.[0].overall.ttft_ms.mean, .[1].overall.ttft_ms.mean, 1 - .[1].overall.ttft_ms.mean / .[0].overall.ttft_ms.mean,
     ($w | max / ($w | add / length))] | @tsv' "$OUT/shared-prefix-round_robin.json" "$OUT/shared-prefix-cache_aware.json")
  verdict=$(awk -v cut="$3" -v ratio="$4" 'BEGIN { print (cut >= 0.7 && ratio < 1.3) ? "MET" : "NOT MET" }')
  printf "goal shared-prefix: cache_aware mean TTFT %.0f ms vs round_robin %.0f ms: cut %.0f%% (goal >= 70%%), load max/mean %.2f (goal < 1.3): %s\n" \
    "$2" "$1" "$(awk -v c="$3" 'BEGIN { print c * 100 }')" "$4" "$verdict"
fi
if have mooncake-shared-cache && have mooncake-cache_aware; then
  # shellcheck disable=SC2046 # two numbers
  set -- $(jq -rs '[.[0].scrape.hit_rate, .[1].scrape.hit_rate] | @tsv' "$OUT/mooncake-shared-cache.json" "$OUT/mooncake-cache_aware.json")
  awk -v c="$1" -v h="$2" 'BEGIN {
    of = c > 0 ? h / c : 0
    printf "goal mooncake: cache_aware hit rate %.1f%% vs shared cache %.1f%%: %.0f%% of it (goal >= 90%%): %s\n",
      h * 100, c * 100, of * 100, of >= 0.9 ? "MET" : "NOT MET" }'
fi
