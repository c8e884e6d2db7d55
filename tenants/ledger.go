package tenants

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// LedgerOptions are the dependencies of a Ledger; every field is optional.
type LedgerOptions struct {
	// Redis, when set, receives the usage as it is recorded, and the replicas take turns folding
	// it into the store: a replica killed outright loses next to nothing (see Ledger).
	Redis      redis.UniversalClient
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// Ledger records the usage of every request (UsageRecord) and writes it to the store's usage
// ledger in batches, off the request path: Record adds to counters in memory (a map update
// under a mutex, no SQL) and, with Redis, waits for them to reach Redis.
//
// Without Redis, Run writes those counters to the store every FlushInterval: a replica killed
// with SIGKILL loses at most the usage of its last FlushInterval (default 1s). A clean shutdown
// writes everything; a write the store fails is merged back and retried.
//
// With Redis, a writer moves the counters to one Redis hash as soon as they are recorded (one
// MULTI/EXEC of HINCRBY per round trip, grouping whatever was recorded meanwhile), and Record
// returns once its count is there: a request is in Redis before its handler returns, so a
// replica killed outright loses nothing it answered. Every FlushInterval one replica at a time (a Redis lock) renames that hash aside
// and adds it to the store as one named batch, then deletes it; a batch added but not deleted
// (the replica died in between) is recognised by its name and added once. While Redis fails,
// the counters go to the store directly, as without Redis.
//
// Hours older than HourlyRetention are rolled up into days, and days older than Retention
// deleted, by Run once an hour. Safe for concurrent use.
type Ledger struct {
	cfg   UsageConfig
	store *Store
	redis redis.UniversalClient
	log   *slog.Logger
	now   func() time.Time
	// token identifies this replica as the holder of the fold lock.
	token string
	// wake tells the Redis writer something was recorded (capacity 1, never blocks Record).
	wake chan struct{}
	// redisDown is set while the last move to Redis failed: Flush then writes to the store.
	redisDown atomic.Bool

	mu sync.Mutex
	// pending holds the usage recorded and not yet handed to Redis or the store (guarded by mu).
	pending map[UsageKey]UsageCounts
	// batch is what the records in pending wait on (guarded by mu).
	batch *batch

	redisFallbacks prometheus.Counter
	writeErrors    prometheus.Counter
}

// NewLedger returns a ledger writing to store; cfg must have been through SetDefaults. Run
// must run for anything to leave memory.
func NewLedger(cfg UsageConfig, store *Store, opts LedgerOptions) *Ledger {
	cfg.setDefaults()
	l := &Ledger{cfg: cfg, store: store, redis: opts.Redis, log: opts.Logger, now: opts.Now, token: newToken(),
		wake: make(chan struct{}, 1), pending: map[UsageKey]UsageCounts{}, batch: newBatch()}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.now == nil {
		l.now = time.Now
	}
	l.redisFallbacks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "usher_usage_redis_fallbacks_total",
		Help: "Moves of recorded usage to Redis that failed; the usage went to the store directly.",
	})
	l.writeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "usher_usage_write_errors_total",
		Help: "Failed writes of usage to the store or folds from Redis; the usage is kept and retried.",
	})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(l.redisFallbacks, l.writeErrors)
	}
	return l
}

func newToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// Record counts one request. Without Redis it is a map update under a mutex, no I/O (about a
// microsecond). With Redis it then waits until the writer has moved the count to Redis (one
// round trip, shared by every request recorded meanwhile), at most RedisTimeout, so a request
// whose answer is complete is counted in Redis; it does not wait while Redis is failing.
func (l *Ledger) Record(r UsageRecord) {
	k := UsageKey{Tenant: r.Tenant, Key: r.Key, Model: r.Model, Class: r.Class, Start: hourOf(r.At)}
	c := countsOf(r)
	l.mu.Lock()
	sum := l.pending[k]
	sum.Add(c)
	l.pending[k] = sum
	written := l.batch.written
	l.mu.Unlock()
	if l.redis == nil {
		return
	}
	l.wakeWriter()
	if l.redisDown.Load() {
		return
	}
	t := time.NewTimer(l.cfg.RedisTimeout)
	defer t.Stop()
	select {
	case <-written:
	case <-t.C:
	}
}

