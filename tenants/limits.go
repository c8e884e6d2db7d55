package tenants

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// LimitsConfig configures the rate limiter (`limits:` in the file). The limits themselves are
// per tier (Tier.RequestsPerMinute, TokensPerMinute, MaxConcurrent).
type LimitsConfig struct {
	// RedisPrefix prefixes the limiter's Redis keys; default "usher:limits:".
	RedisPrefix string `yaml:"redis_prefix"`
	// RedisTimeout bounds one limiter round trip to Redis; past it the local limiter decides.
	// Default 100ms.
	RedisTimeout time.Duration `yaml:"redis_timeout"`
	// LeaseTTL is how long a request's concurrency slot and token reservation held in Redis live
	// unless renewed. A replica renews the leases of its requests in flight every LeaseTTL/3, so
	// a slot whose release was lost (Redis cut, replica killed) comes back within LeaseTTL.
	// Default 5s; at least 1s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
}

func (c *LimitsConfig) setDefaults() {
	if c.RedisPrefix == "" {
		c.RedisPrefix = "usher:limits:"
	}
	if c.RedisTimeout == 0 {
		c.RedisTimeout = 100 * time.Millisecond
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 5 * time.Second
	}
}

func (c LimitsConfig) validate() []error {
	var errs []error
	if c.RedisTimeout < 0 {
		errs = append(errs, errors.New("limits.redis_timeout: must be positive"))
	}
	if c.LeaseTTL != 0 && c.LeaseTTL < time.Second {
		errs = append(errs, errors.New("limits.lease_ttl: must be at least 1s"))
	}
	return errs
}

// Refusals of Admit that the gateway maps to HTTP: ErrModelNotAllowed is 403,
// ErrPromptTooLong 400, ErrRateLimited 429 (the error is then a *LimitError with Retry-After).
var (
	ErrModelNotAllowed = errors.New("model not allowed for this tier")
	ErrPromptTooLong   = errors.New("prompt longer than the tier allows")
	ErrRateLimited     = errors.New("rate limited")
)

// Limit names which limit refused a request.
type Limit string

// The limits of a tier.
const (
	LimitRequests    Limit = "requests_per_minute"
	LimitTokens      Limit = "tokens_per_minute"
	LimitConcurrency Limit = "max_concurrent"
)

