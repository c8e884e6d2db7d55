package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/test/sim"
)

// engineBodies records the inference requests each engine of a stack got, as JSON objects.
type engineBodies struct {
	mu     sync.Mutex
	bodies map[int][]map[string]any
}

func (b *engineBodies) wrap(i int, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
			data, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(data))
			var body map[string]any
			_ = json.Unmarshal(data, &body)
			b.mu.Lock()
			b.bodies[i] = append(b.bodies[i], body)
			b.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// of returns what engine i got.
func (b *engineBodies) of(i int) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]map[string]any(nil), b.bodies[i]...)
}

// startDisaggregatedStack is a gateway over 2 prefill (sim-0, sim-1) and 2 decode (sim-2,
// sim-3) simulated vLLM engines speaking the KV-connector flow, the prefill pool routed round
// robin, so that a test knows both prefill workers are tried.
func startDisaggregatedStack(t *testing.T) (*stack, *engineBodies) {
	t.Helper()
	return startDisaggregatedStackWith(t, routing.ProtocolVLLM, nil)
}

// startDisaggregatedStackWith is startDisaggregatedStack with the hand-off protocol given, and
// the gateway's log written to logs when not nil; each prefill sim's HTTP port is its SGLang
// bootstrap port.
func startDisaggregatedStackWith(t *testing.T, protocol routing.Protocol, logs io.Writer) (*stack, *engineBodies) {
	t.Helper()
	rec := &engineBodies{bodies: map[int][]map[string]any{}}
	s := startStack(t, stackOptions{
		workers: 4,
		logs:    logs,
		sim: func(i int, c *sim.Config) {
			c.Mode = sim.ModeKV
			c.Role = sim.RolePrefill
			if i >= 2 {
				c.Role = sim.RoleDecode
			}
		},
		routing: func(c *routing.Config, _ []*sim.Engine) {
			for i := range c.Workers {
				c.Workers[i].Role = routing.RolePrefill
				if i >= 2 {
					c.Workers[i].Role = routing.RoleDecode
				}
			}
			c.Disaggregation.PrefillPolicy = "round_robin"
			c.Disaggregation.Protocol = protocol
			for i := range c.Workers {
				u, err := url.Parse(c.Workers[i].URL)
				if err != nil {
					t.Fatal(err)
				}
				c.Workers[i].BootstrapPort, _ = strconv.Atoi(u.Port())
			}
		},
		engineHandler: rec.wrap,
	})
	return s, rec
}

// Issue 29: a disaggregated model served end to end by usher sim engines. A chat request and a
// stream are answered by a decode worker from KV it pulled from a prefill worker: the prefill
// worker got the request with do_remote_decode, max_tokens 1 and no stream, the decode worker
// the prefill's kv_transfer_params, and the usage counts the prompt once.
func TestDisaggregatedServing(t *testing.T) {
	s, rec := startDisaggregatedStack(t)
	clientPrompt, clientCached := serveChatAndStream(t, s)
	var prefills, decodes int
	for i := range 4 {
		for _, b := range rec.of(i) {
			kv, _ := b["kv_transfer_params"].(map[string]any)
			if i < 2 {
				prefills++
				if kv["do_remote_decode"] != true || b["max_tokens"] != float64(1) || b["stream"] != false {
					t.Errorf("prefill worker sim-%d got %v: want do_remote_decode, max_tokens 1, no stream", i, b)
				}
				continue
			}
			decodes++
			if kv["do_remote_prefill"] != true || kv["remote_engine_id"] != s.engines[0].EngineID() && kv["remote_engine_id"] != s.engines[1].EngineID() {
				t.Errorf("decode worker sim-%d got kv_transfer_params %v, want a prefill worker's", i, kv)
			}
		}
	}
	if prefills != 2 || decodes != 2 {
		t.Fatalf("the prefill workers got %d requests, the decode workers %d; want 2 and 2", prefills, decodes)
	}
	checkServedOnce(t, s, clientPrompt, clientCached)
}

