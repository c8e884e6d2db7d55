package gateway

import (
	"net/http"
	"testing"

	"github.com/usherllm/usher/routing"
)

func TestTargetWorkerNeedsATierThatAllowsIt(t *testing.T) {
	a := newFakeWorker(t, nil)
	b := newFakeWorker(t, nil)
	specs := []routing.WorkerSpec{a.spec("a"), b.spec("b")}
	hdr := map[string]string{headerTarget: "b"}
	if resp := startGateway(t, specs, nil).post(t, "/v1/chat/completions", testKey, chatBody, hdr); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("tier without may_target_worker: got %d, want 403", resp.StatusCode)
	}
	g := startTierGateway(t, specs, opsTier)
	for i := 0; i < 4; i++ {
		if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, hdr); resp.Header.Get(headerWorker) != "b" {
			t.Fatalf("request %d: got %d from %q, want 200 from b", i, resp.StatusCode, resp.Header.Get(headerWorker))
		}
	}
	if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerTarget: "zz"}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown target: got %d, want 400", resp.StatusCode)
	}
}
