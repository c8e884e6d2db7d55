package tenants

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
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
}

func (c *LimitsConfig) setDefaults() {
	if c.RedisPrefix == "" {
		c.RedisPrefix = "usher:limits:"
	}
	if c.RedisTimeout == 0 {
		c.RedisTimeout = 100 * time.Millisecond
	}
}

func (c LimitsConfig) validate() []error {
	if c.RedisTimeout < 0 {
		return []error{errors.New("limits.redis_timeout: must be positive")}
	}
	return nil
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
// x-ratelimit-* headers. A limit of 0 means unlimited; its headers are then left out.
type Quota struct {
	LimitRequests, RemainingRequests int64
	ResetRequests                    time.Duration // until the request bucket is full again
	LimitTokens, RemainingTokens     int64
	ResetTokens                      time.Duration // until the token bucket is full again
}

// Apply sets OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} headers on h.
func (q Quota) Apply(h http.Header) {
	if q.LimitRequests > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.FormatInt(q.LimitRequests, 10))
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(q.RemainingRequests, 10))
		h.Set("x-ratelimit-reset-requests", resetString(q.ResetRequests))
	}
	if q.LimitTokens > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(q.LimitTokens, 10))
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(q.RemainingTokens, 10))
		h.Set("x-ratelimit-reset-tokens", resetString(q.ResetTokens))
	}
}

// resetString formats d as OpenAI does ("20ms", "1s", "6m0s").
func resetString(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Demand is what a request asks of its tenant's limits.
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
}

// Limiter enforces each tenant's tier limits: model allow-list, prompt length, requests per
// minute, tokens per minute and concurrency. Tokens are reserved from the request's estimate at
// admission and reconciled with real usage in Admission.Done, so concurrent requests cannot
// overrun the limit between admission and completion.
//
// Without Redis the counters live in this process (golang.org/x/time/rate buckets). With Redis
// every decision is one atomic Lua script run, shared by all replicas; when Redis fails or is
// slower than RedisTimeout the local buckets decide instead, the fallback is counted, and the
// request never fails because of Redis. Safe for concurrent use.
type Limiter struct {
	cfg    LimitsConfig
	redis  redis.UniversalClient
	logger *slog.Logger
	now    func() time.Time
	// local holds one *localBucket per tenant id; entries are never removed (one per tenant).
	local sync.Map

	redisFallbacks prometheus.Counter
	refusals       *prometheus.CounterVec
}

// localBucket is one tenant's in-process limits.
type localBucket struct {
	mu sync.Mutex // guards everything below, so check-then-take is atomic per tenant
	// tier is the tier the buckets are sized for; a request under another tier resizes them.
	tier        *Tier
	requests    *rate.Limiter
	tokens      *rate.Limiter
	outstanding float64 // tokens reserved by admitted requests that are not done
	inflight    int64
}