// LimitError is the 429 refusal: which limit, how long to wait, and the quota headers.
type LimitError struct {
	Limit      Limit
	RetryAfter time.Duration
	Quota      Quota
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("rate limited by %s, retry after %v", e.Limit, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrRateLimited) true.
func (e *LimitError) Unwrap() error { return ErrRateLimited }

// Quota is the state of a tenant's rate limits after a decision, as OpenAI reports it in the
// x-ratelimit-* headers (the gateway writes them). A limit of 0 means unlimited. Remaining
// values are never negative and never above their limit.
type Quota struct {
	LimitRequests, RemainingRequests int64
	ResetRequests                    time.Duration // until the request bucket is full again
	LimitTokens, RemainingTokens     int64
	ResetTokens                      time.Duration // until the token bucket is full again
}

// Demand is what a request asks of its tenant's limits. The numbers come from the client: any
// int64 is accepted, negative ones count as 0 and sums saturate, so no value wraps around.
type Demand struct {
	Model        string
	PromptTokens int64
	// MaxOutputTokens is the request's max_tokens; 0 takes the tier's ExpectedOutputTokens.
	MaxOutputTokens int64
}

// LimiterOptions are the dependencies of a Limiter; every field is optional.
type LimiterOptions struct {
	// Redis, when set, shares the counters between replicas.
	Redis      redis.UniversalClient
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Now        func() time.Time
	// ReplicaID names this replica in Redis (lease ids, the replica count); default random.
	ReplicaID string
}

// replicaWindow is how long a replica that stopped talking to Redis still counts as one of the
// replicas sharing the limits.
const replicaWindow = time.Minute

// Limiter enforces each tenant's tier limits: model allow-list, prompt length, requests per
// minute, tokens per minute and concurrency. Tokens are reserved from the request's estimate at
// admission and reconciled with real usage in Hold.Done, so concurrent requests cannot
// overrun the limit between admission and completion.
//
// Counters are kept per tenant and tier. A credential that lowers its tenant's tier (a JWT tier
// claim, a key minted at a lower tier; Principal.TenantTier) is held to both: its tier's limits
// on counters of its own, which the tenant's traffic at its full tier does not use up, and the
// tenant's limits on the tenant's counters, which every credential of the tenant shares. So
// lowered keys never add to what the tenant may do.
//
// Without Redis the counters live in this process (golang.org/x/time/rate buckets). With Redis
// every decision is one atomic Lua script run (limits.lua), shared by all replicas, and each
// request in flight holds a lease that expires on its own unless its replica renews it (see
// LimitsConfig.LeaseTTL): a release lost to a Redis cut never leaks a slot.
//
// Redis outages: when Redis fails or is slower than RedisTimeout, the local buckets decide, the
// fallback is counted, and no request fails because of Redis. Each replica then enforces its
// share of every limit: the limit divided by the number of replicas it last saw admitting
// through Redis within the last minute (rounded up, itself included), so the fleet as a whole
// stays near the limit instead of letting each replica grant all of it. Requests admitted
// locally are not known to Redis when it comes back; the error is bounded by the outage.
//
// Safe for concurrent use. A timer renews leases while requests are in flight and stops when
// none is.
type Limiter struct {
	cfg       LimitsConfig
	redis     redis.UniversalClient
	logger    *slog.Logger
	now       func() time.Time
	replicaID string
	leaseSeq  atomic.Uint64
	// replicas is how many replicas shared Redis when last read (at least 1); lastBeat is the
	// unix millisecond this replica last announced itself.
	replicas, lastBeat atomic.Int64
	// local holds one *localBucket per counterKey; entries are never removed.
	local sync.Map

	leaseMu sync.Mutex // guards live and renewing
	// live are the admissions holding a Redis lease; renewing is true while a renewal is
	// scheduled.
	live     map[*Hold]struct{}
	renewing bool

	redisFallbacks prometheus.Counter
	refusals       *prometheus.CounterVec
}

// localBucket is one tenant's in-process limits at one tier.
type localBucket struct {
	mu sync.Mutex // guards everything below, so check-then-take is atomic per tenant
	// tier and share are what the buckets are sized for: the tier's limits divided by share.
	// A request under another version of the tier, or another share, resizes them.
	tier        *Tier
	share       int64
	lim         shareLimits
	requests    *rate.Limiter
	tokens      *rate.Limiter
	outstanding float64 // tokens reserved by admitted requests that are not done
	inflight    int64
}

// shareLimits are a tier's limits as one of share replicas enforces them.
type shareLimits struct{ rpm, tpm, maxc int64 }

func limitsShare(t *Tier, share int64) shareLimits {
	part := func(v int64) int64 {
		if v <= 0 || share <= 1 {
			return v
		}
		if v%share == 0 {
			return v / share
		}
		return v/share + 1
	}
	return shareLimits{rpm: part(t.RequestsPerMinute), tpm: part(t.TokensPerMinute), maxc: part(t.MaxConcurrent)}
}

// NewLimiter returns a limiter; cfg must have been through SetDefaults.
func NewLimiter(cfg LimitsConfig, opts LimiterOptions) *Limiter {
	cfg.setDefaults()
	cfg.LeaseTTL = max(cfg.LeaseTTL, time.Second) // Validate refuses less; never renew in a busy loop
	l := &Limiter{cfg: cfg, redis: opts.Redis, logger: opts.Logger, now: opts.Now, replicaID: opts.ReplicaID,
		live: map[*Hold]struct{}{}}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.replicaID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		l.replicaID = hex.EncodeToString(b[:])
	}
	l.replicas.Store(1)
	l.redisFallbacks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "usher_tenants_limiter_redis_fallbacks_total",
		Help: "Limiter decisions taken locally because Redis failed or was too slow.",
	})
	l.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_tenants_limiter_refusals_total",
		Help: "Requests refused by a tenant limit, by limit.",
	}, []string{"limit"})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(l.redisFallbacks, l.refusals)
	}
	return l
}

