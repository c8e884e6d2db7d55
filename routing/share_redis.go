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
// at" (at: Redis's clock, ms). The same key + shareWeightsSuffix holds the replicas' weights,
// "interactive-weight weight at": in a hash of its own, so that a replica of an earlier
// version, which reads only the first hash (and drops what it cannot parse there), still
// counts every grant while a fleet is upgraded. The hash tag keeps every worker's hashes in one
// Cluster slot, so one script covers them all.
const (
	shareKeyPrefix     = "usher:share:{workers}:"
	shareWeightsSuffix = ":weights"
)

// shareTimeout bounds one exchange of shares; past it the exchange fails and the replica falls
// back to 1/n of each worker.
const shareTimeout = 200 * time.Millisecond

// shareKey is the hash of worker's split.
func shareKey(worker string) string {
	h := sha256.Sum256([]byte(worker))
	return shareKeyPrefix + hex.EncodeToString(h[:16])
}

// ExchangeShares implements ShareStore with one script call over every worker's hashes.
// Reports are checked first (at most MaxShareWorkers, counts within [0, maxSlots], weights
// within [0, maxShareWeight]); in Redis, a field whose value is not four counts within that
// bound (three in the weights' hash), or whose report is older than ShareReportTTL, is deleted
// and counts for nothing, so nothing another writer puts there can raise this replica's grant
// above the limit less the holds the live replicas reported; each hash expires 4 x
// ShareReportTTL after its last exchange. A live replica without weights (of an earlier
// version) is answered as one flow of weight 1 at each level where it has demand.
func (s *RedisStore) ExchangeShares(ctx context.Context, reports []ShareReport) ([]ShareAnswer, error) {
	if len(reports) > MaxShareWorkers {
		return nil, fmt.Errorf("shares: %d workers in one exchange, at most %d", len(reports), MaxShareWorkers)
	}
	if len(reports) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, 2*len(reports))
	args := make([]any, 0, 5+7*len(reports))
	args = append(args, s.replica, ShareReportTTL.Milliseconds(), maxSlots, maxShareReplicas, maxShareWeight)
	for _, r := range reports {
		for _, v := range [...]int64{r.Limit, r.Hold, r.Want, r.Interactive, r.Demand} {
			if v < 0 || v > maxSlots {
				return nil, fmt.Errorf("shares: worker %q: count %d out of [0, %d]", r.Worker, v, maxSlots)
			}
		}
		if r.InteractiveWeight < 0 || r.Weight < 0 || r.InteractiveWeight > maxShareWeight || r.Weight > maxShareWeight {
			return nil, fmt.Errorf("shares: worker %q: weights %d/%d out of [0, %d]", r.Worker, r.InteractiveWeight, r.Weight, maxShareWeight)
		}
		k := shareKey(r.Worker)
		keys = append(keys, k, k+shareWeightsSuffix)
		args = append(args, r.Limit, r.Hold, r.Want, r.Interactive, r.Demand, r.InteractiveWeight, r.Weight)
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
		r := reports[i]
		a.Fleet = append(a.Fleet, ReplicaDemand{Replica: s.replica, Self: true, Interactive: r.Interactive, Demand: r.Demand,
			InteractiveWeight: r.InteractiveWeight, Weight: r.Weight})
		out[i] = a
	}
	return out, nil
}