// NewLimiter returns a limiter; cfg must have been through SetDefaults.
func NewLimiter(cfg LimitsConfig, opts LimiterOptions) *Limiter {
	cfg.setDefaults()
	l := &Limiter{cfg: cfg, redis: opts.Redis, logger: opts.Logger, now: opts.Now}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	if l.now == nil {
		l.now = time.Now
	}
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

// Admission is an admitted request's hold on its tenant's limits. Call Done exactly once when
// the request ends (further calls do nothing).
type Admission struct {
	l        *Limiter
	tenantID string
	tier     *Tier
	reserved int64
	bucket   *localBucket // nil when Redis admitted the request
	done     atomic.Bool
	// Quota is the tenant's quota right after admission, for the response headers.
	Quota Quota
}

// Reserved is the token estimate held for the request.
func (a *Admission) Reserved() int64 { return a.reserved }

// Admit checks p's tier limits for d and, when they allow it, holds one request, one
// concurrency slot and the token estimate (prompt + max output) until Done. Refusals:
// ErrModelNotAllowed, ErrPromptTooLong, or a *LimitError wrapping ErrRateLimited.
// p.TierSpec must be set (Directory does). Cost without Redis: a map lookup, a mutex and a few
// float operations; with Redis one round trip.
func (l *Limiter) Admit(ctx context.Context, p Principal, d Demand) (*Admission, error) {
	tier := p.TierSpec
	if tier == nil {
		return nil, errors.New("limiter: principal without a tier")
	}
	if !tier.AllowsModel(d.Model) {
		return nil, ErrModelNotAllowed
	}
	if tier.MaxPromptTokens > 0 && d.PromptTokens > tier.MaxPromptTokens {
		return nil, ErrPromptTooLong
	}
	out := d.MaxOutputTokens
	if out <= 0 {
		out = tier.ExpectedOutputTokens
	}
	a := &Admission{l: l, tenantID: p.TenantID, tier: tier, reserved: max(d.PromptTokens, 0) + out}
	var err error
	if l.redis != nil {
		var handled bool
		handled, err = l.admitRedis(ctx, a)
		if !handled {
			err = l.admitLocal(a)
		}
	} else {
		err = l.admitLocal(a)
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
// reservation is charged too, so the next requests wait for it.
func (a *Admission) Done(usedTokens int64) {
	if !a.done.CompareAndSwap(false, true) {
		return
	}
	usedTokens = max(usedTokens, 0)
	if a.bucket == nil {
		a.l.doneRedis(a, usedTokens)
		return
	}
	a.l.doneLocal(a.bucket, a.tier, a.reserved, usedTokens)
}

func perSecond(perMinute int64) rate.Limit {
	if perMinute <= 0 {
		return rate.Inf
	}
	return rate.Limit(float64(perMinute) / 60)
}

func (l *Limiter) bucket(tenantID string, tier *Tier) *localBucket {
	if v, ok := l.local.Load(tenantID); ok {
		return v.(*localBucket)
	}
	b := &localBucket{
		tier:     tier,
		requests: rate.NewLimiter(perSecond(tier.RequestsPerMinute), int(tier.RequestsPerMinute)),
		tokens:   rate.NewLimiter(perSecond(tier.TokensPerMinute), int(tier.TokensPerMinute)),
	}
	v, _ := l.local.LoadOrStore(tenantID, b)
	return v.(*localBucket)
}

// resize adapts b to tier when the tenant's tier changed (b.mu held).
func (b *localBucket) resize(tier *Tier, now time.Time) {
	if b.tier == tier {
		return
	}
	b.tier = tier
	b.requests.SetLimitAt(now, perSecond(tier.RequestsPerMinute))
	b.requests.SetBurstAt(now, int(tier.RequestsPerMinute))
	b.tokens.SetLimitAt(now, perSecond(tier.TokensPerMinute))
	b.tokens.SetBurstAt(now, int(tier.TokensPerMinute))
}

func (l *Limiter) admitLocal(a *Admission) error {
	now := l.now()
	b := l.bucket(a.tenantID, a.tier)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resize(a.tier, now)
	t := a.tier
	if t.MaxConcurrent > 0 && b.inflight >= t.MaxConcurrent {
		return &LimitError{Limit: LimitConcurrency, RetryAfter: time.Second, Quota: b.quota(now)}
	}
	if t.RequestsPerMinute > 0 {
		if have := b.requests.TokensAt(now); have < 1 {
			return &LimitError{Limit: LimitRequests, RetryAfter: refill(1-have, t.RequestsPerMinute), Quota: b.quota(now)}
		}
	}
	if t.TokensPerMinute > 0 {
		if a.reserved > t.TokensPerMinute {
			return &LimitError{Limit: LimitTokens, RetryAfter: time.Minute, Quota: b.quota(now)}
		}
		if have := b.tokens.TokensAt(now) - b.outstanding; float64(a.reserved) > have {
			return &LimitError{Limit: LimitTokens, RetryAfter: refill(float64(a.reserved)-have, t.TokensPerMinute), Quota: b.quota(now)}
		}
	}
	b.requests.AllowN(now, 1)
	b.outstanding += float64(a.reserved)
	b.inflight++
	a.bucket = b
	a.Quota = b.quota(now)
	return nil
}

func (l *Limiter) doneLocal(b *localBucket, tier *Tier, reserved, used int64) {
	now := l.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.outstanding = math.Max(0, b.outstanding-float64(reserved))
	b.inflight--
	if tier.TokensPerMinute > 0 && used > 0 && b.tier == tier {
		// A reservation cannot exceed the burst; larger usage is charged up to one full bucket,
		// which leaves the tenant a minute of debt.
		b.tokens.ReserveN(now, int(min(used, tier.TokensPerMinute)))
	}
}

// quota reads b's state (b.mu held).
func (b *localBucket) quota(now time.Time) Quota {
	t := b.tier
	var q Quota
	if t.RequestsPerMinute > 0 {
		have := math.Max(0, b.requests.TokensAt(now))
		q.LimitRequests, q.RemainingRequests = t.RequestsPerMinute, int64(have)
		q.ResetRequests = refill(float64(t.RequestsPerMinute)-have, t.RequestsPerMinute)
	}
	if t.TokensPerMinute > 0 {
		have := math.Max(0, b.tokens.TokensAt(now)-b.outstanding)
		q.LimitTokens, q.RemainingTokens = t.TokensPerMinute, int64(have)
		q.ResetTokens = refill(float64(t.TokensPerMinute)-have, t.TokensPerMinute)
	}
	return q
}

// refill is how long a bucket refilling perMinute takes to gain need.
func refill(need float64, perMinute int64) time.Duration {
	if need <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(need * float64(time.Minute) / float64(perMinute)))
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

// admitRedis decides with Redis. handled is false when Redis could not decide (the caller
// falls back to the local buckets).
func (l *Limiter) admitRedis(ctx context.Context, a *Admission) (handled bool, err error) {
	t := a.tier
	now := l.now()
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	res, err := limitsScript.Run(ctx, l.redis, []string{l.cfg.RedisPrefix + a.tenantID},
		"admit", now.UnixMilli(), t.RequestsPerMinute, t.TokensPerMinute, t.MaxConcurrent, a.reserved, 0).Int64Slice()
	if err != nil && ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true, ctx.Err() // the request itself was cancelled; nothing to decide
	}
	if err != nil || len(res) != 4 {
		l.redisFallbacks.Inc()
		l.logger.Warn("rate limiter: redis failed, deciding locally", "tenant", a.tenantID, "err", err)
		return false, nil
	}
	q := quotaFrom(t, res[2], res[3])
	switch res[0] {
	case luaAdmitted:
		a.Quota = q
		return true, nil
	case luaRequests:
		return true, &LimitError{Limit: LimitRequests, RetryAfter: time.Duration(res[1]) * time.Millisecond, Quota: q}
	case luaTokens:
		return true, &LimitError{Limit: LimitTokens, RetryAfter: time.Duration(res[1]) * time.Millisecond, Quota: q}
	default:
		return true, &LimitError{Limit: LimitConcurrency, RetryAfter: time.Second, Quota: q}
	}
}

func quotaFrom(t *Tier, remainingRequests, remainingTokens int64) Quota {
	var q Quota
	if t.RequestsPerMinute > 0 {
		q.LimitRequests, q.RemainingRequests = t.RequestsPerMinute, remainingRequests
		q.ResetRequests = refill(float64(t.RequestsPerMinute-remainingRequests), t.RequestsPerMinute)
	}
	if t.TokensPerMinute > 0 {
		q.LimitTokens, q.RemainingTokens = t.TokensPerMinute, remainingTokens
		q.ResetTokens = refill(float64(t.TokensPerMinute-remainingTokens), t.TokensPerMinute)
	}
	return q
}

func (l *Limiter) doneRedis(a *Admission, used int64) {
	t := a.tier
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	err := limitsScript.Run(ctx, l.redis, []string{l.cfg.RedisPrefix + a.tenantID},
		"done", l.now().UnixMilli(), t.RequestsPerMinute, t.TokensPerMinute, t.MaxConcurrent, a.reserved, used).Err()
	if err != nil {
		// The reservation stays held in Redis until the tenant's key expires (limits.lua).
		l.redisFallbacks.Inc()
		l.logger.Warn("rate limiter: redis failed to release a reservation", "tenant", a.tenantID, "err", err)
	}
}