// Hold is an admitted request's hold on its tenant's limits. Call Done exactly once when
// the request ends (further calls do nothing).
type Hold struct {
	l        *Limiter
	tenantID string
	tier     *Tier
	// counters names the counters the request holds.
	counters counterKey
	reserved int64
	bucket   *localBucket // set when the local buckets admitted the request
	lease    string       // the Redis lease held; "" for none
	// tenant is the hold on the tenant's own counters of a request that runs at a lower tier;
	// nil otherwise. Done and cancel end it with this one.
	tenant *Hold
	done   atomic.Bool
	// Quota is the tenant's quota right after admission, for the response headers.
	Quota Quota
}

// Reserved is the token estimate held for the request (saturated at math.MaxInt64).
func (a *Hold) Reserved() int64 { return a.reserved }

// Admit checks p's tier limits for d and, when they allow it, holds one request, one
// concurrency slot and the token estimate (prompt + max output) until Done; a credential that
// runs below its tenant's tier (p.TenantTier) holds them on its tier's counters and on its
// tenant's, and is refused when either refuses. Refusals: ErrModelNotAllowed,
// ErrPromptTooLong, or a *LimitError wrapping ErrRateLimited. p.TierSpec must be set
// (Directory does). Cost without Redis: a map lookup, a mutex and a few float operations per
// tier; with Redis one round trip per tier (two, once a second, to count the replicas). A tier
// without rate, token or concurrency limits costs neither.
func (l *Limiter) Admit(ctx context.Context, p Principal, d Demand) (*Hold, error) {
	tier := p.TierSpec
	if tier == nil {
		return nil, errors.New("limiter: principal without a tier")
	}
	tiers := []*Tier{tier}
	if p.TenantTier != nil && p.TenantTier != tier {
		tiers = append(tiers, p.TenantTier)
	}
	for _, t := range tiers {
		if !t.AllowsModel(d.Model) {
			return nil, ErrModelNotAllowed
		}
		if t.MaxPromptTokens > 0 && d.PromptTokens > t.MaxPromptTokens {
			return nil, ErrPromptTooLong
		}
	}
	out := d.MaxOutputTokens
	if out <= 0 {
		out = tier.ExpectedOutputTokens
	}
	reserved := addSat(max(d.PromptTokens, 0), max(out, 0))
	var tenant *Hold
	if len(tiers) > 1 {
		var err error
		if tenant, err = l.admitAt(ctx, p.TenantID, p.TenantTier, reserved); err != nil {
			return nil, err
		}
	}
	a, err := l.admitAt(ctx, p.TenantID, tier, reserved)
	if err != nil {
		if tenant != nil {
			tenant.cancel()
		}
		return nil, err
	}
	a.tenant = tenant
	return a, nil
}

// admitAt holds one request of tenant on its counters at tier.
func (l *Limiter) admitAt(ctx context.Context, tenantID string, tier *Tier, reserved int64) (*Hold, error) {
	a := &Hold{l: l, tenantID: tenantID, tier: tier, counters: counterKey{tenantID, tier.Name}, reserved: reserved}
	if tier.RequestsPerMinute == 0 && tier.TokensPerMinute == 0 && tier.MaxConcurrent == 0 {
		a.done.Store(true) // nothing to count, nothing to release
		return a, nil
	}
	var err error
	if l.redis != nil {
		var handled bool
		handled, err = l.admitRedis(ctx, a)
		if !handled {
			err = l.admitLocal(a, l.replicas.Load())
		}
	} else {
		err = l.admitLocal(a, 1)
	}
	if err != nil {
		var le *LimitError
		if errors.As(err, &le) {
			l.refusals.WithLabelValues(string(le.Limit)).Inc()
		}
		return nil, err
	}
	return a, nil
}

// Done releases the request's concurrency slot and reservation and charges usedTokens (prompt
// plus completion as the worker reported them; 0 when nothing was generated). Usage above the
// reservation is charged too, up to one full bucket, so the next requests wait for it.
func (a *Hold) Done(usedTokens int64) {
	if a.tenant != nil {
		a.tenant.Done(usedTokens)
	}
	if !a.done.CompareAndSwap(false, true) {
		return
	}
	usedTokens = max(usedTokens, 0)
	if a.bucket == nil {
		a.l.doneRedis(a, usedTokens, false)
		return
	}
	a.l.doneLocal(a, usedTokens, false)
}

