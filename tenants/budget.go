package tenants

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// ErrBudgetExceeded is the refusal of a request whose tenant spent its budget for the day or
// month (429 budget_exceeded); the error is then a *BudgetError.
var ErrBudgetExceeded = errors.New("budget exceeded")

// BudgetError is the refusal of a spent budget: which cap, and when the period ends.
type BudgetError struct {
	Cap   string // "tokens_per_day", "tokens_per_month", "requests_per_day" or "requests_per_month"
	Key   string // the key whose own budget is spent; "": the tenant's
	Limit int64
	// Reset is when the period ends and the budget is whole again.
	Reset time.Time
	// RetryAfter is the time from the refusal to Reset.
	RetryAfter time.Duration
}

func (e *BudgetError) Error() string {
	whose := "the tenant's"
	if e.Key != "" {
		whose = "this key's"
	}
	return fmt.Sprintf("%s budget of %d %s is spent; it resets at %s", whose, e.Limit, capWords[e.Cap],
		e.Reset.UTC().Format(time.RFC3339))
}

// Unwrap makes errors.Is(err, ErrBudgetExceeded) true.
func (e *BudgetError) Unwrap() error { return ErrBudgetExceeded }

var capWords = map[string]string{
	"tokens_per_day": "tokens per day", "tokens_per_month": "tokens per month",
	"requests_per_day": "requests per day", "requests_per_month": "requests per month",
}

// BudgetsOptions are the dependencies of Budgets; every field is optional.
type BudgetsOptions struct {
	// Redis, when set, holds the spending of every tenant, shared by all replicas.
	Redis redis.UniversalClient
	// Store seeds a period's spending from the usage ledger when neither Redis nor this
	// replica holds it (a replica or Redis restarted), and takes the soft threshold's audit
	// entries.
	Store      *Store
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Now        func() time.Time
	// RedisPrefix prefixes the Redis keys; default "usher:budget:".
	RedisPrefix string
	// RedisTimeout bounds one round trip; past it this replica's own counts decide. Default
	// 100ms.
	RedisTimeout time.Duration
	// Refresh is how often Run reads the budgets set through the admin API; default 2s.
	Refresh time.Duration
}

// Budgets enforces the tiers' budgets (Tier.Budget): tokens and requests per tenant per UTC day
// and month. Check refuses a request once a cap is reached; Spend.Done adds what the request
// was served. With Redis the spending is counted there, so every replica refuses within one
// request of the cap (requests already admitted when it is reached still finish); without
// Redis each replica counts its own. Either way a period's count starts from the usage ledger
// when it is not held yet, so a restart does not hand out a new budget.
//
// Crossing SoftThreshold of a cap is reported once per period: the metric
// usher_budget_soft_threshold_total and an audit entry "budget.soft_threshold".
//
// Safe for concurrent use.
type Budgets struct {
	opts BudgetsOptions
	log  *slog.Logger

	mu sync.Mutex
	// local counts each tenant's spending per period when there is no Redis, or when Redis
	// fails (guarded by mu); soft marks the thresholds reported without Redis.
	local map[periodKey]*spending
	soft  map[softKey]bool

	// overrides are the budgets set through the admin API, by tenant and key (Run refreshes
	// them from the store).
	overrides atomic.Pointer[map[[2]string]BudgetOverride]

	softCrossed    *prometheus.CounterVec
	redisFallbacks prometheus.Counter
}

// periodKey names the spending of one tenant, or of one of its keys, in one period.
type periodKey struct {
	tenant string
	key    string // "": the tenant's own spending
	period string // PeriodDay or "month"
	start  time.Time
}

type spending struct{ tokens, requests int64 }

// softKey names one cap's soft threshold in one period.
type softKey struct {
	p   periodKey
	cap string
}

const periodMonth = "month"

