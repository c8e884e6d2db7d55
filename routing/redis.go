package routing

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisStore keeps what every gateway replica must share about routing in Redis: the pins, one
// string per pin under `usher:pin:<model>:{<tenant>}:<key>` (':', '%', '{' and '}' in the parts
// percent-encoded) holding the worker ID, with a sliding TTL, and per tenant a sorted set under
// `usher:pins-of:{<tenant>}` of its pins' keys by last use, which bounds the pins a tenant
// holds (the tenant's hash tag keeps a tenant's keys in one Redis Cluster slot); the draining
// workers, a set under `usher:draining`; as a ShareStore, each worker's split of its limit among
// the replicas, a hash under `usher:share:{workers}:<hash of the worker's ID>` (share_redis.go);
// the announcements of worker registry changes
// (WorkersChannel); and, as a PrefixFeed, the Pub/Sub channel `usher:prefixes:<model>`. Each
// method is one round trip except List, which scans. Safe for concurrent use.
type RedisStore struct {
	client       redis.UniversalClient
	maxPerTenant int
	replica      string // this replica's name in the workers' splits (ShareStore): random
}

var (
	_ PinStore        = (*RedisStore)(nil)
	_ DrainStore      = (*RedisStore)(nil)
	_ WorkerAnnouncer = (*RedisStore)(nil)
	_ PrefixFeed      = (*RedisStore)(nil)
	_ PrefillMarks    = (*RedisStore)(nil)
)

// Keys of RedisStore.
const (
	pinKeyPrefix     = "usher:pin:"
	tenantPinsPrefix = "usher:pins-of:"
	drainingKey      = "usher:draining"
	// WorkersChannel is the pub/sub channel on which replicas announce changes to the
	// WorkerRegistry.
	WorkersChannel = "usher:workers:changes"
	// PrefillMarksChannel is the pub/sub channel on which replicas tell when their interactive
	// prompts begin and end their prefill on a worker (PrefillMarks).
	PrefillMarksChannel = "usher:prefills"
	// RoomCallsChannel is the pub/sub channel on which replicas call the others for room for
	// an interactive request, and tell of the loans to the fleet's reserve they make for one
	// (RoomCalls).
	RoomCallsChannel = "usher:share:room"
	// prefixChannelPrefix + model (percent-encoded as pin parts) is the Pub/Sub channel of
	// cache_aware's shared prefixes.
	prefixChannelPrefix = "usher:prefixes:"
)

// NewRedisStore returns a store on client holding at most maxPinsPerTenant pins of a tenant
// (DefaultMaxPinsPerTenant if not positive); the caller owns client and closes it.
func NewRedisStore(client redis.UniversalClient, maxPinsPerTenant int) *RedisStore {
	if maxPinsPerTenant <= 0 {
		maxPinsPerTenant = DefaultMaxPinsPerTenant
	}
	return &RedisStore{client: client, maxPerTenant: maxPinsPerTenant, replica: rand.Text()}
}

var pinPartEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

func redisPinKey(k PinKey) string {
	return pinKeyPrefix + pinPartEscaper.Replace(k.Model) + ":{" + pinPartEscaper.Replace(k.Tenant) + "}:" + pinPartEscaper.Replace(k.Key)
}

// tenantPinsKey is the sorted set of a tenant's pin keys, scored by last use.
func tenantPinsKey(tenant string) string {
	return tenantPinsPrefix + "{" + pinPartEscaper.Replace(tenant) + "}"
}

var pinPartUnescaper = strings.NewReplacer("%3A", ":", "%7B", "{", "%7D", "}", "%25", "%")

func parseRedisPinKey(s string) (PinKey, bool) {
	parts := strings.Split(strings.TrimPrefix(s, pinKeyPrefix), ":")
	if len(parts) != 3 || !strings.HasPrefix(s, pinKeyPrefix) || len(parts[1]) < 2 ||
		parts[1][0] != '{' || parts[1][len(parts[1])-1] != '}' {
		return PinKey{}, false
	}
	tenant := parts[1][1 : len(parts[1])-1]
	return PinKey{Model: pinPartUnescaper.Replace(parts[0]), Tenant: pinPartUnescaper.Replace(tenant), Key: pinPartUnescaper.Replace(parts[2])}, true
}

// The pin scripts take KEYS[1], the pin, and KEYS[2], its tenant's set (one Cluster slot: the
// tenant's hash tag). usePin marks the pin used now in the set, which lives as long as the
// longest TTL it saw (ARGV[ttl], milliseconds); boundPins then removes the tenant's least
// recently used pins past ARGV[max], from the set and the store (their keys share the slot).
// A pin that expired stays in the set until it is the least recently used and goes first.
const (
	usePin = `
local function usePin(ttl)
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], t[1] .. '.' .. string.format('%06d', tonumber(t[2])), KEYS[1])
  if redis.call('PTTL', KEYS[2]) < tonumber(ttl) then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
`
	boundPins = `
local function boundPins(max)
  local over = redis.call('ZCARD', KEYS[2]) - tonumber(max)
  if over > 0 then
    local old = redis.call('ZPOPMIN', KEYS[2], over)
    for i = 1, #old, 2 do
      redis.call('DEL', old[i])
    end
  end
end
`
)

