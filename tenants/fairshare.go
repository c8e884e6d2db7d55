package tenants

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// FairShareCounters keeps the fair-share (virtual token) counters of a fleet of gateway
// replicas in Redis: one counter per model, tenant and class, and per model and class each
// replica's least backlogged counter (the fleet's least of them is where a tenant back from idle
// starts). Each replica (one FairShareCounters) sends its charges in batches and reads the
// fleet's counters back (Exchange), so every replica orders its tenants by their service across
// the fleet. Safe for concurrent use.
//
// Bounded: a key names the model and the tenant by a hash of their ids (any length, any bytes),
// every key expires FairShareOptions.TTL after its last exchange, and one exchange carries at
// most MaxFairShareFlows counters.
type FairShareCounters struct {
	opts    FairShareOptions
	replica string // this replica's field in the floors' hashes: random
}

// FairShareOptions configures FairShareCounters. Redis is required.
type FairShareOptions struct {
	Redis redis.UniversalClient
	// Prefix prefixes the keys; default "usher:fair:".
	Prefix string
	// Timeout bounds one exchange; past it the exchange fails and the replica goes on with its
	// own counters. Default 100 ms.
	Timeout time.Duration
	// TTL is how long a counter outlives its last exchange. A tenant idle longer starts again
	// from 0, and is then lifted to the floor like any tenant back from idle. Default 10 minutes.
	TTL time.Duration
	// FloorAge is how long a replica's floor counts after it sent it: a replica that stopped
	// sending (killed, or cut from Redis) stops holding the fleet's floor down. Default 1 s.
	FloorAge time.Duration
}

// FairShareCharge is one flow's (tenant and class) part of an exchange: Charge is added to the
// fleet's counter after raising it to at least Lift when Lifted.
type FairShareCharge struct {
	Tenant string
	// Class is the class's number; it names the counter and the floor it belongs to (0-15).
	Class  int
	Charge float64
	Lifted bool
	Lift   float64
	// Queued is how many of the flow's requests this replica has queued now (at most
	// maxFairShareQueued; 0: none); the fleet sums them over the replicas (FairShareFleet).
	Queued int64
}

// FairShareFleet is the fleet's answer to an exchange.
type FairShareFleet struct {
	// Counters are the fleet's counters of the charges, in their order.
	Counters []float64
	// Floors are, by class, the least floor a replica sent within FloorAge, +Inf when none.
	Floors []float64
	// Queued are, for each charge in its order, the flow's requests queued in the fleet: the
	// sum of the Queued the replicas sent within FloorAge, this one's included.
	Queued []int64
}

// maxFairShareQueued bounds a replica's Queued of one flow.
const maxFairShareQueued = 1 << 30

// MaxFairShareFlows bounds the flows of one exchange.
const MaxFairShareFlows = 4096

const maxFairShareClasses = 16

// NewFairShareCounters returns the counters over opts.Redis.
func NewFairShareCounters(opts FairShareOptions) (*FairShareCounters, error) {
	if opts.Redis == nil {
		return nil, errors.New("tenants: fair share counters: Redis is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = "usher:fair:"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 100 * time.Millisecond
	}
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Minute
	}
	if opts.FloorAge <= 0 {
		opts.FloorAge = time.Second
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("tenants: fair share counters: %w", err)
	}
	return &FairShareCounters{opts: opts, replica: hex.EncodeToString(id[:])}, nil
}