func (l *Ledger) wakeWriter() {
	if l.redis != nil {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// putBack returns rows that could not be written to what is pending, without waking the writer
// (which would retry at once, in a loop while Redis is down).
func (l *Ledger) putBack(rows map[UsageKey]UsageCounts) {
	l.mu.Lock()
	for k, c := range rows {
		sum := l.pending[k]
		sum.Add(c)
		l.pending[k] = sum
	}
	l.mu.Unlock()
}

// batch is one hand-over of pending usage; written is closed once its write was tried.
type batch struct{ written chan struct{} }

func newBatch() *batch { return &batch{written: make(chan struct{})} }

// take hands over what is pending; the caller closes the batch's written once it tried to
// write the rows.
func (l *Ledger) take() (map[UsageKey]UsageCounts, *batch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rows, b := l.pending, l.batch
	if len(rows) == 0 {
		return nil, nil
	}
	l.pending, l.batch = make(map[UsageKey]UsageCounts, len(rows)), newBatch()
	return rows, b
}

// The ledger's Redis keys share one hash tag, so a cluster keeps them on one node (RENAME).
func (l *Ledger) liveKey() string    { return l.cfg.RedisPrefix + "{ledger}:live" }
func (l *Ledger) pendingKey() string { return l.cfg.RedisPrefix + "{ledger}:pending" }
func (l *Ledger) lockKey() string    { return l.cfg.RedisPrefix + "{ledger}:lock" }

// fieldSep separates the parts of a hash field: hour, tenant, key, model, class, column.
const fieldSep = "\x1f"

// batchField is the field of the pending hash holding the batch's name.
const batchField = "#batch"

// push moves what is pending to the live hash in Redis, all or nothing (MULTI/EXEC); on failure
// it is pending again.
func (l *Ledger) push(ctx context.Context) error {
	rows, b := l.take()
	if len(rows) == 0 {
		return nil
	}
	defer close(b.written)
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	live := l.liveKey()
	_, err := l.redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for k, c := range rows {
			prefix := strconv.FormatInt(k.Start.UnixMilli(), 10) + fieldSep + k.Tenant + fieldSep + k.Key + fieldSep +
				k.Model + fieldSep + k.Class + fieldSep
			for i, f := range c.fields() {
				if *f != 0 {
					p.HIncrBy(ctx, live, prefix+usageColumns[i], *f)
				}
			}
		}
		return nil
	})
	if err != nil {
		l.putBack(rows)
	}
	return err
}

// pushLoop moves recorded usage to Redis as it comes, until ctx ends.
func (l *Ledger) pushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		if err := l.push(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if !l.redisDown.Swap(true) {
				l.log.Warn("usage: Redis failed; recorded usage goes to the store directly", "err", err)
			}
			l.redisFallbacks.Inc()
			continue
		}
		l.redisDown.Store(false)
	}
}

// Run moves the recorded usage to Redis as it is recorded (with Redis), writes it to the store
// every FlushInterval and rolls old hours up once an hour, until ctx ends; it then writes what
// this replica still holds (within a few seconds) and returns. Call it once.
func (l *Ledger) Run(ctx context.Context) {
	var writer sync.WaitGroup
	if l.redis != nil {
		writer.Go(func() { l.pushLoop(ctx) })
	}
	t := time.NewTicker(l.cfg.FlushInterval)
	defer t.Stop()
	var rolled time.Time
	for {
		select {
		case <-ctx.Done():
			writer.Wait()
			final, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if l.redis != nil && l.push(final) != nil {
				l.redisDown.Store(true)
			}
			l.Flush(final)
			return
		case <-t.C:
		}
		l.Flush(ctx)
		if now := l.now(); now.Sub(rolled) >= time.Hour {
			rolled = now
			if err := l.store.RollUp(ctx, hourOf(now.Add(-l.cfg.HourlyRetention)), dayOf(now.Add(-l.cfg.Retention))); err != nil {
				l.log.Warn("usage rollup failed", "err", err)
			}
		}
	}
}