// NewBudgets returns the budget enforcer.
func NewBudgets(opts BudgetsOptions) *Budgets {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RedisPrefix == "" {
		opts.RedisPrefix = "usher:budget:"
	}
	if opts.RedisTimeout == 0 {
		opts.RedisTimeout = 100 * time.Millisecond
	}
	if opts.Refresh == 0 {
		opts.Refresh = 2 * time.Second
	}
	b := &Budgets{opts: opts, log: opts.Logger, local: map[periodKey]*spending{}, soft: map[softKey]bool{}}
	b.overrides.Store(&map[[2]string]BudgetOverride{})
	b.softCrossed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_budget_soft_threshold_total",
		Help: "Budgets whose soft threshold a tenant crossed, once per period, by cap.",
	}, []string{"cap"})
	b.redisFallbacks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "usher_budget_redis_fallbacks_total",
		Help: "Budget decisions taken on this replica's own counts because Redis failed or was too slow.",
	})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(b.softCrossed, b.redisFallbacks)
	}
	return b
}

// Spend is an admitted request's place in its budgets. Call Done once when it ends.
type Spend struct {
	b      *Budgets
	scopes []budgetScope
}

// budgetScope is one budget a request counts against: its tenant's, or its key's.
type budgetScope struct {
	limits  BudgetOverride // the caps (TenantID, KeyID name the scope)
	soft    float64
	periods [2]periodKey // the day and the month
	ends    [2]time.Time
}

// budgetCap is one cap of a scope in one of its periods.
type budgetCap struct {
	name  string // "tokens_per_day", ...
	limit int64
	count func(spending) int64
	at    int // index of the period: 0 day, 1 month
}

func (sc budgetScope) caps() []budgetCap {
	tokens := func(s spending) int64 { return s.tokens }
	requests := func(s spending) int64 { return s.requests }
	return []budgetCap{
		{"tokens_per_day", sc.limits.TokensPerDay, tokens, 0},
		{"requests_per_day", sc.limits.RequestsPerDay, requests, 0},
		{"tokens_per_month", sc.limits.TokensPerMonth, tokens, 1},
		{"requests_per_month", sc.limits.RequestsPerMonth, requests, 1},
	}
}

// scopes returns the budgets a request of p counts against at now: its tenant's (the override
// set through the admin API, else its tier's) and its key's, when one is set.
func (b *Budgets) scopes(p Principal, now time.Time) []budgetScope {
	overrides := *b.overrides.Load()
	d := dayOf(now)
	m := time.Date(d.Year(), d.Month(), 1, 0, 0, 0, 0, time.UTC)
	scope := func(caps BudgetOverride, soft float64) budgetScope {
		return budgetScope{limits: caps, soft: soft,
			periods: [2]periodKey{{caps.TenantID, caps.KeyID, PeriodDay, d}, {caps.TenantID, caps.KeyID, periodMonth, m}},
			ends:    [2]time.Time{d.AddDate(0, 0, 1), m.AddDate(0, 1, 0)}}
	}
	soft := 0.8
	tenant := BudgetOverride{TenantID: p.TenantID}
	if t := p.TierSpec; t != nil {
		soft = t.Budget.SoftThreshold
		tenant.TokensPerDay, tenant.TokensPerMonth = t.Budget.TokensPerDay, t.Budget.TokensPerMonth
		tenant.RequestsPerDay, tenant.RequestsPerMonth = t.Budget.RequestsPerDay, t.Budget.RequestsPerMonth
	}
	if o, ok := overrides[[2]string{p.TenantID, ""}]; ok {
		tenant = o
	}
	var out []budgetScope
	if tenant.capped() {
		out = append(out, scope(tenant, soft))
	}
	if o, ok := overrides[[2]string{p.TenantID, p.KeyID}]; ok && p.KeyID != "" && o.capped() {
		out = append(out, scope(o, soft))
	}
	return out
}

// Check admits a request of p or refuses it with a *BudgetError. A request no budget applies
// to costs a map lookup and returns nil, nil; otherwise one Redis round trip (with Redis), or a
// map lookup (without), and once per tenant (or key) and period a query of the usage ledger.
func (b *Budgets) Check(ctx context.Context, p Principal) (*Spend, error) {
	now := b.opts.Now()
	scopes := b.scopes(p, now)
	if len(scopes) == 0 {
		return nil, nil
	}
	var ps []periodKey
	for _, sc := range scopes {
		ps = append(ps, sc.periods[:]...)
	}
	spent := b.spent(ctx, ps)
	for i, sc := range scopes {
		for _, c := range sc.caps() {
			if c.limit > 0 && c.count(spent[2*i+c.at]) >= c.limit {
				end := sc.ends[c.at]
				return nil, &BudgetError{Cap: c.name, Key: sc.limits.KeyID, Limit: c.limit, Reset: end, RetryAfter: end.Sub(now)}
			}
		}
	}
	return &Spend{b: b, scopes: scopes}, nil
}

