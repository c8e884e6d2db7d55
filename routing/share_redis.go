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
// The same key + shareReserveSuffix holds, per replica, its hold of the worker's interactive
// reserve, "requests tokens at" (see TakeReserve), and + shareLentSuffix its loan to it,
// "requests at" (see LendReserve): a hash of its own, which a replica of an earlier version
// neither reads nor writes (it sees the reserve without the loans, less room than there is).
const (
	shareKeyPrefix     = "usher:share:{workers}:"
	shareWeightsSuffix = ":weights"
	shareReserveSuffix = ":reserve"
	shareLentSuffix    = ":lent"
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
	keys := make([]string, 0, 4*len(reports))
	args := make([]any, 0, 5+10*len(reports))
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
		if r.Reserve < 0 || r.Reserve > maxSlots || r.ReserveTokens < 0 || r.ReserveTokens > maxReserveTokens ||
			r.Lent < 0 || r.Lent > maxSlots {
			return nil, fmt.Errorf("shares: worker %q: reserve hold %d/%d or loan %d out of bounds", r.Worker, r.Reserve, r.ReserveTokens, r.Lent)
		}
		k := shareKey(r.Worker)
		keys = append(keys, k, k+shareWeightsSuffix, k+shareReserveSuffix, k+shareLentSuffix)
		args = append(args, r.Limit, r.Hold, r.Want, r.Interactive, r.Demand, r.InteractiveWeight, r.Weight, r.Reserve, r.ReserveTokens, r.Lent)
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
// weight, weight, ...}, reserve held, reserve lent} (the other replicas; a weight of -1: none
// reported) from the script.
func parseShareAnswer(v any) (ShareAnswer, error) {
	four, ok := v.([]any)
	if !ok || len(four) != 4 {
		return ShareAnswer{}, fmt.Errorf("answer %T", v)
	}
	grant, ok := four[0].(int64)
	fleet, ok2 := four[1].([]any)
	held, ok3 := four[2].(int64)
	lent, ok4 := four[3].(int64)
	if !ok || !ok2 || !ok3 || !ok4 || len(fleet)%5 != 0 || len(fleet)/5 >= maxShareReplicas || grant < 0 || grant > maxSlots ||
		held < 0 || held > maxSlots || lent < 0 || lent > maxSlots {
		return ShareAnswer{}, fmt.Errorf("answer %v", v)
	}
	a := ShareAnswer{Grant: grant, Fleet: make([]ReplicaDemand, 0, len(fleet)/5+1), ReserveHeld: held, ReserveLent: lent}
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

// shareScript: KEYS are, per worker, its hash of grants, its hash of weights, its hash of
// reserve holds and its hash of loans to the reserve; ARGV[1] is this replica, ARGV[2] the
// reports' TTL (ms), ARGV[3] the largest count, ARGV[4] the most replicas listed, ARGV[5] the
// largest weight, then per worker limit, hold, want, interactive, demand, interactive weight,
// weight, reserve, reserve tokens, lent. Per worker it drops the fields that are malformed, out
// of bounds or expired, grants max(hold, min(want, limit - the others' grants)), records the
// grant and the demand under this replica, the weights in the second hash, the reserve hold in
// the third and the loan in the fourth (none: the field deleted), and answers {grant,
// {replica, interactive, demand, interactive weight, weight, ...} of the others (-1 for weights
// a replica did not report), the live holds of the reserve, the live loans to it}.
var shareScript = redis.NewScript(`
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local maxn = tonumber(ARGV[3])
local maxr = tonumber(ARGV[4])
local maxw = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
` + liveCountsLua + `
for i = 1, #KEYS / 4 do
  local grants, wkey, rkey, lkey = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local a = 5 + (i - 1) * 10
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
  if tonumber(ARGV[a + 8]) > 0 or tonumber(ARGV[a + 9]) > 0 then
    redis.call('HSET', rkey, me, string.format('%d %d %d', ARGV[a + 8], ARGV[a + 9], now))
    redis.call('PEXPIRE', rkey, 4 * ttl)
  else
    redis.call('HDEL', rkey, me)
  end
  if tonumber(ARGV[a + 10]) > 0 then
    redis.call('HSET', lkey, me, string.format('%d %d', ARGV[a + 10], now))
    redis.call('PEXPIRE', lkey, 4 * ttl)
  else
    redis.call('HDEL', lkey, me)
  end
  local held = live_counts(rkey, '^(%d+) %d+ (%d+)$', me, now, ttl, maxn)
  local lent = live_counts(lkey, '^(%d+) (%d+)$', me, now, ttl, maxn)
  out[i] = {grant, fleet, math.min(held, maxn), math.min(lent, maxn)}
end
return out`)

// liveCountsLua defines live_counts(key, pattern, me, now, ttl, maxn): the sum of the first
// counts of key's fields that pattern (a count, then the time) matches, within maxn and not
// older than ttl, after deleting the others; and this replica's (me) count, second. Shared by
// the scripts that read the reserve's holds and loans.
const liveCountsLua = `
local function live_counts(key, pattern, me, now, ttl, maxn)
  local sum, mine = 0, 0
  local all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do
    local n, at = string.match(all[j + 1], pattern)
    n, at = tonumber(n), tonumber(at)
    if n == nil or at == nil or n > maxn or now - at > ttl or at - now > ttl then
      redis.call('HDEL', key, all[j])
    else
      sum = sum + n
      if all[j] == me then mine = n end
    end
  end
  return sum, mine
end`

// TakeReserve implements ShareStore with one script call over the claims' reserve hashes.
// Claims are checked first (at most MaxShareWorkers, each within the bounds of ReserveClaim); in
// Redis, a field that is not three counts within those bounds, or whose hold is older than
// ShareReportTTL, is deleted and counts for nothing.
func (s *RedisStore) TakeReserve(ctx context.Context, claims []ReserveClaim) (int, error) {
	if len(claims) > MaxShareWorkers {
		return -1, fmt.Errorf("reserve: %d workers in one claim, at most %d", len(claims), MaxShareWorkers)
	}
	if len(claims) == 0 {
		return -1, nil
	}
	keys := make([]string, 0, 2*len(claims))
	args := make([]any, 0, 4+4*len(claims))
	args = append(args, s.replica, ShareReportTTL.Milliseconds(), maxSlots, int64(maxReserveTokens))
	for _, c := range claims {
		if c.Requests < 1 || c.Requests > maxSlots || c.Tokens < 0 || c.Tokens > maxReserveTokens || c.Want < 0 || c.Want > c.Tokens ||
			c.WantRequests < 1 || c.WantRequests > c.Requests {
			return -1, fmt.Errorf("reserve: worker %q: claim of %d/%d out of %d/%d out of bounds", c.Worker, c.WantRequests, c.Want, c.Requests, c.Tokens)
		}
		k := shareKey(c.Worker)
		keys = append(keys, k+shareReserveSuffix, k+shareLentSuffix)
		args = append(args, c.Requests, c.Tokens, c.Want, c.WantRequests)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shareTimeout)
	defer cancel()
	got, err := reserveScript.Run(ctx, s.client, keys, args...).Int64()
	if err != nil {
		return -1, fmt.Errorf("reserve: %w", err)
	}
	if got < 0 || got > int64(len(claims)) {
		return -1, fmt.Errorf("reserve: answer %d for %d workers", got, len(claims))
	}
	return int(got) - 1, nil
}

// reserveScript: KEYS are, per claim, the worker's hash of reserve holds and its hash of loans
// to the reserve; ARGV[1] is this replica, ARGV[2] the holds' TTL (ms), ARGV[3] and ARGV[4] the
// largest counts of requests and tokens, then per claim requests, tokens, want (tokens), want
// (requests). It drops the fields that are malformed, out of bounds or expired, picks the claim
// whose live holds leave what it wants of the reserve and its live loans and the most tokens,
// adds that to this replica's hold there, and answers its index from 1 (0: none).
var reserveScript = redis.NewScript(`
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local maxn = tonumber(ARGV[3])
local maxt = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
` + liveCountsLua + `
local best, bestLeft, mine = 0, -1, {0, 0}
for i = 1, #KEYS / 2 do
  local rkey = KEYS[2 * i - 1]
  local a = 4 + (i - 1) * 4
  local n, tokens, want, wantN = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  n = n + live_counts(KEYS[2 * i], '^(%d+) (%d+)$', me, now, ttl, maxn)
  local usedN, usedT, own = 0, 0, {0, 0}
  local all = redis.call('HGETALL', rkey)
  for j = 1, #all, 2 do
    local rn, rt, at = string.match(all[j + 1], '^(%d+) (%d+) (%d+)$')
    rn, rt, at = tonumber(rn), tonumber(rt), tonumber(at)
    if rn == nil or rt == nil or at == nil or rn > maxn or rt > maxt or now - at > ttl or at - now > ttl then
      redis.call('HDEL', rkey, all[j])
    else
      usedN, usedT = usedN + rn, usedT + rt
      if all[j] == me then own = {rn, rt} end
    end
  end
  if usedN + wantN <= n and usedT + want <= tokens and tokens - usedT > bestLeft then
    best, bestLeft, mine = i, tokens - usedT, own
  end
end
if best > 0 then
  local a = 4 + (best - 1) * 4
  local want, wantN = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  redis.call('HSET', KEYS[2 * best - 1], me, string.format('%d %d %d', mine[1] + wantN, mine[2] + want, now))
  redis.call('PEXPIRE', KEYS[2 * best - 1], 4 * ttl)
end
return best`)

// LendReserve implements ShareStore with one script call over the worker's hashes of reserve
// holds and loans. size and delta are checked first (within [1, maxSlots] and [-maxSlots,
// maxSlots]); in Redis, a field that is malformed, out of bounds or older than ShareReportTTL
// is deleted and counts for nothing.
func (s *RedisStore) LendReserve(ctx context.Context, worker string, size, delta int64) (lent, room int64, err error) {
	if size < 1 || size > maxSlots || delta < -maxSlots || delta > maxSlots {
		return 0, 0, fmt.Errorf("reserve: worker %q: loan change %d of a reserve of %d out of bounds", worker, delta, size)
	}
	k := shareKey(worker)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shareTimeout)
	defer cancel()
	got, err := lendScript.Run(ctx, s.client, []string{k + shareReserveSuffix, k + shareLentSuffix},
		s.replica, ShareReportTTL.Milliseconds(), maxSlots, size, delta).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("reserve: %w", err)
	}
	if len(got) != 2 || got[0] < 0 || got[0] > maxSlots || got[1] < -maxSlots || got[1] > maxSlots {
		return 0, 0, fmt.Errorf("reserve: loan answer %v", got)
	}
	return got[0], got[1], nil
}