// parseShareAnswer reads one worker's {grant, {replica, interactive, demand, interactive
// weight, weight, ...}} (the other replicas; a weight of -1: none reported) from the script.
func parseShareAnswer(v any) (ShareAnswer, error) {
	pair, ok := v.([]any)
	if !ok || len(pair) != 2 {
		return ShareAnswer{}, fmt.Errorf("answer %T", v)
	}
	grant, ok := pair[0].(int64)
	fleet, ok2 := pair[1].([]any)
	if !ok || !ok2 || len(fleet)%5 != 0 || len(fleet)/5 >= maxShareReplicas || grant < 0 || grant > maxSlots {
		return ShareAnswer{}, fmt.Errorf("answer %v", v)
	}
	a := ShareAnswer{Grant: grant, Fleet: make([]ReplicaDemand, 0, len(fleet)/5+1)}
	for j := 0; j < len(fleet); j += 5 {
		name, ok := fleet[j].(string)
		var n [4]int64
		for k := range n {
			c, isInt := fleet[j+1+k].(int64)
			ok = ok && isInt
			n[k] = c
		}
		inter, demand, interWeight, weight := n[0], n[1], n[2], n[3]
		if !ok || inter < 0 || demand < 0 || inter > maxSlots || demand > maxSlots ||
			interWeight < -1 || weight < -1 || interWeight > maxShareWeight || weight > maxShareWeight {
			return ShareAnswer{}, fmt.Errorf("replica %v: %v", fleet[j], fleet[j+1:j+5])
		}
		if interWeight < 0 || weight < 0 {
			interWeight, weight = 0, 0
			if inter > 0 {
				interWeight = shareWeightUnit
			}
			if demand > inter {
				weight = shareWeightUnit
			}
			weight += interWeight
		}
		a.Fleet = append(a.Fleet, ReplicaDemand{Replica: name, Interactive: inter, Demand: demand,
			InteractiveWeight: interWeight, Weight: weight})
	}
	return a, nil
}

// shareScript: KEYS are, per worker, its hash of grants and its hash of weights; ARGV[1] is
// this replica, ARGV[2] the reports' TTL (ms), ARGV[3] the largest count, ARGV[4] the most
// replicas listed, ARGV[5] the largest weight, then per worker limit, hold, want, interactive,
// demand, interactive weight, weight. Per worker it drops the fields that are malformed, out of
// bounds or expired, grants max(hold, min(want, limit - the others' grants)), records the
// grant and the demand under this replica, and the weights in the other hash, and answers
// {grant, {replica, interactive, demand, interactive weight, weight, ...}} of the others (-1
// for weights a replica did not report).
var shareScript = redis.NewScript(`
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local maxn = tonumber(ARGV[3])
local maxr = tonumber(ARGV[4])
local maxw = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS / 2 do
  local grants, wkey = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 5 + (i - 1) * 7
  local limit, hold, want = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local weights = {}
  local ws = redis.call('HGETALL', wkey)
  for j = 1, #ws, 2 do
    if ws[j] ~= me then
      local wi, wa, at = string.match(ws[j + 1], '^(%d+) (%d+) (%d+)$')
      wi, wa, at = tonumber(wi), tonumber(wa), tonumber(at)
      if wi == nil or wa == nil or at == nil or wi > maxw or wa > maxw or now - at > ttl or at - now > ttl then
        redis.call('HDEL', wkey, ws[j])
      else
        weights[ws[j]] = {wi, wa}
      end
    end
  end
  local others, fleet, listed = 0, {}, 0
  local all = redis.call('HGETALL', grants)
  for j = 1, #all, 2 do
    if all[j] ~= me then
      local g, di, dt, at = string.match(all[j + 1], '^(%d+) (%d+) (%d+) (%d+)$')
      g, di, dt, at = tonumber(g), tonumber(di), tonumber(dt), tonumber(at)
      if g == nil or di == nil or dt == nil or at == nil or g > maxn or di > maxn or dt > maxn
          or now - at > ttl or at - now > ttl then
        redis.call('HDEL', grants, all[j])
      else
        others = others + g
        if listed < maxr - 1 then
          local w = weights[all[j]] or {-1, -1}
          fleet[#fleet + 1] = all[j]
          fleet[#fleet + 1] = di
          fleet[#fleet + 1] = dt
          fleet[#fleet + 1] = w[1]
          fleet[#fleet + 1] = w[2]
          listed = listed + 1
        end
      end
    end
  end
  local grant = math.min(want, limit - others)
  if grant < hold then grant = hold end
  redis.call('HSET', grants, me, string.format('%d %d %d %d', grant, ARGV[a + 4], ARGV[a + 5], now))
  redis.call('PEXPIRE', grants, 4 * ttl)
  redis.call('HSET', wkey, me, string.format('%d %d %d', ARGV[a + 6], ARGV[a + 7], now))
  redis.call('PEXPIRE', wkey, 4 * ttl)
  out[i] = {grant, fleet}
end
return out`)
