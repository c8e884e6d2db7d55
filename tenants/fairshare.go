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
}

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

// Exchange adds charges to the fleet's counters of model and sets this replica's floors (its
// least backlogged counter by class; +Inf: nothing backlogged), atomically, in one round trip,
// and returns the fleet's counters of charges (in their order) and floors: by class, the least
// floor a replica sent within FloorAge, +Inf when none. Every key it touches lives TTL from
// now. A NaN or infinite value (but a floor of +Inf), a class out of range or more than
// MaxFairShareFlows charges is refused before any round trip.
func (s *FairShareCounters) Exchange(ctx context.Context, model string, floors []float64, charges []FairShareCharge) (counters, fleetFloors []float64, err error) {
	if len(charges) > MaxFairShareFlows || len(floors) > maxFairShareClasses {
		return nil, nil, fmt.Errorf("fair share: %d flows and %d classes in one exchange, at most %d and %d",
			len(charges), len(floors), MaxFairShareFlows, maxFairShareClasses)
	}
	scope := s.opts.Prefix + "{" + idHash(model) + "}:"
	keys := make([]string, 0, len(floors)+len(charges))
	args := make([]any, 0, 2+len(floors)+3*len(charges))
	args = append(args, s.opts.TTL.Milliseconds(), len(floors), s.replica, s.opts.FloorAge.Milliseconds())
	for c, v := range floors {
		switch {
		case math.IsInf(v, 1):
			args = append(args, "none")
		case finite(v):
			args = append(args, formatFloat(v))
		default:
			return nil, nil, fmt.Errorf("fair share: floor of class %d is %v", c, v)
		}
		keys = append(keys, scope+strconv.Itoa(c)+":floors")
	}
	for _, ch := range charges {
		if ch.Class < 0 || ch.Class >= maxFairShareClasses || !finite(ch.Charge) || !finite(ch.Lift) {
			return nil, nil, fmt.Errorf("fair share: bad charge (class %d, charge %v, lift %v)", ch.Class, ch.Charge, ch.Lift)
		}
		keys = append(keys, scope+strconv.Itoa(ch.Class)+":"+idHash(ch.Tenant))
		lifted := 0
		if ch.Lifted {
			lifted = 1
		}
		args = append(args, formatFloat(ch.Charge), lifted, formatFloat(ch.Lift))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
	defer cancel()
	res, err := exchangeScript.Run(ctx, s.opts.Redis, keys, args...).StringSlice()
	if err != nil {
		return nil, nil, fmt.Errorf("fair share: %w", err)
	}
	if len(res) != len(keys) {
		return nil, nil, fmt.Errorf("fair share: %d values for %d keys", len(res), len(keys))
	}
	vals := make([]float64, len(res))
	for i, r := range res {
		if i < len(floors) && r == "none" {
			vals[i] = math.Inf(1)
			continue
		}
		v, err := strconv.ParseFloat(r, 64)
		if err != nil || !finite(v) {
			return nil, nil, fmt.Errorf("fair share: value %q of %s", r, keys[i])
		}
		vals[i] = v
	}
	return vals[len(floors):], vals[:len(floors)], nil
}

// idHash names an untrusted id in a key: 32 hex digits of its SHA-256.
func idHash(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:16])
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// exchangeScript: KEYS are the floors' hashes (ARGV[2] of them: replica -> "floor ms"), then
// the counters; ARGV[1] is the TTL in ms, ARGV[3] this replica, ARGV[4] the floors' age in ms,
// then one floor per hash ("none": nothing backlogged), then (charge, lifted, lift) per counter.
// A value that is not a number (written by something else) counts as 0, or as no floor. Values
// go back as strings: Lua numbers would reach the client truncated to integers.
var exchangeScript = redis.NewScript(`
local ttl = ARGV[1]
local nf = tonumber(ARGV[2])
local me = ARGV[3]
local age = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, nf do
  if ARGV[4 + i] == 'none' then
    redis.call('HDEL', KEYS[i], me)
  else
    redis.call('HSET', KEYS[i], me, ARGV[4 + i] .. ' ' .. now)
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
local a = 4 + nf
for j = nf + 1, #KEYS do
  local v = tonumber(redis.call('GET', KEYS[j]) or '0') or 0
  if ARGV[a + 2] == '1' then
    local lift = tonumber(ARGV[a + 3])
    if lift > v then v = lift end
  end
  v = v + tonumber(ARGV[a + 1])
  local s = string.format('%.17g', v)
  redis.call('SET', KEYS[j], s, 'PX', ttl)
  out[j] = s
  a = a + 3
end
return out`)
