package tenants

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
	// Left is what remains of the cap in the period, requests already admitted counted; Asked
	// is what the request would have reserved (its token estimate, or one request).
	Left, Asked int64
}

func (e *BudgetError) Error() string {
	whose := "the tenant's"
	if e.Key != "" {
		whose = "this key's"
	}
	if e.Left > 0 {
		return fmt.Sprintf("%s budget of %d %s has %d left, less than this request may use (%d); it resets at %s", whose,
			e.Limit, capWords[e.Cap], e.Left, e.Asked, e.Reset.UTC().Format(time.RFC3339))
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
// and month. Reserve holds one request and the request's token estimate against every cap at
// admission, and refuses a request the caps cannot hold; Spend.Settle replaces the estimate by
// what the request was served, and Spend.Release gives both back for a request that was not
// served. So concurrent requests never pass a cap between admission and settlement. With Redis
// the spending and the reservations are counted there (one atomic script), shared by every
// replica; without Redis each replica counts its own. Either way a period's count starts from
// the usage ledger when it is not held yet, so a restart does not hand out a new budget. A
// replica that dies with requests in flight leaves their estimates counted: a budget may be
// charged more than was served, never less.
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
	// fails (guarded by mu); soft marks the thresholds this replica knows are reported.
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

// Spend is an admitted request's reservation in its budgets. Call Settle or Release once when
// it ends (further calls do nothing). The methods of a nil Spend do nothing.
type Spend struct {
	b      *Budgets
	scopes []budgetScope
	// tokens is the token estimate reserved; inRedis tells where it was reserved.
	tokens  int64
	inRedis bool
	ended   atomic.Bool
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
	name     string // "tokens_per_day", ...
	limit    int64
	requests bool // it counts requests; else tokens
	at       int  // index of the period: 0 day, 1 month
}

func (c budgetCap) count(s spending) int64 {
	if c.requests {
		return s.requests
	}
	return s.tokens
}

func (sc budgetScope) caps() []budgetCap {
	return []budgetCap{
		{"tokens_per_day", sc.limits.TokensPerDay, false, 0},
		{"requests_per_day", sc.limits.RequestsPerDay, true, 0},
		{"tokens_per_month", sc.limits.TokensPerMonth, false, 1},
		{"requests_per_month", sc.limits.RequestsPerMonth, true, 1},
	}
}

// scopes returns the budgets a request of p counts against at now: its tenant's (the override
// set through the admin API, else its tenant's tier's; a credential below its tenant's tier is
// held to that lower tier's caps too, on the tenant's counts), its key's when one is set, and
// the one set for each key its key was minted by (Principal.KeyParents): a minted key spends
// from its parents' budgets too, so minting never adds budget.
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
	own := p.TenantTier
	if own == nil {
		own = p.TierSpec
	}
	if own != nil {
		soft = own.Budget.SoftThreshold
		tenant.TokensPerDay, tenant.TokensPerMonth = own.Budget.TokensPerDay, own.Budget.TokensPerMonth
		tenant.RequestsPerDay, tenant.RequestsPerMonth = own.Budget.RequestsPerDay, own.Budget.RequestsPerMonth
	}
	if o, ok := overrides[[2]string{p.TenantID, ""}]; ok {
		tenant = o
	}
	if p.TenantTier != nil && p.TierSpec != nil {
		lower := p.TierSpec.Budget
		tenant.TokensPerDay, tenant.TokensPerMonth = tighter(tenant.TokensPerDay, lower.TokensPerDay), tighter(tenant.TokensPerMonth, lower.TokensPerMonth)
		tenant.RequestsPerDay, tenant.RequestsPerMonth = tighter(tenant.RequestsPerDay, lower.RequestsPerDay), tighter(tenant.RequestsPerMonth, lower.RequestsPerMonth)
	}
	var out []budgetScope
	if tenant.capped() {
		out = append(out, scope(tenant, soft))
	}
	if p.KeyID == "" {
		return out
	}
	if o, ok := overrides[[2]string{p.TenantID, p.KeyID}]; ok && o.capped() {
		out = append(out, scope(o, soft))
	}
	for parent := range strings.FieldsSeq(p.KeyParents) {
		if o, ok := overrides[[2]string{p.TenantID, parent}]; ok && o.capped() {
			out = append(out, scope(o, soft))
		}
	}
	return out
}

// addDelta adds d, of either sign, to the count n, saturating at 0 and math.MaxInt64.
func addDelta(n, d int64) int64 {
	if d >= 0 {
		return addSat(n, d)
	}
	return max(n+d, 0)
}

// tighter is the stricter of two caps, 0 meaning none.
func tighter(a, b int64) int64 {
	if a == 0 || b != 0 && b < a {
		return b
	}
	return a
}

// Reserve admits a request of p that may use up to tokens (its prompt and its output bound) and
// holds one request and tokens in every budget p counts against, or refuses it with a
// *BudgetError when a cap cannot hold them: the request would pass the cap's requests or
// tokens, counting what requests admitted before it reserved. A request no budget applies to
// costs a map lookup and returns nil, nil; otherwise one Redis round trip (with Redis), or a
// map lookup (without), and once per tenant (or key) and period a query of the usage ledger.
func (b *Budgets) Reserve(ctx context.Context, p Principal, tokens int64) (*Spend, error) {
	now := b.opts.Now()
	scopes := b.scopes(p, now)
	if len(scopes) == 0 {
		return nil, nil
	}
	// Beyond 2^53 no cap holds it anyway (caps are at most that); the bound keeps Redis' sums
	// from overflowing.
	s := &Spend{b: b, scopes: scopes, tokens: min(max(tokens, 0), maxLimit)}
	ps := s.periods()
	if b.opts.Redis != nil {
		refused, err := b.reserveRedis(ctx, s, ps)
		if err == nil {
			s.inRedis = true
			return s.refusal(refused, now)
		}
		b.redisFallbacks.Inc()
		b.log.Warn("budget: redis failed, counting on this replica", "tenant", p.TenantID, "err", err)
	}
	return s.refusal(b.reserveLocal(ctx, s, ps), now)
}

// refusal is s when nothing refused it, else the refusal of the cap refused.
func (s *Spend) refusal(refused *capRefused, now time.Time) (*Spend, error) {
	if refused == nil {
		return s, nil
	}
	sc := s.scopes[refused.period/2]
	for _, c := range sc.caps() {
		if c.at != refused.period%2 || c.requests != refused.requests {
			continue
		}
		end := sc.ends[c.at]
		asked := s.tokens
		if c.requests {
			asked = 1
		}
		return nil, &BudgetError{Cap: c.name, Key: sc.limits.KeyID, Limit: c.limit, Reset: end, RetryAfter: end.Sub(now),
			Left: max(0, c.limit-c.count(refused.spent)), Asked: asked}
	}
	return nil, fmt.Errorf("budget: refused by an unknown cap of period %d", refused.period)
}

// capRefused names the cap a reservation did not fit: the index of its period in
// Spend.periods, whether it counts requests (else tokens), and the period's spending.
type capRefused struct {
	period   int
	requests bool
	spent    spending
}

// periods lists the periods of s's scopes: for scope i, the day at 2i and the month at 2i+1.
func (s *Spend) periods() []periodKey {
	ps := make([]periodKey, 0, 2*len(s.scopes))
	for _, sc := range s.scopes {
		ps = append(ps, sc.periods[:]...)
	}
	return ps
}

// limitsOf returns the token and request caps of period i of s.periods() (0: none).
func (s *Spend) limitsOf(i int) (tokens, requests int64) {
	l := s.scopes[i/2].limits
	if i%2 == 0 {
		return l.TokensPerDay, l.RequestsPerDay
	}
	return l.TokensPerMonth, l.RequestsPerMonth
}

// fits returns the first cap of s that one more request of s.tokens would pass, given the
// periods' spending; nil when every cap holds it.
func (s *Spend) fits(spent []spending) *capRefused {
	for i, sp := range spent {
		tcap, rcap := s.limitsOf(i)
		if rcap > 0 && addSat(sp.requests, 1) > rcap {
			return &capRefused{period: i, requests: true, spent: sp}
		}
		if tcap > 0 && addSat(sp.tokens, s.tokens) > tcap {
			return &capRefused{period: i, spent: sp}
		}
	}
	return nil
}

// reserveLocal reserves s on this replica's counts.
func (b *Budgets) reserveLocal(ctx context.Context, s *Spend, ps []periodKey) *capRefused {
	counts := make([]*spending, len(ps))
	for i, p := range ps {
		counts[i] = b.localSpending(ctx, p) // seeds from the ledger outside the lock
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	spent := make([]spending, len(ps))
	for i, c := range counts {
		spent[i] = *c
	}
	if refused := s.fits(spent); refused != nil {
		return refused
	}
	for _, c := range counts {
		c.tokens, c.requests = addSat(c.tokens, s.tokens), addSat(c.requests, 1)
	}
	return nil
}

// reserveScript reserves one request and ARGV[1] tokens in every period hash of KEYS (fields t
// and r) when no cap would be passed, atomically. ARGV[2] is the hashes' time to live in ms;
// ARGV[1+2i] and ARGV[2+2i] are the token and request caps of KEYS[i] (0: none). Returns {0}
// reserved; {-1, i} when KEYS[i] is not seeded yet (nothing written); {1, i, t, r} when KEYS[i]'s
// request cap, {2, i, t, r} when its token cap, would be passed (t, r: its spending).
var reserveScript = redis.NewScript(`
local tok = tonumber(ARGV[1])
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then return {-1, i} end
end
for i = 1, #KEYS do
  local v = redis.call('HMGET', KEYS[i], 't', 'r')
  local t, r = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  local tcap, rcap = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  if rcap > 0 and r + 1 > rcap then return {1, i, t, r} end
  if tcap > 0 and t + tok > tcap then return {2, i, t, r} end
end
for i = 1, #KEYS do
  redis.call('HINCRBY', KEYS[i], 't', tok)
  redis.call('HINCRBY', KEYS[i], 'r', 1)
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return {0}`)

// reserveRedis reserves s in Redis, seeding the periods Redis does not hold from the ledger
// first. err is Redis' failure (nothing was reserved then).
func (b *Budgets) reserveRedis(ctx context.Context, s *Spend, ps []periodKey) (*capRefused, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.RedisTimeout)
	defer cancel()
	keys := make([]string, len(ps))
	args := []any{s.tokens, keep.Milliseconds()}
	for i, p := range ps {
		keys[i] = b.redisKey(p)
		tcap, rcap := s.limitsOf(i)
		args = append(args, tcap, rcap)
	}
	for range len(ps) + 1 { // each round seeds one period at most
		res, err := reserveScript.Run(ctx, b.opts.Redis, keys, args...).Int64Slice()
		if err != nil {
			return nil, err
		}
		switch {
		case len(res) == 1 && res[0] == 0:
			return nil, nil
		case len(res) == 2 && res[0] == -1 && res[1] >= 1 && int(res[1]) <= len(ps):
			p := ps[res[1]-1]
			seed := b.ledgerSpending(ctx, p)
			if err := seedScript.Run(ctx, b.opts.Redis, []string{keys[res[1]-1]}, seed.tokens, seed.requests, keep.Milliseconds()).Err(); err != nil {
				return nil, err
			}
		case len(res) == 4 && (res[0] == 1 || res[0] == 2) && res[1] >= 1 && int(res[1]) <= len(ps):
			return &capRefused{period: int(res[1] - 1), requests: res[0] == 1, spent: spending{tokens: res[2], requests: res[3]}}, nil
		default:
			return nil, fmt.Errorf("budget: unexpected answer %v from redis", res)
		}
	}
	return nil, errors.New("budget: redis kept losing the seeded periods")
}

// Settle charges the request what it was served (prompt plus completion tokens) in place of its
// estimate; the request stays counted. Nil-safe.
func (s *Spend) Settle(tokens int64) {
	if s != nil {
		s.end(max(tokens, 0)-s.tokens, 0)
	}
}

// Release gives back the request and its estimate: it was not served (refused after its
// reservation, or failed before anything was computed). Nil-safe.
func (s *Spend) Release() {
	if s != nil {
		s.end(-s.tokens, -1)
	}
}

// end adds tokens and requests to the periods s reserved in, and reports the soft thresholds
// the result reaches.
func (s *Spend) end(tokens, requests int64) {
	if !s.ended.CompareAndSwap(false, true) {
		return
	}
	ps := s.periods()
	after := s.b.add(ps, tokens, requests, s.inRedis)
	if requests < 0 {
		return
	}
	for i, sc := range s.scopes {
		for _, c := range sc.caps() {
			j := 2*i + c.at
			if c.limit > 0 && c.count(after[j]) >= toInt64(float64(c.limit)*sc.soft) {
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

// add adds tokens and requests to each period, in Redis when inRedis (where the request
// reserved) or else on this replica, and returns the counts after. A Redis failure leaves the
// reservation counted there: the request is charged its estimate.
func (b *Budgets) add(ps []periodKey, tokens, requests int64, inRedis bool) []spending {
	after := make([]spending, len(ps))
	if inRedis {
		if err := b.addRedis(ps, tokens, requests, after); err != nil {
			b.redisFallbacks.Inc()
			b.log.Warn("budget: redis failed to settle a request; its estimate stays charged", "err", err)
		}
		return after
	}
	ctx := context.Background()
	for i, p := range ps {
		s := b.localSpending(ctx, p)
		b.mu.Lock()
		s.tokens, s.requests = addDelta(s.tokens, tokens), addDelta(s.requests, requests)
		after[i] = *s
		b.mu.Unlock()
	}
	return after
}

func (b *Budgets) addRedis(ps []periodKey, tokens, requests int64, after []spending) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.RedisTimeout)
	defer cancel()
	cmds := make([]*redis.IntCmd, 2*len(ps))
	_, err := b.opts.Redis.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		for i, p := range ps {
			k := b.redisKey(p)
			cmds[2*i] = pl.HIncrBy(ctx, k, "t", tokens)
			cmds[2*i+1] = pl.HIncrBy(ctx, k, "r", requests)
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
	b.mu.Lock()
	known := b.soft[mark]
	b.mu.Unlock()
	if known {
		return // reported already, by this replica or, as Redis said, by another
	}
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
	b.mu.Lock()
	if !decided {
		first = !b.soft[mark]
	}
	b.soft[mark] = true
	for k := range b.soft { // periods over are forgotten
		if k.p.period == p.period && k.p.start.Before(p.start) {
			delete(b.soft, k)
		}
	}
	b.mu.Unlock()
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