// SGLang's flow: the prefill and the decode worker get the request at once, with the same
// bootstrap room and the prefill worker's bootstrap address.
func TestDisaggregatedServingSGLang(t *testing.T) {
	s, rec := startDisaggregatedStackWith(t, routing.ProtocolSGLang, nil)
	clientPrompt, clientCached := serveChatAndStream(t, s)
	prefillRooms, decodeRooms := map[float64]string{}, map[float64]string{}
	for i := range 4 {
		for _, b := range rec.of(i) {
			room, _ := b["bootstrap_room"].(float64)
			addr := fmt.Sprintf("%v:%v", b["bootstrap_host"], b["bootstrap_port"])
			if i < 2 {
				prefillRooms[room] = addr
				if want := strings.TrimPrefix(s.servers[i].URL, "http://"); addr != want || b["stream"] != false {
					t.Errorf("prefill worker sim-%d got bootstrap address %s (want its own, %s), stream %v", i, addr, want, b["stream"])
				}
				continue
			}
			decodeRooms[room] = addr
		}
	}
	if len(prefillRooms) != 2 || len(decodeRooms) != 2 {
		t.Fatalf("rooms: prefill %v, decode %v; want 2 each", prefillRooms, decodeRooms)
	}
	for room, addr := range decodeRooms {
		if prefillRooms[room] != addr {
			t.Errorf("a decode got room %v at %s, which no prefill had there (%v)", room, addr, prefillRooms)
		}
	}
	checkServedOnce(t, s, clientPrompt, clientCached)
}

// A prefill that fails in SGLang's flow ends the decode waiting for its room, and the call goes
// to the other prefill worker.
func TestDisaggregatedSGLangPrefillFails(t *testing.T) {
	s, _ := startDisaggregatedStackWith(t, routing.ProtocolSGLang, nil)
	if err := s.engines[0].SetFaults(sim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		resp := s.do(context.Background(), t, "/v1/chat/completions", chat("hello there", 4, false))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Usher-Prefill-Worker") != "sim-1" {
			data, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d, prefilled by %q: %s; want 200 prefilled by sim-1", resp.StatusCode, resp.Header.Get("X-Usher-Prefill-Worker"), data)
		}
	}
	if got := gatewayCounter(t, s.url, "usher_stage_requests_total", `result="failed",stage="prefill",worker="sim-0"`); got == 0 {
		t.Fatal("sim-0 was never tried: the test proves nothing")
	}
	// The decodes that waited for sim-0's rooms were ended, not left to time out.
	eventually(t, 5*time.Second, "no decode left waiting", func() bool {
		return s.engines[2].Stats().Receiving == 0 && s.engines[3].Stats().Receiving == 0
	})
}