// cancel gives back everything the hold took, its request included, as if it had never been
// admitted: the other tier refused the request.
func (a *Hold) cancel() {
	if !a.done.CompareAndSwap(false, true) {
		return
	}
	if a.bucket == nil {
		a.l.doneRedis(a, 0, true)
		return
	}
	a.l.doneLocal(a, 0, true)
}

func perSecond(perMinute int64) rate.Limit {
	if perMinute <= 0 {
		return rate.Inf
	}
	return rate.Limit(float64(perMinute) / 60)
}

// counterKey names one tenant's counters at one tier.
type counterKey struct{ tenant, tier string }

func (l *Limiter) bucket(counters counterKey) *localBucket {
	if v, ok := l.local.Load(counters); ok {
		return v.(*localBucket)
	}
	v, _ := l.local.LoadOrStore(counters, &localBucket{})
	return v.(*localBucket)
}

// resize adapts b to tier and share when either changed (b.mu held). A new bucket starts full.
func (b *localBucket) resize(tier *Tier, share int64, now time.Time) {
	if b.tier == tier && b.share == share {
		return
	}
	b.lim = limitsShare(tier, share)
	if b.tier == nil {
		b.requests = rate.NewLimiter(perSecond(b.lim.rpm), int(b.lim.rpm))
		b.tokens = rate.NewLimiter(perSecond(b.lim.tpm), int(b.lim.tpm))
	} else {
		b.requests.SetLimitAt(now, perSecond(b.lim.rpm))
		b.requests.SetBurstAt(now, int(b.lim.rpm))
		b.tokens.SetLimitAt(now, perSecond(b.lim.tpm))
		b.tokens.SetBurstAt(now, int(b.lim.tpm))
	}
	b.tier, b.share = tier, share
}

func (l *Limiter) admitLocal(a *Hold, share int64) error {
	now := l.now()
	b := l.bucket(a.counters)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resize(a.tier, share, now)
	lim := b.lim
	if lim.maxc > 0 && b.inflight >= lim.maxc {
		return &LimitError{Limit: LimitConcurrency, RetryAfter: time.Second, Quota: b.quota(now)}
	}
	if lim.rpm > 0 {
		if have := b.requests.TokensAt(now); have < 1 {
			return &LimitError{Limit: LimitRequests, RetryAfter: refill(1-have, lim.rpm), Quota: b.quota(now)}
		}
	}
	if lim.tpm > 0 {
		if a.reserved > lim.tpm {
			return &LimitError{Limit: LimitTokens, RetryAfter: time.Minute, Quota: b.quota(now)}
		}
		if have := b.tokens.TokensAt(now) - b.outstanding; float64(a.reserved) > have {
			return &LimitError{Limit: LimitTokens, RetryAfter: refill(float64(a.reserved)-have, lim.tpm), Quota: b.quota(now)}
		}
	}
	b.requests.AllowN(now, 1)
	b.outstanding += float64(a.reserved)
	b.inflight++
	a.bucket = b
	a.Quota = b.quota(now)
	return nil
}

// doneLocal ends a's hold on its local bucket: it charges used tokens, or, cancelled, gives
// back the request token too.
func (l *Limiter) doneLocal(a *Hold, used int64, cancelled bool) {
	now := l.now()
	b := a.bucket
	b.mu.Lock()
	defer b.mu.Unlock()
	b.outstanding = math.Max(0, b.outstanding-float64(a.reserved))
	b.inflight--
	if cancelled {
		// Give the request token back, never past a full bucket. (A Reservation's CancelAt
		// gives nothing back once its time to act has passed, which is at once.)
		if b.lim.rpm > 0 && b.requests.TokensAt(now) <= float64(b.lim.rpm)-1 {
			b.requests.AllowN(now, -1)
		}
		return
	}
	if b.lim.tpm > 0 && used > 0 && b.tier == a.tier {
		// A reservation cannot exceed the burst; larger usage is charged up to one full bucket,
		// which leaves the tenant a minute of debt.
		b.tokens.ReserveN(now, int(min(used, b.lim.tpm)))
	}
}