// lendScript: KEYS are the worker's hash of reserve holds and its hash of loans; ARGV[1] is this
// replica, ARGV[2] the TTL (ms), ARGV[3] the largest count, ARGV[4] the reserve's size,
// ARGV[5] the change of this replica's loan. It drops the fields that are malformed, out of
// bounds or expired; lends delta more while the reserve has no room (size + live loans - live
// holds <= 0), or takes back up to -delta of this replica's loan as far as the room allows; and
// answers {this replica's loan, the room}.
var lendScript = redis.NewScript(`
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local maxn = tonumber(ARGV[3])
local size = tonumber(ARGV[4])
local delta = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
` + liveCountsLua + `
local held = live_counts(KEYS[1], '^(%d+) %d+ (%d+)$', me, now, ttl, maxn)
local lent, mine = live_counts(KEYS[2], '^(%d+) (%d+)$', me, now, ttl, maxn)
local change = 0
if delta > 0 and size + lent - held <= 0 and mine + delta <= maxn then
  change = delta
elseif delta < 0 then
  change = -math.min(mine, -delta, math.max(size + lent - held, 0))
end
if change ~= 0 then
  mine, lent = mine + change, lent + change
  if mine > 0 then
    redis.call('HSET', KEYS[2], me, string.format('%d %d', mine, now))
    redis.call('PEXPIRE', KEYS[2], 4 * ttl)
  else
    redis.call('HDEL', KEYS[2], me)
  end
end
return {mine, math.max(math.min(size + lent - held, maxn), -maxn)}`)