// serveChatAndStream asks the stack for a chat answer and a stream of 12 tokens each, checks
// that a decode worker answered after a prefill worker prefilled, and returns the prompt and
// cached tokens the client was told in all.
func serveChatAndStream(t *testing.T, s *stack) (clientPrompt, clientCached int) {
	t.Helper()
	ctx := context.Background()
	prompt := strings.Repeat("the prefill worker computes this long shared prompt ", 20)
	for _, stream := range []bool{false, true} {
		resp := s.do(ctx, t, "/v1/chat/completions", strings.Replace(chat(prompt, 12, stream), `"stream":true,`, `"stream":true,"stream_options":{"include_usage":true},`, 1))
		if resp.StatusCode != http.StatusOK {
			data, _ := io.ReadAll(resp.Body)
			t.Fatalf("stream %v: status %d: %s", stream, resp.StatusCode, data)
		}
		worker, prefill := resp.Header.Get("X-Usher-Worker"), resp.Header.Get("X-Usher-Prefill-Worker")
		if (worker != "sim-2" && worker != "sim-3") || (prefill != "sim-0" && prefill != "sim-1") {
			t.Fatalf("stream %v: served by %q, prefilled by %q; want a decode and a prefill worker", stream, worker, prefill)
		}
		var c chatResponse
		var content strings.Builder
		if stream {
			events := newSSEReader(resp.Body)
			for {
				e, ok := events.next()
				if !ok || e == "[DONE]" {
					break
				}
				var chunk chatResponse
				if err := json.Unmarshal([]byte(e), &chunk); err != nil {
					t.Fatalf("event %q: %v", e, err)
				}
				if chunk.Usage != nil {
					c.Usage = chunk.Usage
				}
				for _, ch := range chunk.Choices {
					content.WriteString(ch.Delta.Content)
				}
			}
		} else {
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
				t.Fatal(err)
			}
			content.WriteString(c.Choices[0].Message.Content)
		}
		if c.Usage == nil || c.Usage.CompletionTokens != 12 || content.Len() == 0 {
			t.Fatalf("stream %v: usage %+v, content %q: want 12 tokens generated", stream, c.Usage, content.String())
		}
		clientPrompt += c.Usage.PromptTokens
		clientCached += c.Usage.PromptTokensDetails.CachedTokens
	}
	return clientPrompt, clientCached
}

// checkServedOnce checks that the decode workers pulled KV, that the client was told the cached
// tokens the prefill engines found, and that the gateway counted the prompts once.
func checkServedOnce(t *testing.T, s *stack, clientPrompt, clientCached int) {
	t.Helper()
	var received int64
	for _, e := range s.engines[2:] {
		received += e.Stats().KVReceivedTokens
	}
	if received == 0 {
		t.Fatal("no decode worker pulled KV from a prefill worker")
	}
	// The decode engines count the KV they pulled as cached; the client is told what the
	// prefill engines found in their own caches.
	prefillCached := s.engines[0].Stats().CachedPromptTokens + s.engines[1].Stats().CachedPromptTokens
	if int64(clientCached) != prefillCached {
		t.Errorf("the client was told %d cached tokens, the prefill engines found %d (the decode engines pulled %d)", clientCached, prefillCached, received)
	}
	if got := gatewayCounter(t, s.url, "usher_tokens_total", `kind="prompt"`); int(got) != clientPrompt {
		t.Fatalf("usher_tokens_total prompt: got %v, want %d, the prompts of the answers once", got, clientPrompt)
	}
}

// A prefill worker that dies is tried no more for the request: another prefill worker serves it.
func TestDisaggregatedPrefillWorkerKilled(t *testing.T) {
	s, rec := startDisaggregatedStack(t)
	// Killed once its first health check passed, so that only the requests find it dead.
	eventually(t, 10*time.Second, "sim-0's first health check", func() bool {
		return gatewayCounter(t, s.url, "usher_routing_health_checks_total", `result="pass",worker="sim-0"`) > 0
	})
	s.servers[0].CloseClientConnections()
	s.servers[0].Close()
	for range 3 {
		resp := s.do(context.Background(), t, "/v1/chat/completions", chat("hello there", 4, false))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Usher-Prefill-Worker") != "sim-1" {
			data, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d, prefilled by %q: %s; want 200 prefilled by sim-1", resp.StatusCode, resp.Header.Get("X-Usher-Prefill-Worker"), data)
		}
	}
	if got := gatewayCounter(t, s.url, "usher_stage_requests_total", `result="failed",stage="prefill",worker="sim-0"`); got == 0 {
		t.Fatal("sim-0 was never tried: the test proves nothing")
	}
	if n := len(rec.of(1)); n != 3 {
		t.Fatalf("sim-1 got %d prefills, want 3", n)
	}
}