// quota reads b's state (b.mu held).
func (b *localBucket) quota(now time.Time) Quota {
	lim := b.lim
	var q Quota
	if lim.rpm > 0 {
		have := math.Max(0, b.requests.TokensAt(now))
		q.LimitRequests, q.RemainingRequests = lim.rpm, min(toInt64(have), lim.rpm)
		q.ResetRequests = refill(float64(lim.rpm)-have, lim.rpm)
	}
	if lim.tpm > 0 {
		have := math.Max(0, b.tokens.TokensAt(now)-b.outstanding)
		q.LimitTokens, q.RemainingTokens = lim.tpm, min(toInt64(have), lim.tpm)
		q.ResetTokens = refill(float64(lim.tpm)-have, lim.tpm)
	}
	return q
}

// refill is how long a bucket refilling perMinute takes to gain need (at most a minute per
// bucket's worth, so the duration never overflows).
func refill(need float64, perMinute int64) time.Duration {
	if need <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(math.Min(need/float64(perMinute), 2) * float64(time.Minute)))
}

//go:embed limits.lua
var limitsLua string

var limitsScript = redis.NewScript(limitsLua)

// Result codes of limits.lua.
const (
	luaAdmitted = 0
	luaRequests = 1
	luaTokens   = 2
	luaConcur   = 3
)

// redisKeys are the bucket hash and the lease set of one tenant at one tier. The hash tag keeps
// both in one Redis Cluster slot.
func (l *Limiter) redisKeys(counters counterKey) []string {
	bucket := l.cfg.RedisPrefix + "{" + counters.tenant + "/" + counters.tier + "}"
	return []string{bucket, bucket + ":leases"}
}

// admitRedis decides with Redis. handled is false when Redis could not decide (the caller
// falls back to the local buckets).
func (l *Limiter) admitRedis(ctx context.Context, a *Hold) (handled bool, err error) {
	t := a.tier
	now := l.now()
	reserved := a.reserved
	if t.TokensPerMinute == 0 {
		reserved = 0 // nothing to hold; keeps huge estimates out of the script's doubles
	}
	if t.MaxConcurrent > 0 || t.TokensPerMinute > 0 {
		a.lease = l.replicaID + "." + strconv.FormatUint(l.leaseSeq.Add(1), 36)
	}
	rctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	res, err := limitsScript.Run(rctx, l.redis, l.redisKeys(a.counters), "admit", now.UnixMilli(),
		t.RequestsPerMinute, t.TokensPerMinute, t.MaxConcurrent, l.cfg.LeaseTTL.Milliseconds(), a.lease, reserved).Int64Slice()
	if err != nil && ctx.Err() != nil {
		return true, ctx.Err() // the request itself was cancelled; nothing to decide
	}
	if err != nil || len(res) != 4 {
		a.lease = ""
		l.redisFallbacks.Inc()
		l.logger.Warn("rate limiter: redis failed, deciding locally", "tenant", a.tenantID, "err", err)
		return false, nil
	}
	l.heartbeat(ctx, now)
	q := quotaFrom(t, res[2], res[3])
	switch res[0] {
	case luaAdmitted:
		a.Quota = q
		l.hold(a)
		return true, nil
	case luaRequests:
		return true, &LimitError{Limit: LimitRequests, RetryAfter: time.Duration(res[1]) * time.Millisecond, Quota: q}
	case luaTokens:
		return true, &LimitError{Limit: LimitTokens, RetryAfter: time.Duration(res[1]) * time.Millisecond, Quota: q}
	default:
		return true, &LimitError{Limit: LimitConcurrency, RetryAfter: time.Second, Quota: q}
	}
}

// heartbeat announces this replica in Redis and reads how many replicas share it, at most once a
// second; the count sizes each replica's share of the limits during an outage.
func (l *Limiter) heartbeat(ctx context.Context, now time.Time) {
	last := l.lastBeat.Load()
	if now.UnixMilli()-last < 1000 || !l.lastBeat.CompareAndSwap(last, now.UnixMilli()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.RedisTimeout)
	defer cancel()
	key := l.cfg.RedisPrefix + "replicas"
	var n *redis.IntCmd
	_, err := l.redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, key, redis.Z{Score: float64(now.UnixMilli()), Member: l.replicaID})
		p.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(now.Add(-replicaWindow).UnixMilli(), 10))
		p.PExpire(ctx, key, 2*replicaWindow)
		n = p.ZCard(ctx, key)
		return nil
	})
	if err != nil {
		l.logger.Warn("rate limiter: count replicas in redis", "err", err)
		return
	}
	l.replicas.Store(max(n.Val(), 1))
}

