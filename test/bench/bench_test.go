package bench

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkReadStream measures the client's cost per streamed token: reading and decoding
// one server-sent event.
func BenchmarkReadStream(b *testing.B) {
	var body bytes.Buffer
	const chunks = 256
	for i := 0; i < chunks; i++ {
		fmt.Fprintf(&body, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"finish_reason\":null}]}\n\n", i)
	}
	body.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":256}}\n\ndata: [DONE]\n\n")
	s := &sender{now: time.Now}
	start := time.Now()
	b.SetBytes(int64(body.Len()))
	b.ReportAllocs()
	for b.Loop() {
		var res result
		s.readStream(context.Background(), bytes.NewReader(body.Bytes()), start, &res)
		if !res.ok || res.outputTokens != chunks {
			b.Fatalf("got ok %v output %d", res.ok, res.outputTokens)
		}
	}
}

// BenchmarkMooncakePrompt measures building a scaled Mooncake prompt of 16 blocks of 64 words.
func BenchmarkMooncakePrompt(b *testing.B) {
	ids := make([]int64, 16)
	for i := range ids {
		ids[i] = int64(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		var sb strings.Builder
		MooncakePrompt(&sb, ids, 64, 1000)
	}
}