// Exchange adds charges to the fleet's counters of model, sets this replica's floors (its
// least backlogged counter by class; +Inf: nothing backlogged) and its queued requests of each
// flow charged, atomically, in one round trip, and returns the fleet's counters of charges (in
// their order), floors (by class, the least floor a replica sent within FloorAge, +Inf when
// none) and queued requests of each flow (summed over the replicas that sent theirs within
// FloorAge). Every counter key it touches lives TTL from now, each flow's queued requests
// 4 x FloorAge. A NaN or infinite value (but a floor of +Inf), a class out of range, a Queued
// out of [0, 2^30] or more than MaxFairShareFlows charges is refused before any round trip.
func (s *FairShareCounters) Exchange(ctx context.Context, model string, floors []float64, charges []FairShareCharge) (FairShareFleet, error) {
	if len(charges) > MaxFairShareFlows || len(floors) > maxFairShareClasses {
		return FairShareFleet{}, fmt.Errorf("fair share: %d flows and %d classes in one exchange, at most %d and %d",
			len(charges), len(floors), MaxFairShareFlows, maxFairShareClasses)
	}
	scope := s.opts.Prefix + "{" + idHash(model) + "}:"
	keys := make([]string, 0, len(floors)+2*len(charges))
	args := make([]any, 0, 5+len(floors)+4*len(charges))
	args = append(args, s.opts.TTL.Milliseconds(), len(floors), s.replica, s.opts.FloorAge.Milliseconds(), maxFairShareQueued)
	for c, v := range floors {
		switch {
		case math.IsInf(v, 1):
			args = append(args, "none")
		case finite(v):
			args = append(args, formatFloat(v))
		default:
			return FairShareFleet{}, fmt.Errorf("fair share: floor of class %d is %v", c, v)
		}
		keys = append(keys, scope+strconv.Itoa(c)+":floors")
	}
	for _, ch := range charges {
		if ch.Class < 0 || ch.Class >= maxFairShareClasses || !finite(ch.Charge) || !finite(ch.Lift) ||
			ch.Queued < 0 || ch.Queued > maxFairShareQueued {
			return FairShareFleet{}, fmt.Errorf("fair share: bad charge (class %d, charge %v, lift %v, queued %d)", ch.Class, ch.Charge, ch.Lift, ch.Queued)
		}
		keys = append(keys, scope+strconv.Itoa(ch.Class)+":"+idHash(ch.Tenant))
		lifted := 0
		if ch.Lifted {
			lifted = 1
		}
		args = append(args, formatFloat(ch.Charge), lifted, formatFloat(ch.Lift), ch.Queued)
	}
	for _, ch := range charges {
		keys = append(keys, scope+strconv.Itoa(ch.Class)+":"+idHash(ch.Tenant)+":queued")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
	defer cancel()
	res, err := exchangeScript.Run(ctx, s.opts.Redis, keys, args...).StringSlice()
	if err != nil {
		return FairShareFleet{}, fmt.Errorf("fair share: %w", err)
	}
	if len(res) != len(keys) {
		return FairShareFleet{}, fmt.Errorf("fair share: %d values for %d keys", len(res), len(keys))
	}
	n := len(floors) + len(charges)
	vals := make([]float64, n)
	for i, r := range res[:n] {
		if i < len(floors) && r == "none" {
			vals[i] = math.Inf(1)
			continue
		}
		v, err := strconv.ParseFloat(r, 64)
		if err != nil || !finite(v) {
			return FairShareFleet{}, fmt.Errorf("fair share: value %q of %s", r, keys[i])
		}
		vals[i] = v
	}
	queued := make([]int64, len(charges))
	for i, r := range res[n:] {
		q, err := strconv.ParseInt(r, 10, 64)
		if err != nil || q < 0 {
			return FairShareFleet{}, fmt.Errorf("fair share: queued %q of %s", r, keys[n+i])
		}
		queued[i] = q
	}
	return FairShareFleet{Counters: vals[len(floors):], Floors: vals[:len(floors)], Queued: queued}, nil
}

// idHash names an untrusted id in a key: 32 hex digits of its SHA-256.
func idHash(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:16])
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// exchangeScript: KEYS are the floors' hashes (ARGV[2] of them: replica -> "floor ms"), then
// the counters, then as many hashes of the flows' queued requests (replica -> "queued ms");
// ARGV[1] is the TTL in ms, ARGV[3] this replica, ARGV[4] the floors' age in ms, ARGV[5] the
// largest queued, then one floor per hash ("none": nothing backlogged), then (charge, lifted,
// lift, queued) per counter. A value that is not a number (written by something else) counts
// as 0, or as no floor, or as nothing queued (and is dropped). Values go back as strings: Lua
// numbers would reach the client truncated to integers.
var exchangeScript = redis.NewScript(`
local ttl = ARGV[1]
local nf = tonumber(ARGV[2])
local me = ARGV[3]
local age = tonumber(ARGV[4])
local maxq = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, nf do
  if ARGV[5 + i] == 'none' then
    redis.call('HDEL', KEYS[i], me)
  else
    redis.call('HSET', KEYS[i], me, ARGV[5 + i] .. ' ' .. now)
  end
  local least = nil
  local all = redis.call('HGETALL', KEYS[i])
  for j = 1, #all, 2 do
    local v, at = string.match(all[j + 1], '^(%S+) (%d+)$')
    v, at = tonumber(v), tonumber(at)
    if v == nil or at == nil or now - at > age then
      redis.call('HDEL', KEYS[i], all[j])
    elseif least == nil or v < least then
      least = v
    end
  end
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], ttl) end
  if least == nil then out[i] = 'none' else out[i] = string.format('%.17g', least) end
end
local nc = (#KEYS - nf) / 2
local a = 5 + nf
for j = nf + 1, nf + nc do
  local v = tonumber(redis.call('GET', KEYS[j]) or '0') or 0
  if ARGV[a + 2] == '1' then
    local lift = tonumber(ARGV[a + 3])
    if lift > v then v = lift end
  end
  v = v + tonumber(ARGV[a + 1])
  local s = string.format('%.17g', v)
  redis.call('SET', KEYS[j], s, 'PX', ttl)
  out[j] = s
  local qk = KEYS[j + nc]
  if tonumber(ARGV[a + 4]) > 0 then
    redis.call('HSET', qk, me, ARGV[a + 4] .. ' ' .. now)
  else
    redis.call('HDEL', qk, me)
  end
  local sum = 0
  local all = redis.call('HGETALL', qk)
  for k = 1, #all, 2 do
    local q, at = string.match(all[k + 1], '^(%d+) (%d+)$')
    q, at = tonumber(q), tonumber(at)
    if q == nil or at == nil or q > maxq or now - at > age or at - now > age then
      redis.call('HDEL', qk, all[k])
    else
      sum = sum + q
    end
  end
  if redis.call('EXISTS', qk) == 1 then redis.call('PEXPIRE', qk, 4 * age) end
  out[j + nc] = string.format('%d', sum)
  a = a + 4
end
return out`)
