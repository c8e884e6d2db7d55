package tenants

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func newTestStatic(t testing.TB) *Static {
	t.Helper()
	c := Config{Tiers: []Tier{{Name: "pro"}, {Name: BuiltinTier}}, Tenants: []TenantSpec{
		{ID: "acme", Name: "Acme Corp", Tier: "pro", Keys: []KeySpec{{Name: "ci", SHA256: HashKey("sk-acme-ci")}, {Name: "prod", SHA256: strings.ToUpper(HashKey("sk-acme-prod"))}}},
		{ID: "globex", Keys: []KeySpec{{SHA256: HashKey("sk-globex")}}},
	}}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	s, err := NewStatic(c.Tenants)
	if err != nil {
		t.Fatalf("NewStatic: %v", err)
	}
	return s
}

func TestStaticAuthenticate(t *testing.T) {
	s := newTestStatic(t)
	tests := []struct {
		name       string
		credential string
		want       Principal
	}{
		{"first key", "sk-acme-ci", Principal{TenantID: "acme", TenantName: "Acme Corp", Tier: "pro", KeyID: "ci"}},
		{"upper-case hash in config", "sk-acme-prod", Principal{TenantID: "acme", TenantName: "Acme Corp", Tier: "pro", KeyID: "prod"}},
		{"defaults applied", "sk-globex", Principal{TenantID: "globex", TenantName: "globex", Tier: BuiltinTier, KeyID: "key-0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Authenticate(context.Background(), tt.credential)
			if err != nil {
				t.Fatalf("got error %v, want %+v", err, tt.want)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestStaticRefuses(t *testing.T) {
	s := newTestStatic(t)
	tests := []struct {
		name       string
		credential string
		want       string
	}{
		{"missing", "", "missing credential"},
		{"wrong", "sk-acme-cj", "unknown credential"},
		{"prefix of a key", "sk-acme-c", "unknown credential"},
		{"key with suffix", "sk-acme-ci2", "unknown credential"},
		{"the hash instead of the key", HashKey("sk-acme-ci"), "unknown credential"},
		{"inner space", "sk-acme ci", "malformed credential"},
		{"trailing newline", "sk-acme-ci\n", "malformed credential"},
		{"non-ascii", "sk-acme-cï", "malformed credential"},
		{"too long", strings.Repeat("a", MaxCredentialLen+1), "malformed credential"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Authenticate(context.Background(), tt.credential)
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("got %v, want an error wrapping ErrUnauthenticated", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %q, want it to contain %q", err, tt.want)
			}
			if tt.credential != "" && strings.Contains(err.Error(), tt.credential) {
				t.Errorf("error %q contains the credential", err)
			}
		})
	}
}

func TestNewStaticRefusesBadHash(t *testing.T) {
	_, err := NewStatic([]TenantSpec{{ID: "a", Keys: []KeySpec{{Name: "k", SHA256: "zz"}}}})
	if err == nil || !strings.Contains(err.Error(), "tenants[0].keys[0].sha256") {
		t.Errorf("got %v, want an error naming tenants[0].keys[0].sha256", err)
	}
}

func TestHashKey(t *testing.T) {
	// echo -n sk-test | sha256sum
	const want = "f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0"
	if got := HashKey("sk-test"); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestBearerCredential(t *testing.T) {
	tests := []struct {
		header string
		want   string
		ok     bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER  abc", "abc", true},
		{"Bearer ", "", false},
		{"Bearer", "", false},
		{"Basic abc", "", false},
		{"", "", false},
		{"Bearerabc", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			got, ok := BearerCredential(tt.header)
			if got != tt.want || ok != tt.ok {
				t.Errorf("got (%q, %v), want (%q, %v)", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func FuzzStaticAuthenticate(f *testing.F) {
	s := newTestStatic(f)
	for _, seed := range []string{"Bearer sk-acme-ci", "bearer sk-globex", "Bearer ", "", "Basic x", "Bearer usk_abc_def", "Bearer a.b.c", "Bearer \x00"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		cred, ok := BearerCredential(header)
		if !ok {
			if cred != "" {
				t.Fatalf("BearerCredential(%q) = %q, false; want an empty credential when not ok", header, cred)
			}
			return
		}
		p, err := s.Authenticate(context.Background(), cred)
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("got %v, want an error wrapping ErrUnauthenticated", err)
			}
			if len(cred) >= 4 && strings.Contains(err.Error(), cred) {
				t.Fatalf("error %q contains the credential", err)
			}
			return
		}
		if cred != "sk-acme-ci" && cred != "sk-acme-prod" && cred != "sk-globex" {
			t.Fatalf("credential %q accepted as %+v", cred, p)
		}
	})
}

func BenchmarkStaticAuthenticate(b *testing.B) {
	s := newTestStatic(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Authenticate(ctx, "sk-acme-ci"); err != nil {
			b.Fatal(err)
		}
	}
}
