package routing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var _ ShareStore = (*RedisStore)(nil)

// shareKeyPrefix + 32 hex digits of the SHA-256 of a worker's ID is the hash of the worker's
// split: one field per replica (the RedisStore's random name) holding "grant interactive demand
// at" (at: Redis's clock, ms). The hash tag keeps every worker's hash in one Cluster slot, so
// one script covers them all.
const shareKeyPrefix = "usher:share:{workers}:"

// shareTimeout bounds one exchange of shares; past it the exchange fails and the replica falls
// back to 1/n of each worker.
const shareTimeout = 200 * time.Millisecond

// shareKey is the hash of worker's split.
func shareKey(worker string) string {
	h := sha256.Sum256([]byte(worker))
	return shareKeyPrefix + hex.EncodeToString(h[:16])
}

// ExchangeShares implements ShareStore with one script call over every worker's hash. Reports
// are checked first (at most MaxShareWorkers, counts within [0, maxSlots]); in Redis, a field
// whose value is not four counts within that bound, or whose report is older than
// ShareReportTTL, is deleted and counts for nothing, so nothing another writer puts there can
// raise this replica's grant above the limit less the holds the live replicas reported; each
// hash expires 4 x ShareReportTTL after its last exchange.
func (s *RedisStore) ExchangeShares(ctx context.Context, reports []ShareReport) ([]ShareAnswer, error) {
	if len(reports) > MaxShareWorkers {
		return nil, fmt.Errorf("shares: %d workers in one exchange, at most %d", len(reports), MaxShareWorkers)
	}
	if len(reports) == 0 {
		return nil, nil
	}
	keys := make([]string, len(reports))
	args := make([]any, 0, 4+5*len(reports))
	args = append(args, s.replica, ShareReportTTL.Milliseconds(), maxSlots, maxShareReplicas)
	for i, r := range reports {
		for _, v := range [...]int64{r.Limit, r.Hold, r.Want, r.Interactive, r.Demand} {
			if v < 0 || v > maxSlots {
				return nil, fmt.Errorf("shares: worker %q: count %d out of [0, %d]", r.Worker, v, maxSlots)
			}
		}
		keys[i] = shareKey(r.Worker)
		args = append(args, r.Limit, r.Hold, r.Want, r.Interactive, r.Demand)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shareTimeout)
	defer cancel()
	res, err := shareScript.Run(ctx, s.client, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("shares: %w", err)
	}
	if len(res) != len(reports) {
		return nil, fmt.Errorf("shares: %d answers for %d workers", len(res), len(reports))
	}
	out := make([]ShareAnswer, len(reports))
	for i, v := range res {
		a, err := parseShareAnswer(v)
		if err != nil {
			return nil, fmt.Errorf("shares: worker %q: %w", reports[i].Worker, err)
		}
		a.Fleet = append(a.Fleet, ReplicaDemand{Replica: s.replica, Self: true, Interactive: reports[i].Interactive, Demand: reports[i].Demand})
		out[i] = a
	}
	return out, nil
}

// parseShareAnswer reads one worker's {grant, {replica, interactive, demand, ...}} (the other
// replicas) from the script.
func parseShareAnswer(v any) (ShareAnswer, error) {
	pair, ok := v.([]any)
	if !ok || len(pair) != 2 {
		return ShareAnswer{}, fmt.Errorf("answer %T", v)
	}
	grant, ok := pair[0].(int64)
	fleet, ok2 := pair[1].([]any)
	if !ok || !ok2 || len(fleet)%3 != 0 || len(fleet)/3 >= maxShareReplicas || grant < 0 || grant > maxSlots {
		return ShareAnswer{}, fmt.Errorf("answer %v", v)
	}
	a := ShareAnswer{Grant: grant, Fleet: make([]ReplicaDemand, 0, len(fleet)/3+1)}
	for j := 0; j < len(fleet); j += 3 {
		name, ok1 := fleet[j].(string)
		inter, ok2 := fleet[j+1].(int64)
		demand, ok3 := fleet[j+2].(int64)
		if !ok1 || !ok2 || !ok3 || inter < 0 || demand < 0 || inter > maxSlots || demand > maxSlots {
			return ShareAnswer{}, fmt.Errorf("replica %v: %v/%v", fleet[j], fleet[j+1], fleet[j+2])
		}
		a.Fleet = append(a.Fleet, ReplicaDemand{Replica: name, Interactive: inter, Demand: demand})
	}
	return a, nil
}

// shareScript: KEYS are the workers' hashes; ARGV[1] is this replica, ARGV[2] the reports' TTL
// (ms), ARGV[3] the largest count, ARGV[4] the most replicas listed, then per key limit, hold,
// want, interactive, demand. Per key it drops the fields that are malformed, out of bounds or
// expired, grants max(hold, min(want, limit - the others' grants)), records the grant and the
// demand under this replica, and answers {grant, {replica, interactive, demand, ...}} of the
// others.
var shareScript = redis.NewScript(`
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local maxn = tonumber(ARGV[3])
local maxr = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  local a = 4 + (i - 1) * 5
  local limit, hold, want = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local others, fleet, listed = 0, {}, 0
  local all = redis.call('HGETALL', KEYS[i])
  for j = 1, #all, 2 do
    if all[j] ~= me then
      local g, di, dt, at = string.match(all[j + 1], '^(%d+) (%d+) (%d+) (%d+)$')
      g, di, dt, at = tonumber(g), tonumber(di), tonumber(dt), tonumber(at)
      if g == nil or di == nil or dt == nil or at == nil or g > maxn or di > maxn or dt > maxn
          or now - at > ttl or at - now > ttl then
        redis.call('HDEL', KEYS[i], all[j])
      else
        others = others + g
        if listed < maxr - 1 then
          fleet[#fleet + 1] = all[j]
          fleet[#fleet + 1] = di
          fleet[#fleet + 1] = dt
          listed = listed + 1
        end
      end
    end
  end
  local grant = math.min(want, limit - others)
  if grant < hold then grant = hold end
  redis.call('HSET', KEYS[i], me, string.format('%d %d %d %d', grant, ARGV[a + 4], ARGV[a + 5], now))
  redis.call('PEXPIRE', KEYS[i], 4 * ttl)
  out[i] = {grant, fleet}
end
return out`)
