package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

func TestWithCacheSalt(t *testing.T) {
	const salt = "S"
	for _, tt := range []struct {
		name, body, want string
	}{
		{"no salt of the client's", `{"model":"m","prompt":"hi"}`, `S`},
		{"empty object", `{}`, `S`},
		{"the client's salt stays within the scope", `{"cache_salt":"mine","model":"m"}`, `S:mine`},
		{"an escaped key is the same key", `{"model":"m","cache\u005fsalt":"mine"}`, `S:mine`},
		{"a salt that is not a string is dropped", `{"model":"m","cache_salt":42}`, `S`},
		{"a null salt is none", `{"model":"m","cache_salt":null}`, `S`},
		{"the key inside a message is not the member", `{"messages":[{"role":"user","content":"cache_salt"}],"x":{"cache_salt":"no"}}`, `S`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := withCacheSalt([]byte(tt.body), salt)
			fields, err := objectFields(out, nil) // refuses a duplicate key
			if err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			var got string
			n := 0
			for _, f := range fields {
				if f.key == saltKey {
					n++
					_ = json.Unmarshal(f.value, &got)
				}
			}
			if n != 1 || got != tt.want {
				t.Errorf("%s: cache_salt %q (%d members), want %q once", out, got, n, tt.want)
			}
			var in, back map[string]any
			_ = json.Unmarshal([]byte(tt.body), &in)
			_ = json.Unmarshal(out, &back)
			delete(in, saltKey)
			delete(back, saltKey)
			if b1, _ := json.Marshal(in); string(b1) != string(mustJSON(t, back)) {
				t.Errorf("the other members changed: %s, want %s", mustJSON(t, back), b1)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// twoTenants replaces the gateway's tenants with t1 (testKey) and t2 (key2), both of one tier.
func twoTenants(t *testing.T) func(*Deps) {
	return func(d *Deps) {
		auth, err := tenants.NewStatic([]tenants.TenantSpec{
			{ID: "t1", Name: "T1", Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey(testKey)}}},
			{ID: "t2", Name: "T2", Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey("sk-key-two")}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		d.Auth = auth
	}
}

// TestCacheSaltReachesTheEngine: what the engine saw is its tenant's salt, one per tenant, on a
// chat, a completion and a whole answer usher streams; none on a worker whose engine takes none,
// nor in the global scope.
func TestCacheSaltReachesTheEngine(t *testing.T) {
	off := false
	salted, plain := newFakeWorker(t, nil), newFakeWorker(t, nil)
	noSalt := plain.spec("plain")
	noSalt.CacheSalt = &off
	saltOf := func(t *testing.T, scope routing.CacheScope, w *fakeWorker, spec routing.WorkerSpec, key, path, body string) any {
		t.Helper()
		g := startGatewayOn(t, routing.Config{Workers: []routing.WorkerSpec{spec}, CacheScope: scope, CacheSaltKey: "deployment secret"}, nil, twoTenants(t))
		if resp := g.post(t, path, key, body, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d, want 200", resp.StatusCode)
		}
		return w.body()[saltKey]
	}
	chat := `{"model":"m1","messages":[{"role":"user","content":"the vault code is 4711"}],"stream":true}`
	whole := `{"model":"m1","messages":[{"role":"user","content":"the vault code is 4711"}]}`
	completion := `{"model":"m1","prompt":"the vault code is 4711"}`
	s1 := saltOf(t, "", salted, salted.spec("salted"), testKey, "/v1/chat/completions", chat)
	s1s, _ := s1.(string)
	if len(s1s) != 43 || strings.Contains(s1s, "t1") || strings.Contains(s1s, testKey) {
		t.Fatalf("t1's salt: got %v, want 43 characters that name neither the tenant nor its key", s1)
	}
	for _, tt := range []struct {
		name string
		got  any
		want any
	}{
		{"t1's completion", saltOf(t, "", salted, salted.spec("salted"), testKey, "/v1/completions", completion), s1},
		{"t1's whole answer", saltOf(t, "", salted, salted.spec("salted"), testKey, "/v1/chat/completions", whole), s1},
		{"t1's own salt kept within its scope", saltOf(t, "", salted, salted.spec("salted"), testKey, "/v1/completions",
			`{"model":"m1","prompt":"x","cache_salt":"user-7"}`), s1s + ":user-7"},
		{"an engine that takes none", saltOf(t, "", plain, noSalt, testKey, "/v1/chat/completions", chat), nil},
		{"the global scope", saltOf(t, routing.CacheScopeGlobal, salted, salted.spec("salted"), testKey, "/v1/chat/completions", chat), nil},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: the engine saw cache_salt %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if s2 := saltOf(t, "", salted, salted.spec("salted"), "sk-key-two", "/v1/chat/completions", chat); s2 == s1 || s2 == nil {
		t.Errorf("t2's salt: got %v, want one of its own (t1's is %v)", s2, s1)
	}
	t1, t2 := saltOf(t, routing.CacheScopeTier, salted, salted.spec("salted"), testKey, "/v1/chat/completions", chat),
		saltOf(t, routing.CacheScopeTier, salted, salted.spec("salted"), "sk-key-two", "/v1/chat/completions", chat)
	if t1 != t2 || t1 == nil || t1 == s1 {
		t.Errorf("tier scope: t1 and t2 of one tier got %v and %v, want one salt, not t1's own %v", t1, t2, s1)
	}
	if s := saltOf(t, "", salted, salted.spec("salted"), testKey, "/v1/chat/completions",
		`{"model":"m1","messages":[{"role":"user","content":"x"}],"cache_salt":"`+s1s+`"}`); s == s1 {
		t.Error("a client that sends another scope's salt got it to the engine")
	}
}

// TestCachedTokensOnlyTheScopesOwn: an engine that takes no salt reports hits on every tenant's
// prefixes; once another tenant was sent there, the client is told (and the ledger counts) only
// what its own scope put there.
func TestCachedTokensOnlyTheScopesOwn(t *testing.T) {
	off := false
	w := newFakeWorker(t, nil) // reports 2 of 5 prompt tokens cached
	noSalt := w.spec("plain")
	noSalt.CacheSalt = &off
	for _, tt := range []struct {
		name  string
		spec  routing.WorkerSpec
		scope routing.CacheScope
		want  int
	}{
		{"an engine that isolates by salt", w.spec("salted"), "", 2},
		{"an engine that does not, nothing of the tenant's known", noSalt, "", 0},
		{"an engine that does not, global scope", noSalt, routing.CacheScopeGlobal, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := startGatewayOn(t, routing.Config{Workers: []routing.WorkerSpec{tt.spec}, CacheScope: tt.scope}, nil, twoTenants(t))
			other := g.post(t, "/v1/chat/completions", "sk-key-two", `{"model":"m1","messages":[{"role":"user","content":"hello"}]}`, nil)
			other.Body.Close()
			before := tokensServed(t, g, "cached")
			for _, body := range []string{
				`{"model":"m1","messages":[{"role":"user","content":"hello"}]}`,
				`{"model":"m1","messages":[{"role":"user","content":"hello"}],"stream":true,"stream_options":{"include_usage":true}}`,
			} {
				resp := g.post(t, "/v1/chat/completions", testKey, body, nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("got %d, want 200", resp.StatusCode)
				}
				var answer string
				if resp.Header.Get("Content-Type") == "text/event-stream" {
					answer = strings.Join(readEvents(t, resp.Body), "\n")
				} else {
					var v map[string]any
					_ = json.NewDecoder(resp.Body).Decode(&v)
					answer = string(mustJSON(t, v))
				}
				resp.Body.Close()
				if want := fmt.Sprintf(`"cached_tokens":%d`, tt.want); !strings.Contains(answer, want) {
					t.Errorf("the client was told %s, want %s", answer, want)
				}
			}
			if got := tokensServed(t, g, "cached") - before; got != float64(2*tt.want) {
				t.Errorf("cached tokens counted: got %v, want %v", got, 2*tt.want)
			}
		})
	}
}