// Flush writes what this replica holds in memory to the store (without Redis, or while Redis
// fails) and, with Redis, folds the usage counted there if no other replica is doing it. Errors
// are logged and counted; what failed is kept and retried by the next Flush.
func (l *Ledger) Flush(ctx context.Context) {
	if l.redis == nil || l.redisDown.Load() {
		if rows, b := l.take(); len(rows) > 0 {
			err := l.store.AddUsage(ctx, "", rows)
			close(b.written)
			if err != nil {
				l.putBack(rows)
				l.writeErrors.Inc()
				l.log.Warn("writing usage failed; it is kept and retried", "err", err)
			}
		}
	}
	if l.redis == nil {
		return
	}
	if err := l.fold(ctx); err != nil {
		l.writeErrors.Inc()
		l.log.Warn("folding usage from Redis failed; it stays there and is retried", "err", err)
	}
}

// foldScript sets the live hash aside as the pending batch, named ARGV[1], unless a batch is
// pending already (a fold that failed): it returns the pending batch's name, or nil when there
// is nothing to fold.
var foldScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 1 then return redis.call('HGET', KEYS[2], ARGV[2]) end
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return ARGV[1]`)

// forgetScript deletes the pending batch KEYS[1] if it is still the one named ARGV[2] (field
// ARGV[1]).
var forgetScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('DEL', KEYS[1]) end
return 0`)

// unlockScript releases the fold lock if this replica still holds it.
var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// fold adds the usage counted in Redis to the store, if this replica gets the fold lock.
func (l *Ledger) fold(ctx context.Context) error {
	// The lock is short, so a replica killed while folding holds up the others for moments
	// only; were it to expire mid-fold, the batch's name still keeps the next folder from adding
	// the same batch twice.
	ok, err := l.redis.SetNX(ctx, l.lockKey(), l.token, foldLockTTL(l.cfg.FlushInterval)).Result()
	if err != nil || !ok {
		return err
	}
	defer unlockScript.Run(context.WithoutCancel(ctx), l.redis, []string{l.lockKey()}, l.token)
	live, pending := l.liveKey(), l.pendingKey()
	name, err := foldScript.Run(ctx, l.redis, []string{live, pending}, "redis:"+newToken(), batchField).Text()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return err
	}
	fields, err := l.redis.HGetAll(ctx, pending).Result()
	if err != nil {
		return err
	}
	rows := map[UsageKey]UsageCounts{}
	for f, v := range fields {
		if f == batchField {
			continue
		}
		k, col, ok := parseField(f)
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			l.log.Warn("usage: a field in Redis is not the ledger's; skipped", "field", f)
			continue
		}
		c := rows[k]
		*c.fields()[col] += n
		rows[k] = c
	}
	if err := l.store.AddUsage(ctx, name, rows); err != nil {
		return err
	}
	return forgetScript.Run(ctx, l.redis, []string{pending}, batchField, name).Err()
}

// foldLockTTL is how long the fold lock lives: a few flush intervals, and at least 2s.
func foldLockTTL(flush time.Duration) time.Duration { return max(2*time.Second, 3*flush) }

// parseField reads a hash field written by recordRedis: the row it counts for and the index of
// its column.
func parseField(f string) (UsageKey, int, bool) {
	parts := strings.Split(f, fieldSep)
	if len(parts) != 6 {
		return UsageKey{}, 0, false
	}
	ms, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return UsageKey{}, 0, false
	}
	for i, c := range usageColumns {
		if c == parts[5] {
			return UsageKey{Tenant: parts[1], Key: parts[2], Model: parts[3], Class: parts[4], Start: time.UnixMilli(ms).UTC()}, i, true
		}
	}
	return UsageKey{}, 0, false
}