// Done adds the request's tokens (prompt plus completion, as served) and the request itself to
// the periods it was admitted in. Nil-safe.
func (s *Spend) Done(tokens int64) {
	if s == nil {
		return
	}
	tokens = max(tokens, 0)
	var ps []periodKey
	for _, sc := range s.scopes {
		ps = append(ps, sc.periods[:]...)
	}
	before, after := s.b.add(ps, tokens)
	for i, sc := range s.scopes {
		for _, c := range sc.caps() {
			j := 2*i + c.at
			threshold := toInt64(float64(c.limit) * sc.soft)
			if c.limit > 0 && c.count(before[j]) < threshold && c.count(after[j]) >= threshold {
				s.b.crossed(ps[j], c.name, c.limit, c.count(after[j]))
			}
		}
	}
}

// Run reads the budgets set through the admin API from the store now and every Refresh until
// ctx ends; without a store it returns at once. A failed read keeps the last one.
func (b *Budgets) Run(ctx context.Context) {
	if b.opts.Store == nil {
		return
	}
	t := time.NewTicker(b.opts.Refresh)
	defer t.Stop()
	for {
		b.Reload(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Reload reads the budgets set through the admin API from the store.
func (b *Budgets) Reload(ctx context.Context) {
	list, err := b.opts.Store.BudgetOverrides(ctx)
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("budget: reading the overrides failed; the last ones stay", "err", err)
		}
		return
	}
	m := make(map[[2]string]BudgetOverride, len(list))
	for _, o := range list {
		m[[2]string{o.TenantID, o.KeyID}] = o
	}
	b.overrides.Store(&m)
}

func (b *Budgets) redisKey(p periodKey) string {
	scope := p.tenant
	if p.key != "" {
		scope += "/" + p.key
	}
	return b.opts.RedisPrefix + scope + ":" + p.period + ":" + strconv.FormatInt(p.start.UnixMilli(), 10)
}

// keep is how long a period's counts outlive its start in Redis: a month and a day.
const keep = 32 * 24 * time.Hour

// seedScript sets a period's counts unless they exist, and returns them.
var seedScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 't', ARGV[1], 'r', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return redis.call('HMGET', KEYS[1], 't', 'r')`)

// spent returns the spending of each period, from Redis or this replica's counts.
func (b *Budgets) spent(ctx context.Context, ps []periodKey) []spending {
	out := make([]spending, len(ps))
	if b.opts.Redis != nil {
		if err := b.spentRedis(ctx, ps, out); err == nil {
			return out
		}
		b.redisFallbacks.Inc()
	}
	for i, p := range ps {
		out[i] = *b.localSpending(ctx, p)
	}
	return out
}

func (b *Budgets) spentRedis(ctx context.Context, ps []periodKey, out []spending) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.RedisTimeout)
	defer cancel()
	cmds := make([]*redis.SliceCmd, len(ps))
	_, err := b.opts.Redis.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, p := range ps {
			cmds[i] = pl.HMGet(ctx, b.redisKey(p), "t", "r")
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, p := range ps {
		vals := cmds[i].Val()
		if vals[0] == nil {
			seed := b.ledgerSpending(ctx, p)
			res, err := seedScript.Run(ctx, b.opts.Redis, []string{b.redisKey(p)}, seed.tokens, seed.requests, keep.Milliseconds()).Slice()
			if err != nil {
				return err
			}
			vals = res
		}
		out[i].tokens, out[i].requests = toCount(vals[0]), toCount(vals[1])
	}
	return nil
}

func toCount(v any) int64 {
	switch v := v.(type) {
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	case int64:
		return v
	}
	return 0
}

// localSpending returns this replica's counts of p, seeded from the ledger the first time.
func (b *Budgets) localSpending(ctx context.Context, p periodKey) *spending {
	b.mu.Lock()
	s, ok := b.local[p]
	b.mu.Unlock()
	if ok {
		return s
	}
	seed := b.ledgerSpending(ctx, p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.local[p]; ok {
		return s
	}
	b.local[p] = &seed
	for k := range b.local { // periods over are forgotten
		if k.start.Before(p.start) && k.period == p.period {
			delete(b.local, k)
		}
	}
	return &seed
}

// ledgerSpending is what the usage ledger holds of p (0 without a store or when it fails).
func (b *Budgets) ledgerSpending(ctx context.Context, p periodKey) spending {
	if b.opts.Store == nil {
		return spending{}
	}
	rows, err := b.opts.Store.Usage(ctx, UsageQuery{Tenant: p.tenant, Key: p.key, From: p.start})
	if err != nil {
		b.log.Warn("budget: reading the usage ledger failed; the period counts from 0", "tenant", p.tenant, "err", err)
		return spending{}
	}
	var s spending
	for _, r := range rows {
		if r.Period == PeriodHour || r.Period == PeriodDay && !r.Start.Before(p.start) {
			s.tokens = addSat(s.tokens, addSat(r.PromptTokens, r.CompletionTokens))
			s.requests = addSat(s.requests, r.Requests-r.RefusedLimit-r.RefusedBudget-r.QueueFull-r.Deadline)
		}
	}
	return s
}

// add counts tokens and one request in each period and returns the counts before and after.
func (b *Budgets) add(ps []periodKey, tokens int64) (before, after []spending) {
	before, after = make([]spending, len(ps)), make([]spending, len(ps))
	if b.opts.Redis != nil {
		if err := b.addRedis(ps, tokens, after); err == nil {
			for i := range after {
				before[i] = spending{after[i].tokens - tokens, after[i].requests - 1}
			}
			return before, after
		}
		b.redisFallbacks.Inc()
	}
	ctx := context.Background()
	for i, p := range ps {
		s := b.localSpending(ctx, p)
		b.mu.Lock()
		before[i] = *s
		s.tokens, s.requests = addSat(s.tokens, tokens), addSat(s.requests, 1)
		after[i] = *s
		b.mu.Unlock()
	}
	return before, after
}

func (b *Budgets) addRedis(ps []periodKey, tokens int64, after []spending) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.RedisTimeout)
	defer cancel()
	cmds := make([]*redis.IntCmd, 2*len(ps))
	_, err := b.opts.Redis.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		for i, p := range ps {
			k := b.redisKey(p)
			cmds[2*i] = pl.HIncrBy(ctx, k, "t", tokens)
			cmds[2*i+1] = pl.HIncrBy(ctx, k, "r", 1)
			pl.PExpire(ctx, k, keep)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range ps {
		after[i] = spending{cmds[2*i].Val(), cmds[2*i+1].Val()}
	}
	return nil
}

// crossed reports a soft threshold crossed, once per tenant, period and cap across replicas
// (with Redis) or on this replica (without).
func (b *Budgets) crossed(p periodKey, cap string, limit, spent int64) {
	mark := softKey{p, cap}
	first, decided := false, false
	if b.opts.Redis != nil {
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.RedisTimeout)
		ok, err := b.opts.Redis.SetNX(ctx, b.redisKey(p)+":soft:"+cap, 1, keep).Result()
		cancel()
		if err == nil {
			first, decided = ok, true
		} else {
			b.redisFallbacks.Inc()
		}
	}
	if !decided {
		b.mu.Lock()
		first = !b.soft[mark]
		b.soft[mark] = true
		for k := range b.soft { // periods over are forgotten
			if k.p.period == p.period && k.p.start.Before(p.start) {
				delete(b.soft, k)
			}
		}
		b.mu.Unlock()
	}
	if !first {
		return
	}
	b.softCrossed.WithLabelValues(cap).Inc()
	b.log.Info("budget soft threshold crossed", "tenant", p.tenant, "key", p.key, "cap", cap, "limit", limit, "spent", spent)
	if b.opts.Store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	details := map[string]any{"cap": cap, "limit": limit, "spent": spent, "period_start": p.start}
	object := "tenant:" + p.tenant
	if p.key != "" {
		object = "key:" + p.key
	}
	if err := b.opts.Store.RecordFor(ctx, "usher", "budget.soft_threshold", p.tenant, object, details); err != nil {
		b.log.Warn("budget: writing the audit entry failed", "tenant", p.tenant, "err", err)
	}
}
