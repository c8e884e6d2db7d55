package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// slowUpload is a request whose body the client sends no more of until finish: the gateway
// holds it open in the parse stage.
type slowUpload struct {
	w    *io.PipeWriter
	resp chan uploadAnswer
}

// uploadAnswer is what the gateway answered an upload; status 0: the request failed.
type uploadAnswer struct {
	status     int
	retryAfter string
	body       string
}

// startSlowUpload sends the headers of a chat request from key with a body of size bytes
// (Content-Length when known, else chunked) and its first few bytes.
func startSlowUpload(t *testing.T, g *testGateway, key string, size int64, known bool) *slowUpload {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.ContentLength = -1
	if known {
		req.ContentLength = size
	}
	u := &slowUpload{w: pw, resp: make(chan uploadAnswer, 1)}
	go func() {
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			u.resp <- uploadAnswer{}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		u.resp <- uploadAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b)}
	}()
	go func() { _, _ = pw.Write([]byte(`{"model":"m1",`)) }()
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF); <-u.resp })
	return u
}

// awaitHeld waits until tenant holds want body bytes.
func awaitHeld(t *testing.T, g *testGateway, tenant string, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, got := g.srv.bodies.held(tenant)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s holds %d body bytes, want %d", tenant, got, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Request bodies are bounded before they are read (issue 26, item 4): a tenant's slow uploads of
// large bodies hold its share, the next one is refused with 429 and Retry-After without being
// read, and another tenant is still served; past the gateway's total, 503.
func TestBodyBytesAreBoundedPerTenantAndInAll(t *testing.T) {
	const mib = 1 << 20
	w := newFakeWorker(t, nil)
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, func(c *Config) {
		c.MaxBodyBytes = mib
		c.MaxBodyBytesPerTenant = 3 * mib
		c.MaxBodyBytesHeld = 3*mib + mib/2
	}, func(d *Deps) {
		auth, err := tenants.NewStatic([]tenants.TenantSpec{
			{ID: "a", Name: "A", Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey("sk-a")}}},
			{ID: "b", Name: "B", Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey("sk-b")}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		d.Auth = auth
	})
	for i := range 3 {
		startSlowUpload(t, g, "sk-a", mib-1, true)
		awaitHeld(t, g, "a", int64(i+1)*mib)
	}

	refused := func(key string, known bool, status int, code string) {
		t.Helper()
		u := startSlowUpload(t, g, key, mib-1, known)
		if !known {
			// Chunked: the body is reserved as it arrives; send until the bound refuses it.
			go func() {
				chunk := []byte(`"x":"` + strings.Repeat("y", 64<<10) + `",`)
				for {
					if _, err := u.w.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
		select {
		case a := <-u.resp:
			if a.status != status || a.retryAfter == "" || !strings.Contains(a.body, `"code":"`+code+`"`) {
				t.Fatalf("got %d %s (Retry-After %q), want %d %s with Retry-After", a.status, a.body, a.retryAfter, status, code)
			}
			u.resp <- a // for the cleanup
		case <-time.After(5 * time.Second):
			t.Fatalf("the upload was not refused: the gateway is reading it")
		}
	}
	refused("sk-a", true, http.StatusTooManyRequests, "body_bytes_exceeded")
	refused("sk-a", false, http.StatusTooManyRequests, "body_bytes_exceeded")
	if _, held := g.srv.bodies.held("a"); held != 3*mib {
		t.Fatalf("tenant a holds %d bytes after the refusals, want %d", held, 3*mib)
	}

	resp := g.post(t, "/v1/chat/completions", "sk-b", chatBody, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("another tenant's request: got %d, want 200", resp.StatusCode)
	}
	refused("sk-b", true, http.StatusServiceUnavailable, "server_busy")
	if total, _ := g.srv.bodies.held("b"); total != 3*mib {
		t.Fatalf("held in all: %d bytes, want %d (tenant a's)", total, 3*mib)
	}
}