// getScript returns the worker KEYS[1] holds, extending its TTL to ARGV[1] milliseconds and
// marking it used; nil if there is none.
var getScript = redis.NewScript(usePin + `
local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
usePin(ARGV[1])
return v
`)

// Get implements PinStore with one script call.
func (s *RedisStore) Get(ctx context.Context, k PinKey, ttl time.Duration) (string, error) {
	v, err := getScript.Run(ctx, s.client, []string{redisPinKey(k), tenantPinsKey(k.Tenant)}, ttl.Milliseconds()).Text()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("get pin: %w", err)
	}
	return v, nil
}

// claimScript sets KEYS[1] to ARGV[2] when it is absent or holds ARGV[1], refreshes its TTL to
// ARGV[3] milliseconds, bounds the tenant's pins to ARGV[4], and returns the value it holds
// afterwards.
var claimScript = redis.NewScript(usePin + boundPins + `
local v = redis.call('GET', KEYS[1])
if (not v) or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  v = ARGV[2]
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
usePin(ARGV[3])
boundPins(ARGV[4])
return v
`)

// Claim implements PinStore with one script call.
func (s *RedisStore) Claim(ctx context.Context, k PinKey, expect, worker string, ttl time.Duration) (string, error) {
	v, err := claimScript.Run(ctx, s.client, []string{redisPinKey(k), tenantPinsKey(k.Tenant)},
		expect, worker, ttl.Milliseconds(), s.maxPerTenant).Text()
	if err != nil {
		return "", fmt.Errorf("claim pin: %w", err)
	}
	return v, nil
}

// setScript sets KEYS[1] to ARGV[1] for ARGV[2] milliseconds and bounds the tenant's pins to
// ARGV[3].
var setScript = redis.NewScript(usePin + boundPins + `
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
usePin(ARGV[2])
boundPins(ARGV[3])
return 1
`)

// Set implements PinStore with one script call.
func (s *RedisStore) Set(ctx context.Context, k PinKey, worker string, ttl time.Duration) error {
	err := setScript.Run(ctx, s.client, []string{redisPinKey(k), tenantPinsKey(k.Tenant)}, worker, ttl.Milliseconds(), s.maxPerTenant).Err()
	if err != nil {
		return fmt.Errorf("set pin: %w", err)
	}
	return nil
}

// Delete implements PinStore with one transaction.
func (s *RedisStore) Delete(ctx context.Context, k PinKey) error {
	key := redisPinKey(k)
	_, err := s.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Del(ctx, key)
		pipe.ZRem(ctx, tenantPinsKey(k.Tenant), key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete pin: %w", err)
	}
	return nil
}

// List implements PinStore: a SCAN over the pin keys keeping the first keys in order (a page),
// then one pipelined GET and PTTL per key kept. A worker filter can only be checked after the
// GET: when it leaves the page short, the next keys are read the same way.
func (s *RedisStore) List(ctx context.Context, f PinFilter) ([]Pin, error) {
	page := 0 // keys read per round: all of them when f.Limit is 0
	if f.Limit > 0 {
		page = max(f.Limit, 256)
	}
	var out []Pin
	for {
		keys, pks, err := s.firstPinKeys(ctx, f, page)
		if err != nil {
			return nil, err
		}
		if len(keys) == 0 {
			break
		}
		gets := make([]*redis.StringCmd, len(keys))
		ttls := make([]*redis.DurationCmd, len(keys))
		_, err = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, key := range keys {
				gets[i] = pipe.Get(ctx, key)
				ttls[i] = pipe.PTTL(ctx, key)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("list pins: %w", err)
		}
		for i, pk := range pks {
			worker, err := gets[i].Result()
			if err != nil || !f.match(pk, worker) {
				continue // expired between the scan and the read, or not the worker asked for
			}
			out = append(out, Pin{PinKey: pk, Worker: worker, TTL: ttls[i].Val()})
		}
		if page == 0 || len(out) >= f.Limit || len(keys) < page {
			break
		}
		f.After = &pks[len(pks)-1]
	}
	return f.firstPins(out), nil
}

