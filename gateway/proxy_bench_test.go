package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
)

// BenchmarkGatewayHop measures one request through the gateway to a fake worker over loopback
// HTTP, client and worker included: the gateway's own cost is the difference to the direct
// benchmark.
func BenchmarkGatewayHop(b *testing.B) {
	for _, mode := range []struct{ name, body string }{{"chat", chatBody}, {"stream", streamBody}} {
		b.Run(mode.name, func(b *testing.B) {
			w := newFakeWorker(b, func(w *fakeWorker) { w.chunks = 16 })
			g := startGateway(b, []routing.WorkerSpec{w.spec("w1")}, nil)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(mode.body))
					req.Header.Set("Authorization", "Bearer "+testKey)
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}
