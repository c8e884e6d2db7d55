package gateway

import (
	"strings"
	"testing"
	"time"
)

// BenchmarkParseBody measures the parse stage on bodies of the shapes clients send: a short chat,
// a long chat with non-ASCII text and escapes, a chat with a tool schema, and a completions batch.
func BenchmarkParseBody(b *testing.B) {
	long := strings.Repeat(`Grüße, \"quoted\" text über 東京 and more plain ASCII words here. `, 4000)
	schema := `{"type":"function","function":{"name":"lookup","description":"finds a record","parameters":{"type":"object","properties":{"q":{"type":"string"},"filters":{"type":"array","items":{"type":"object","properties":{"field":{"type":"string"},"op":{"type":"string","enum":["eq","lt","gt"]}}}}}}}}`
	for _, bench := range []struct {
		name string
		ep   endpoint
		body string
	}{
		{"chat-short", chatEndpoint, `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"hello there"}],"max_tokens":64,"temperature":0.7}`},
		{"chat-long", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + long + `"}]},{"role":"assistant","content":"ok"},{"role":"user","content":"` + long + `"}],"stream":true}`},
		{"chat-tools", chatEndpoint, `{"model":"m","tools":[` + strings.Repeat(schema+",", 20) + schema + `],"messages":[{"role":"user","content":"find it"}]}`},
		{"completions-batch", completionEndpoint, `{"model":"m","prompt":["` + strings.Repeat(`a prompt of some length `, 200) + `","second"],"max_tokens":16}`},
	} {
		b.Run(bench.name, func(b *testing.B) {
			body := []byte(bench.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := parseBody(body, newCall(bench.ep, time.Time{}), defaultMaxJSONDepth); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
