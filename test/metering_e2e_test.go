package test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	adminui "github.com/usherllm/usher/admin-ui"
	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/redistest"
	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"
)

const meteredKey = "sk-metered-tenant-key"

// meteredGateway is a gateway with the real tenant parts and the usage ledger: a config tenant
// "acme" with key meteredKey at tier, its own store handle on dbURL, Redis when rdb is set.
type meteredGateway struct {
	url    string
	store  *tenants.Store
	ledger *tenants.Ledger
}

func startMeteredGateway(t *testing.T, dbURL string, rdb redis.UniversalClient, workerURL string, tier tenants.Tier) *meteredGateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup

	cfg := tenants.Config{
		Tiers:   []tenants.Tier{tier},
		Tenants: []tenants.TenantSpec{{ID: "acme", Tier: tier.Name, Keys: []tenants.KeySpec{{Name: "main", SHA256: tenants.HashKey(meteredKey)}}}},
		Admin:   tenants.AdminConfig{Token: e2eAdminToken},
		Usage:   tenants.UsageConfig{FlushInterval: 20 * time.Millisecond},
	}
	cfg.Database.URL = dbURL
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	store := openMigratedStore(t, ctx, dbURL)
	// Registered after the store's Close, so it runs first: the ledger's last flush and every
	// other goroutine on the store end before the store closes (a flush on a closed SQLite
	// store panicked in modernc's driver).
	t.Cleanup(func() { cancel(); wg.Wait() })
	dir, err := tenants.NewDirectory(ctx, cfg, store, tenants.DirectoryOptions{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = dir.Run(ctx) })
	admin, err := tenants.NewAdmin(cfg.Admin, store, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger := tenants.NewLedger(cfg.Usage, store, tenants.LedgerOptions{Redis: rdb})
	wg.Go(func() { ledger.Run(ctx) })
	pool := runOneWorkerPool(t, ctx, &wg, workerURL)
	var gcfg gateway.Config
	gcfg.SetDefaults()
	budgets := tenants.NewBudgets(tenants.BudgetsOptions{Redis: rdb, Store: store, Refresh: 20 * time.Millisecond})
	wg.Go(func() { budgets.Run(ctx) })
	gw, err := gateway.New(gcfg, gateway.Deps{Pool: pool, Auth: dir, Ledger: ledger, Budgets: budgets,
		Limits: tenants.NewLimiter(cfg.Limits, tenants.LimiterOptions{Redis: rdb}),
		Admin: func(live *gateway.Server) (http.Handler, error) {
			return adminui.New(defaultAdminConfig(), adminui.Deps{Fleet: pool, Live: live, Admins: admin, Tenants: admin})
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &meteredGateway{url: srv.URL, store: store, ledger: ledger}
}

// ledgerTotal sums the ledger's rows for tenant acme.
func ledgerTotal(t *testing.T, s *tenants.Store) tenants.UsageCounts {
	t.Helper()
	rows, err := s.Usage(context.Background(), tenants.UsageQuery{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	var sum tenants.UsageCounts
	for _, r := range rows {
		sum.Add(r.UsageCounts)
	}
	return sum
}

// streamAndHangUp streams a long answer, reads `keep` content chunks and disconnects. It returns
// the status, the error code of a refusal, the content tokens (words) received, and the tokens
// the gateway said remain in the tenant's tokens-per-minute bucket (x-ratelimit-remaining-tokens;
// -1 without the header).
func streamAndHangUp(t *testing.T, url string, keep int) (status int, code string, tokens, remaining int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(chat("tell me a long story about the sea", 4*keep, true)))
	req.Header.Set("Authorization", "Bearer "+meteredKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	remaining = -1
	if v := resp.Header.Get("x-ratelimit-remaining-tokens"); v != "" {
		remaining, _ = strconv.Atoi(v)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code, 0, remaining
	}
	events := newSSEReader(resp.Body)
	for tokens < keep {
		data, ok := events.next()
		if !ok {
			t.Fatalf("the stream ended after %d content tokens, before the client hung up", tokens)
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && len(chunk.Choices) > 0 {
			tokens += len(strings.Fields(chunk.Choices[0].Delta.Content))
		}
	}
	return http.StatusOK, "", tokens, remaining
}

// Issue 12: a client that hangs up mid-stream is charged what it was served, so a tight
// tokens-per-minute limit stops it, and the ledger counts what it received.
func TestStreamsCutByTheClientAreChargedWhatTheyGot(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.5
	_, worker := simtest.Start(t, cfg)
	const tpm, keep, attempts = 1000, 30, 100
	g := startMeteredGateway(t, "sqlite:"+filepath.Join(t.TempDir(), "usher.db"), nil, worker.URL,
		tenants.Tier{Name: "tight", TokensPerMinute: tpm})

	start := time.Now()
	served, refused, received, firstRefusal := 0, 0, 0, -1
	var perRequest []int // content tokens of each served request, in order
	reservation := -1    // what the gateway reserves for one request: its prompt estimate and max_tokens
	for i := range attempts {
		status, code, tokens, remaining := streamAndHangUp(t, g.url, keep)
		switch {
		case status == http.StatusOK:
			if served == 0 && remaining >= 0 {
				reservation = tpm - remaining // the first request found the bucket full
			}
			served++
			received += tokens
			perRequest = append(perRequest, tokens)
		case status == http.StatusTooManyRequests && code == "rate_limit_exceeded":
			refused++
			if firstRefusal < 0 {
				firstRefusal = len(perRequest)
			}
		default:
			t.Fatalf("attempt %d: status %d %s", i, status, code)
		}
		// The next attempt waits until the gateway has settled this one (the limiter is
		// charged before the ledger records it): otherwise it can arrive while this one,
		// hung up on, still holds its whole reservation, and the refusal comes a request early.
		eventually(t, 5*time.Second, "the attempt is settled", func() bool { return ledgerTotal(t, g.store).Requests == int64(i+1) })
	}
	elapsed := time.Since(start)
	eventually(t, 5*time.Second, "the ledger holds every attempt", func() bool { return ledgerTotal(t, g.store).Requests == attempts })
	got := ledgerTotal(t, g.store)
	t.Logf("%d served, %d refused in %v; client received %d content tokens, ledger %+v", served, refused, elapsed, received, got)

	if refused == 0 {
		t.Fatalf("never refused: %d streams cut after %d tokens each went through a limit of %d tokens a minute", served, keep, tpm)
	}
	if got.Estimated != int64(served) || got.RefusedLimit != int64(refused) {
		t.Errorf("ledger: %d estimated and %d refused, want %d and %d", got.Estimated, got.RefusedLimit, served, refused)
	}
	if diff := got.CompletionTokens - int64(received); diff < 0 || float64(diff) > 0.05*float64(received) {
		t.Errorf("ledger completion tokens %d, client received %d: want within 5%% (and not fewer)", got.CompletionTokens, received)
	}
	// Served before the first refusal: what the bucket held, less at most one request's
	// reservation, plus what refilled meanwhile. The reservation is the gateway's own (its
	// prompt estimate, which may exceed the engine's count, and max_tokens), read from the
	// quota it reported after the first request.
	if reservation < 0 {
		t.Fatal("the first served request carried no x-ratelimit-remaining-tokens")
	}
	prompt := int(got.PromptTokens) / served
	before := 0
	for _, n := range perRequest[:firstRefusal] {
		before += prompt + n
	}
	refill := int(float64(tpm) * elapsed.Minutes())
	if before < tpm-reservation || before > tpm+refill {
		t.Errorf("first refusal after %d tokens served, want between %d and %d", before, tpm-reservation, tpm+refill)
	}
}

// Issue 12: a budget of N tokens a day stops a tenant within one request of N, on every replica
// sharing one Redis; since issue 26 (item 5) each request reserves its estimate (prompt and
// max_tokens) at admission, so the tenant stops at or under N, never past it.
func TestBudgetStopsATenantOnEveryReplica(t *testing.T) {
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.01
	_, worker := simtest.Start(t, cfg)
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "usher.db")
	const budget = 2000
	tier := tenants.Tier{Name: "metered", Budget: tenants.Budget{TokensPerDay: budget}}
	replicas := []*meteredGateway{
		startMeteredGateway(t, dbURL, rdb, worker.URL, tier),
		startMeteredGateway(t, dbURL, rdb, worker.URL, tier),
	}
	served, largest := 0, 0
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("never refused")
		}
		resp, out := call(t, "POST", replicas[i%2].url+"/v1/chat/completions", meteredKey, chat("count the waves", 40, false))
		if resp.StatusCode == http.StatusTooManyRequests {
			e, _ := out["error"].(map[string]any)
			if e["code"] != "budget_exceeded" || e["type"] != "insufficient_quota" || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("refusal: %v, Retry-After %q; want budget_exceeded with Retry-After", out, resp.Header.Get("Retry-After"))
			}
			break
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %v", i, resp.StatusCode, out)
		}
		u, _ := out["usage"].(map[string]any)
		n := int(u["total_tokens"].(float64))
		served += n
		largest = max(largest, n)
	}
	if estimate := largest + 40; served > budget || served <= budget-2*estimate {
		t.Errorf("served %d tokens before the refusal, want at most %d and within two requests' estimate (%d) of it", served, budget, estimate)
	}
	for i, r := range replicas {
		if resp, _ := call(t, "POST", r.url+"/v1/chat/completions", meteredKey, chat("count the waves", 40, false)); resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("replica %d after the budget: got %d, want 429", i, resp.StatusCode)
		}
	}
	eventually(t, 5*time.Second, "the ledger counts the refusals", func() bool { return ledgerTotal(t, replicas[0].store).RefusedBudget == 3 })
}

// get calls url with a bearer token and returns the status and body.
func get(t *testing.T, url, token, accept string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

// Issue 12: the admin reads everyone's usage, as JSON and CSV; a tenant's own key reads only its
// own.
func TestUsageAPIAndTenantIsolation(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.01
	_, worker := simtest.Start(t, cfg)
	g := startMeteredGateway(t, "sqlite:"+filepath.Join(t.TempDir(), "usher.db"), nil, worker.URL, tenants.Tier{Name: "pro"})
	api := g.url + "/admin/api/v1"
	if resp, out := call(t, "POST", api+"/tenants", e2eAdminToken, `{"id":"beta","tier":"pro"}`); resp.StatusCode != 201 {
		t.Fatalf("create tenant: %d %v", resp.StatusCode, out)
	}
	resp, out := call(t, "POST", api+"/tenants/beta/keys", e2eAdminToken, `{"name":"ci"}`)
	if resp.StatusCode != 201 {
		t.Fatalf("create key: %d %v", resp.StatusCode, out)
	}
	betaKey, _ := out["secret"].(string)
	for i, key := range []string{meteredKey, meteredKey, betaKey} {
		if resp, out := call(t, "POST", g.url+"/v1/chat/completions", key, chat("hello there", 5, false)); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %v", i, resp.StatusCode, out)
		}
	}
	type usageAnswer struct {
		Usage []tenants.UsageRow
		Total tenants.UsageCounts
	}
	read := func(token, query string) (int, usageAnswer) {
		status, _, body := get(t, api+"/usage"+query, token, "")
		var a usageAnswer
		_ = json.Unmarshal([]byte(body), &a)
		return status, a
	}
	eventually(t, 5*time.Second, "the ledger holds the three requests", func() bool {
		_, a := read(e2eAdminToken, "")
		return a.Total.Requests == 3
	})

	if _, a := read(e2eAdminToken, "?tenant=beta"); a.Total.Requests != 1 || len(a.Usage) != 1 || a.Usage[0].Tenant != "beta" || a.Usage[0].CompletionTokens == 0 {
		t.Errorf("admin, tenant=beta: got %+v, want beta's one request", a)
	}
	if _, a := read(e2eAdminToken, "?from=2000-01-01&to=2001-01-01"); a.Total.Requests != 0 {
		t.Errorf("admin, a range long past: got %d requests, want 0", a.Total.Requests)
	}
	status, a := read(meteredKey, "")
	if status != 200 || a.Total.Requests != 2 {
		t.Errorf("acme's key: got %d with %d requests, want 200 with its own 2", status, a.Total.Requests)
	}
	for _, r := range a.Usage {
		if r.Tenant != "acme" {
			t.Errorf("acme's key reads a row of %q", r.Tenant)
		}
	}
	if status, _ := read(meteredKey, "?tenant=beta"); status != http.StatusNotFound {
		t.Errorf("acme's key asking for beta: got %d, want 404", status)
	}
	if status, a := read(betaKey, ""); status != 200 || a.Total.Requests != 1 {
		t.Errorf("beta's key: got %d with %d requests, want its own 1", status, a.Total.Requests)
	}

	for _, tc := range []struct{ query, accept string }{{"?format=csv", ""}, {"", "text/csv"}} {
		status, h, body := get(t, api+"/usage"+tc.query, e2eAdminToken, tc.accept)
		lines := strings.Split(strings.TrimSpace(body), "\n")
		if status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/csv") || len(lines) != 3 ||
			!strings.HasPrefix(lines[0], "period,start,tenant,key,model,class,requests,prompt_tokens") {
			t.Errorf("CSV (%q, Accept %q): got %d %q\n%s", tc.query, tc.accept, status, h.Get("Content-Type"), body)
		}
	}
	if status, _, _ := get(t, api+"/usage?from=yesterday", e2eAdminToken, ""); status != http.StatusBadRequest {
		t.Errorf("from=yesterday: got %d, want 400", status)
	}
}

// Budgets set through the admin API override the tier's on every replica: a tenant's replaces
// it, a key's caps that key too; the tenant reads its own and cannot change it.
func TestBudgetsSetThroughTheAdminAPI(t *testing.T) {
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.01
	_, worker := simtest.Start(t, cfg)
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "usher.db")
	tier := tenants.Tier{Name: "pro"}
	a := startMeteredGateway(t, dbURL, rdb, worker.URL, tier)
	b := startMeteredGateway(t, dbURL, rdb, worker.URL, tier)
	infer := func(url string) (int, map[string]any) {
		resp, out := call(t, "POST", url+"/v1/chat/completions", meteredKey, chat("count the waves", 20, false))
		return resp.StatusCode, out
	}
	if status, out := infer(a.url); status != 200 {
		t.Fatalf("before any budget: %d %v", status, out)
	}

	if resp, out := call(t, "PUT", a.url+"/admin/api/v1/tenants/acme/keys/main/budget", meteredKey, `{"tokens_per_day":1}`); resp.StatusCode != 403 {
		t.Fatalf("the tenant setting its own budget: got %d %v, want 403", resp.StatusCode, out)
	}
	if resp, out := call(t, "PUT", a.url+"/admin/api/v1/tenants/acme/keys/main/budget", e2eAdminToken, `{"tokens_per_day":1}`); resp.StatusCode != 200 {
		t.Fatalf("set the key's budget: %d %v", resp.StatusCode, out)
	}
	if resp, out := call(t, "GET", b.url+"/admin/api/v1/tenants/acme/keys/main/budget", meteredKey, ""); resp.StatusCode != 200 || out["tokens_per_day"] != 1.0 {
		t.Fatalf("the tenant reading its key's budget: %d %v", resp.StatusCode, out)
	}
	// The first request is admitted (the key has spent nothing yet today), then both replicas
	// refuse the key.
	eventually(t, 5*time.Second, "both replicas refuse the key", func() bool {
		sa, _ := infer(a.url)
		sb, out := infer(b.url)
		e, _ := out["error"].(map[string]any)
		msg, _ := e["message"].(string)
		return sa == 429 && sb == 429 && strings.Contains(msg, "this key's budget")
	})
	if resp, _ := call(t, "DELETE", a.url+"/admin/api/v1/tenants/acme/keys/main/budget", e2eAdminToken, ""); resp.StatusCode != 204 {
		t.Fatalf("delete the key's budget: %d", resp.StatusCode)
	}
	eventually(t, 5*time.Second, "the key works again", func() bool { s, _ := infer(b.url); return s == 200 })

	// A tenant budget replaces the tier's (which has none).
	if resp, out := call(t, "PUT", b.url+"/admin/api/v1/tenants/acme/budget", e2eAdminToken, `{"requests_per_day":2}`); resp.StatusCode != 200 {
		t.Fatalf("set the tenant's budget: %d %v", resp.StatusCode, out)
	}
	eventually(t, 5*time.Second, "the tenant is refused on both replicas", func() bool {
		sa, _ := infer(a.url)
		sb, out := infer(b.url)
		e, _ := out["error"].(map[string]any)
		return sa == 429 && sb == 429 && e["code"] == "budget_exceeded"
	})
	if resp, out := call(t, "PUT", a.url+"/admin/api/v1/tenants/nobody/budget", e2eAdminToken, `{"requests_per_day":2}`); resp.StatusCode != 404 {
		t.Errorf("a budget for an unknown tenant: got %d %v, want 404", resp.StatusCode, out)
	}
	if resp, out := call(t, "PUT", a.url+"/admin/api/v1/tenants/acme/budget", e2eAdminToken, `{"requests_per_day":-1}`); resp.StatusCode != 400 {
		t.Errorf("a negative cap: got %d %v, want 400", resp.StatusCode, out)
	}
}
