package bench_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/usherllm/usher/test/bench"
)

func TestRunStreamOutcomes(t *testing.T) {
	sse := func(lines ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, l := range lines {
				fmt.Fprintf(w, "%s\n\n", l)
			}
		}
	}
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		timeout    time.Duration
		wantOK     bool
		wantFail   bench.FailureCount
		wantOutput int64
	}{
		{
			name: "done without usage counts chunks",
			handler: sse(`data: {"choices":[{"delta":{"role":"assistant"}}]}`, `data: {"choices":[{"delta":{"content":"a"}}]}`,
				`: keep-alive`, `data: {"choices":[{"delta":{"content":"b"}}]}`, `data: [DONE]`),
			wantOK: true, wantOutput: 2,
		},
		{
			name:    "finish reason without done",
			handler: sse(`data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`),
			wantOK:  true, wantOutput: 1,
		},
		{
			name:     "error event mid-stream",
			handler:  sse(`data: {"choices":[{"delta":{"content":"a"}}]}`, `data: {"error":{"message":"gone","type":"server_error","code":null}}`),
			wantFail: bench.FailureCount{Status: 200, Code: "server_error", Count: 1},
		},
		{
			name:     "cut stream",
			handler:  sse(`data: {"choices":[{"delta":{"content":"a"}}]}`),
			wantFail: bench.FailureCount{Status: 200, Code: "incomplete_stream", Count: 1},
		},
		{
			name:     "garbage event",
			handler:  sse(`data: {"choices":`),
			wantFail: bench.FailureCount{Status: 200, Code: "bad_stream", Count: 1},
		},
		{
			name: "whole JSON body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"choices":[{"message":{"content":"hi there"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`)
			},
			wantOK: true, wantOutput: 2,
		},
		{
			name: "numeric error code",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprint(w, `{"error":{"message":"slow down","type":"rate_limit","code":429}}`)
			},
			wantFail: bench.FailureCount{Status: 429, Code: "429", Count: 1},
		},
		{
			name: "not an OpenAI error",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "bad gateway", http.StatusBadGateway)
			},
			wantFail: bench.FailureCount{Status: 502, Count: 1},
		},
		{
			name: "timeout",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			},
			timeout:  100 * time.Millisecond,
			wantFail: bench.FailureCount{Status: 200, Code: "timeout", Count: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			t.Cleanup(srv.Close)
			cfg := smallRandom(srv.URL, 1)
			cfg.Timeout = tc.timeout
			rep, err := bench.Run(context.Background(), cfg, bench.Options{})
			if tc.wantOK {
				if err != nil || rep.Overall.OK != 1 || rep.Overall.OutputTokens != tc.wantOutput {
					t.Fatalf("got err %v ok %d output %d failures %+v, want ok with %d output tokens",
						err, rep.Overall.OK, rep.Overall.OutputTokens, rep.Overall.Failures, tc.wantOutput)
				}
				return
			}
			if rep == nil {
				t.Fatalf("Run: %v, want a report", err)
			}
			if want := []bench.FailureCount{tc.wantFail}; !reflect.DeepEqual(rep.Overall.Failures, want) {
				t.Errorf("failures: got %+v, want %+v", rep.Overall.Failures, want)
			}
		})
	}
}