// firstPinKeys scans the pin keys f selects (its worker aside) and returns the first n of them
// in order (all when n is 0), holding at most 2n in memory.
func (s *RedisStore) firstPinKeys(ctx context.Context, f PinFilter, n int) ([]string, []PinKey, error) {
	type entry struct {
		key string
		pk  PinKey
	}
	var kept []entry
	trim := func() {
		slices.SortFunc(kept, func(a, b entry) int { return comparePinKeys(a.pk, b.pk) })
		if n > 0 && len(kept) > n {
			kept = kept[:n]
		}
	}
	iter := s.client.Scan(ctx, 0, pinKeyPrefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		pk, ok := parseRedisPinKey(iter.Val())
		if !ok || !f.matchKey(pk) {
			continue
		}
		kept = append(kept, entry{iter.Val(), pk})
		if n > 0 && len(kept) >= 2*n {
			trim()
		}
	}
	if err := iter.Err(); err != nil {
		return nil, nil, fmt.Errorf("list pins: %w", err)
	}
	trim()
	keys, pks := make([]string, len(kept)), make([]PinKey, len(kept))
	for i, e := range kept {
		keys[i], pks[i] = e.key, e.pk
	}
	return keys, pks, nil
}

// SetDraining implements DrainStore.
func (s *RedisStore) SetDraining(ctx context.Context, workerID string, draining bool) error {
	var err error
	if draining {
		err = s.client.SAdd(ctx, drainingKey, workerID).Err()
	} else {
		err = s.client.SRem(ctx, drainingKey, workerID).Err()
	}
	if err != nil {
		return fmt.Errorf("set drain state: %w", err)
	}
	return nil
}

// DrainingWorkers implements DrainStore.
func (s *RedisStore) DrainingWorkers(ctx context.Context) ([]string, error) {
	ids, err := s.client.SMembers(ctx, drainingKey).Result()
	if err != nil {
		return nil, fmt.Errorf("read drain state: %w", err)
	}
	return ids, nil
}

// AnnounceWorkers implements WorkerAnnouncer with one PUBLISH.
func (s *RedisStore) AnnounceWorkers(ctx context.Context) error {
	if err := s.client.Publish(ctx, WorkersChannel, "changed").Err(); err != nil {
		return fmt.Errorf("announce worker change: %w", err)
	}
	return nil
}

// WatchWorkers implements WorkerAnnouncer with a subscription, which go-redis re-establishes
// after a lost connection (announcements made meanwhile are missed; the registry poll covers
// them).
func (s *RedisStore) WatchWorkers(ctx context.Context, changed func()) {
	s.watch(ctx, WorkersChannel, func(string) { changed() })
}

// watch calls heard with the payload of each message on channel until ctx ends, on a
// subscription of its own connection, which go-redis re-establishes after a lost connection
// (messages published meanwhile are missed).
func (s *RedisStore) watch(ctx context.Context, channel string, heard func(payload string)) {
	ps := s.client.Subscribe(ctx, channel)
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			heard(m.Payload)
		}
	}
}

func prefixChannel(model string) string { return prefixChannelPrefix + pinPartEscaper.Replace(model) }

// PublishPrefixes implements PrefixFeed: one PUBLISH.
func (s *RedisStore) PublishPrefixes(ctx context.Context, model string, batch []byte) error {
	if err := s.client.Publish(ctx, prefixChannel(model), batch).Err(); err != nil {
		return fmt.Errorf("redis publish prefixes: %w", err)
	}
	return nil
}

// SubscribePrefixes implements PrefixFeed on a connection of its own. go-redis reconnects and
// subscribes again after a connection loss; what was published meanwhile is lost.
func (s *RedisStore) SubscribePrefixes(ctx context.Context, model string, fn func(batch []byte)) error {
	sub := s.client.Subscribe(ctx, prefixChannel(model))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return fmt.Errorf("redis subscribe prefixes: %w", err)
	}
	msgs := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-msgs:
			if !ok {
				return errors.New("redis subscribe prefixes: subscription closed")
			}
			fn([]byte(m.Payload))
		}
	}
}

// MarkPrefill implements PrefillMarks with one PUBLISH on PrefillMarksChannel.
func (s *RedisStore) MarkPrefill(ctx context.Context, m PrefillMark) error {
	b, err := encodePrefillMark(s.replica, m)
	if err != nil {
		return err
	}
	return s.tell(ctx, PrefillMarksChannel, b)
}

// tell publishes payload on channel, within shareTimeout, even after ctx ends (a
// fleet message, a mark or a call, outlives the request that made it).
func (s *RedisStore) tell(ctx context.Context, channel string, payload []byte) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shareTimeout)
	defer cancel()
	if err := s.client.Publish(ctx, channel, payload).Err(); err != nil {
		return fmt.Errorf("redis publish on %s: %w", channel, err)
	}
	return nil
}

// WatchPrefillMarks implements PrefillMarks with a subscription on a connection of its own,
// which go-redis re-establishes after a lost connection (marks made meanwhile are missed). The
// replica's own marks, and malformed or oversized ones, are not passed on.
func (s *RedisStore) WatchPrefillMarks(ctx context.Context, marked func(replica string, m PrefillMark)) {
	s.watch(ctx, PrefillMarksChannel, func(payload string) {
		if from, m, ok := decodePrefillMark(s.replica, payload); ok {
			marked(from, m)
		}
	})
}