// hold registers a's lease for renewal and starts the renewal timer when it is not running.
func (l *Limiter) hold(a *Hold) {
	if a.lease == "" {
		return
	}
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	l.live[a] = struct{}{}
	if !l.renewing {
		l.renewing = true
		time.AfterFunc(l.cfg.LeaseTTL/3, l.renew)
	}
}

// maxRenewBatch bounds the lease ids of one renewal round trip.
const maxRenewBatch = 256

// renew extends every live lease by LeaseTTL and schedules itself again while any is live.
func (l *Limiter) renew() {
	l.leaseMu.Lock()
	byCounters := map[counterKey][]any{}
	tiers := map[counterKey]*Tier{}
	for a := range l.live {
		byCounters[a.counters] = append(byCounters[a.counters], a.lease)
		tiers[a.counters] = a.tier
	}
	l.leaseMu.Unlock()
	now := l.now()
	ctx := context.Background()
	for counters, ids := range byCounters {
		for len(ids) > 0 {
			batch := ids[:min(len(ids), maxRenewBatch)]
			ids = ids[len(batch):]
			t := tiers[counters]
			args := append([]any{"renew", now.UnixMilli(), t.RequestsPerMinute, t.TokensPerMinute, t.MaxConcurrent,
				l.cfg.LeaseTTL.Milliseconds()}, batch...)
			rctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
			err := limitsScript.Run(rctx, l.redis, l.redisKeys(counters), args...).Err()
			cancel()
			if err != nil {
				l.logger.Warn("rate limiter: renew leases in redis", "leases", len(batch), "err", err)
			}
		}
	}
	if len(byCounters) > 0 {
		l.heartbeat(ctx, now)
	}
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	if len(l.live) == 0 {
		l.renewing = false
		return
	}
	time.AfterFunc(l.cfg.LeaseTTL/3, l.renew)
}

func quotaFrom(t *Tier, remainingRequests, remainingTokens int64) Quota {
	var q Quota
	if t.RequestsPerMinute > 0 {
		q.LimitRequests, q.RemainingRequests = t.RequestsPerMinute, min(max(remainingRequests, 0), t.RequestsPerMinute)
		q.ResetRequests = refill(float64(t.RequestsPerMinute-q.RemainingRequests), t.RequestsPerMinute)
	}
	if t.TokensPerMinute > 0 {
		q.LimitTokens, q.RemainingTokens = t.TokensPerMinute, min(max(remainingTokens, 0), t.TokensPerMinute)
		q.ResetTokens = refill(float64(t.TokensPerMinute-q.RemainingTokens), t.TokensPerMinute)
	}
	return q
}

// doneRedis ends a's hold in Redis: it charges used tokens, or, cancelled, gives back the
// request token too.
func (l *Limiter) doneRedis(a *Hold, used int64, cancelled bool) {
	t := a.tier
	if a.lease != "" {
		l.leaseMu.Lock()
		delete(l.live, a)
		l.leaseMu.Unlock()
	}
	if a.lease == "" && t.TokensPerMinute == 0 && !(cancelled && t.RequestsPerMinute > 0) {
		return // nothing held, nothing to charge or give back
	}
	op := "done"
	if cancelled {
		op = "cancel"
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	err := limitsScript.Run(ctx, l.redis, l.redisKeys(a.counters), op, l.now().UnixMilli(),
		t.RequestsPerMinute, t.TokensPerMinute, t.MaxConcurrent, l.cfg.LeaseTTL.Milliseconds(), a.lease, min(used, t.TokensPerMinute)).Err()
	if err != nil {
		// The lease is no longer renewed: it expires within LeaseTTL and frees its slot then.
		l.redisFallbacks.Inc()
		l.logger.Warn("rate limiter: redis failed to release a lease; it expires on its own", "tenant", a.tenantID, "err", err)
	}
}