// A tenant's own kv_transfer_params (a host to pull KV from, another request's blocks) reach
// no worker of either stage.
func TestDisaggregatedTenantTransferParamsNeverReachAWorker(t *testing.T) {
	s, rec := startDisaggregatedStack(t)
	body := `{"model":"` + model + `","max_tokens":4,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"evil.example","remote_port":1,` +
		`"remote_block_ids":[1],"remote_engine_id":"victim","remote_request_id":"victim"},"bootstrap_host":"evil.example","bootstrap_room":7,` +
		`"messages":[{"role":"user","content":"hi"}]}`
	if resp := s.do(context.Background(), t, "/v1/chat/completions", body); resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	seen := 0
	for i := range 4 {
		for _, b := range rec.of(i) {
			seen++
			data, _ := json.Marshal(b)
			if strings.Contains(string(data), "evil") || strings.Contains(string(data), "victim") || b["bootstrap_room"] != nil {
				t.Errorf("sim-%d got the tenant's members: %s", i, data)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("the workers got %d requests, want a prefill and a decode", seen)
	}
}

// Issue 29, where a request's time went: the access log of a call served disaggregated splits
// its time into the queue, the prefill, the decode's first event (KV transfer, decode queue,
// first step: one part) and the rest of the decode, which add up to no more than the whole;
// usher_disaggregated_part_seconds counts each part of each call. A whole answer's first bytes
// come with its end: its decode_first is not measured.
func TestDisaggregatedTimeParts(t *testing.T) {
	for _, protocol := range []routing.Protocol{routing.ProtocolVLLM, routing.ProtocolSGLang} {
		t.Run(string(protocol), func(t *testing.T) {
			logs := &lockedBuffer{}
			s, _ := startDisaggregatedStackWith(t, protocol, logs)
			serveChatAndStream(t, s) // a whole answer, then a stream
			var calls []map[string]any
			eventually(t, 5*time.Second, "two access log lines", func() bool {
				calls = accessLines(t, logs.String())
				return len(calls) == 2
			})
			for i, line := range calls {
				stream := i == 1
				parts := map[string]float64{}
				for _, f := range []string{"queued_ms", "prefill_ms", "decode_first_ms", "decode_ms"} {
					v, ok := line[f].(float64)
					if !ok && (f != "decode_first_ms" || stream) {
						t.Errorf("stream %v: %s is %v, want a number", stream, f, line[f])
					}
					parts[f] = v
				}
				if !stream && line["decode_first_ms"] != nil {
					t.Errorf("whole answer: decode_first_ms %v, want null (its first bytes came with its end)", line["decode_first_ms"])
				}
				if parts["prefill_ms"] <= 0 || parts["decode_ms"] <= 0 || stream && protocol == routing.ProtocolVLLM && parts["decode_first_ms"] <= 0 {
					t.Errorf("stream %v: parts %v, want the prefill, the decode and (vLLM's stream) its first event measured", stream, parts)
				}
				sum := parts["queued_ms"] + parts["prefill_ms"] + parts["decode_first_ms"] + parts["decode_ms"]
				// ms and queued_ms are whole milliseconds, rounded down.
				if total, _ := line["ms"].(float64); sum > total+1 {
					t.Errorf("stream %v: the parts %v add up to %.3f ms, more than the whole call's %v ms", stream, parts, sum, total)
				}
			}
			for part, want := range map[string]float64{"queue": 2, "prefill": 2, "decode": 2} {
				if got := gatewayCounter(t, s.url, "usher_disaggregated_part_seconds_count", `part="`+part+`"`); got != want {
					t.Errorf("usher_disaggregated_part_seconds_count{part=%q}: got %v, want %v", part, got, want)
				}
			}
			if got := gatewayCounter(t, s.url, "usher_disaggregated_part_seconds_count", `part="decode_first"`); protocol == routing.ProtocolVLLM && got != 1 {
				t.Errorf("usher_disaggregated_part_seconds_count{part=\"decode_first\"}: got %v, want 1 (the stream's)", got)
			}
		})
	}
}

// accessLines are the access log's lines (msg "request") in logs, JSON lines.
func accessLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(logs, "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == "request" {
			out = append(out, line)
		}
	}
	return out
}
