package sim

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// roleConfig is fastConfig in a role.
func roleConfig(role string) Config {
	c := fastConfig()
	c.Role = role
	c.KVTransferPerBlock = time.Microsecond
	return c
}

// startEngineAt serves an engine with an injected clock.
func startEngineAt(t testing.TB, cfg Config, now func() time.Time) (*Engine, *httptest.Server) {
	t.Helper()
	e, err := New(cfg, Options{Now: now})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	t.Cleanup(e.Close)
	return e, srv
}

// fakeClock is a settable clock for hold expiry.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// vllmAnswer is a whole chat answer with a prefill worker's kv_transfer_params.
type vllmAnswer struct {
	testResponse
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// engineError is the error body of vLLM ({"error": {...}}) or SGLang ({"object": "error", ...}).
type engineError struct {
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
	Object  string `json:"object"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}

// toyProxyPrefill is the prefill request vLLM's toy_proxy_server.py makes of a client's request.
func toyProxyPrefill(content string) map[string]any {
	return chat(content, 1, map[string]any{"stream": false, "kv_transfer_params": map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
	}})
}

// prefillVLLM runs the toy proxy's prefill step and returns the answer's kv_transfer_params.
func prefillVLLM(t *testing.T, srv *httptest.Server, content string) (vllmAnswer, map[string]any) {
	t.Helper()
	resp := post(t, t.Context(), srv, "/v1/chat/completions", toyProxyPrefill(content))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("prefill: status %d", resp.StatusCode)
	}
	a := decodeJSON[vllmAnswer](t, resp)
	if a.KVTransferParams == nil {
		t.Fatal("the prefill's answer has no kv_transfer_params")
	}
	return a, a.KVTransferParams
}

func serverPort(t *testing.T, srv *httptest.Server) int {
	t.Helper()
	u, _ := url.Parse(srv.URL)
	p, _ := strconv.Atoi(u.Port())
	return p
}

func content(a testResponse) string {
	if len(a.Choices) == 0 || a.Choices[0].Message == nil {
		return ""
	}
	return a.Choices[0].Message.Content
}

// The vLLM hand-off end to end, as toy_proxy_server.py drives it: the prefill worker answers
// one token and names its held blocks; the decode worker given those params pulls them,
// decodes the same answer an undivided engine gives, and computes only the last prompt token.
func TestVLLMHandoffDecodesWithoutPrefill(t *testing.T) {
	prefill, psrv := startEngine(t, roleConfig(RolePrefill))
	decode, dsrv := startEngine(t, roleConfig(RoleDecode))
	_, whole := startEngine(t, fastConfig())
	prompt := words("handoff", 100)

	pa, params := prefillVLLM(t, psrv, prompt)
	if got := pa.Usage.CompletionTokens; got != 1 {
		t.Errorf("prefill generated %d tokens, want 1", got)
	}
	promptLen := pa.Usage.PromptTokens
	ids, _ := params["remote_block_ids"].([]any)
	for field, want := range map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": prefill.EngineID(),
		"remote_host": "127.0.0.1", "remote_port": float64(serverPort(t, psrv)), "tp_size": float64(1),
	} {
		if got := params[field]; got != want {
			t.Errorf("kv_transfer_params.%s = %v, want %v", field, got, want)
		}
	}
	if want := (promptLen + 16) / 16; len(ids) != want { // the prompt and the token sampled
		t.Errorf("remote_block_ids has %d ids, want %d", len(ids), want)
	}
	if id, _ := params["remote_request_id"].(string); len(id) != 32 {
		t.Errorf("remote_request_id = %q, want 32 hex digits", id)
	}
	if s := prefill.Stats(); s.HeldTransfers != 1 || s.KVCacheUsage <= 0 {
		t.Errorf("prefill holds %d transfers at KV usage %v, want 1 at > 0", s.HeldTransfers, s.KVCacheUsage)
	}

	resp := post(t, t.Context(), dsrv, "/v1/chat/completions", chat(prompt, 8, map[string]any{"kv_transfer_params": params}))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("decode: status %d", resp.StatusCode)
	}
	da := decodeJSON[testResponse](t, resp)
	ref := decodeJSON[testResponse](t, post(t, t.Context(), whole, "/v1/chat/completions", chat(prompt, 8, nil)))
	if content(da) != content(ref) {
		t.Errorf("decode answered %q, an undivided engine %q", content(da), content(ref))
	}
	if first, _, _ := strings.Cut(content(da), " "); first != content(pa.testResponse) {
		t.Errorf("decode's first token %q, the prefill's %q", first, content(pa.testResponse))
	}
	if got, want := da.Usage.PromptTokensDetails.CachedTokens, promptLen-1; got != want {
		t.Errorf("decode's cached_tokens = %d, want %d", got, want)
	}
	ds := decode.Stats()
	if ds.PromptTokensComputed != 1 || ds.KVReceivedTokens != int64(promptLen-1) {
		t.Errorf("decode computed %d prompt tokens and received %d, want 1 and %d",
			ds.PromptTokensComputed, ds.KVReceivedTokens, promptLen-1)
	}
	if s := prefill.Stats(); s.HeldTransfers != 0 || s.KVCacheUsage != 0 || s.HeldExpired != 0 {
		t.Errorf("after the pull the prefill holds %d (%d expired) at KV usage %v, want 0, 0, 0",
			s.HeldTransfers, s.HeldExpired, s.KVCacheUsage)
	}
}

// A decode worker refuses a transfer it cannot have as vLLM does by default
// (kv_load_failure_policy "fail": 500 InternalServerError, or an error event on a stream), and
// the refusal consumes nothing.
func TestVLLMRefusesUnknownExpiredOrPulledTransfers(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	pcfg := roleConfig(RolePrefill)
	pcfg.KVHoldTimeout = time.Minute
	prefill, psrv := startEngineAt(t, pcfg, clock.now)
	decode, dsrv := startEngine(t, roleConfig(RoleDecode))
	prompt := words("refuse", 40)

	with := func(params map[string]any, change map[string]any) map[string]any {
		p := map[string]any{}
		for k, v := range params {
			p[k] = v
		}
		for k, v := range change {
			p[k] = v
		}
		return p
	}
	refused := func(t *testing.T, body map[string]any) {
		t.Helper()
		resp := post(t, t.Context(), dsrv, "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", resp.StatusCode)
		}
		got := decodeJSON[engineError](t, resp)
		if got.Error == nil || got.Error.Type != "InternalServerError" || got.Error.Code != 500 ||
			!strings.HasPrefix(got.Error.Message, "Internal server error") {
			t.Fatalf("error body %+v, want vLLM's InternalServerError", got.Error)
		}
	}

	_, params := prefillVLLM(t, psrv, prompt)
	t.Run("unknown request id", func(t *testing.T) {
		refused(t, chat(prompt, 4, map[string]any{"kv_transfer_params": with(params, map[string]any{"remote_request_id": "0123"})}))
	})
	t.Run("another engine", func(t *testing.T) {
		refused(t, chat(prompt, 4, map[string]any{"kv_transfer_params": with(params, map[string]any{"remote_engine_id": "other"})}))
	})
	t.Run("other block ids", func(t *testing.T) {
		refused(t, chat(prompt, 4, map[string]any{"kv_transfer_params": with(params, map[string]any{"remote_block_ids": []int{7}})}))
	})
	t.Run("another prompt", func(t *testing.T) {
		refused(t, chat(words("other", 40), 4, map[string]any{"kv_transfer_params": params}))
	})
	if s := prefill.Stats(); s.HeldTransfers != 1 {
		t.Fatalf("refused pulls took the hold: %d held, want 1", s.HeldTransfers)
	}
	t.Run("replayed", func(t *testing.T) {
		resp := post(t, t.Context(), dsrv, "/v1/chat/completions", chat(prompt, 4, map[string]any{"kv_transfer_params": params}))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("first pull: status %d", resp.StatusCode)
		}
		resp.Body.Close()
		refused(t, chat(prompt, 4, map[string]any{"kv_transfer_params": params}))
	})
	t.Run("expired", func(t *testing.T) {
		_, params := prefillVLLM(t, psrv, prompt)
		clock.advance(time.Minute)
		refused(t, chat(prompt, 4, map[string]any{"kv_transfer_params": params}))
		if s := prefill.Stats(); s.HeldTransfers != 0 || s.HeldExpired != 1 || s.KVCacheUsage != 0 {
			t.Errorf("prefill holds %d (%d expired) at KV usage %v, want 0 (1) at 0", s.HeldTransfers, s.HeldExpired, s.KVCacheUsage)
		}
	})
	t.Run("streamed", func(t *testing.T) {
		resp := post(t, t.Context(), dsrv, "/v1/chat/completions", chat(prompt, 4, map[string]any{
			"stream": true, "kv_transfer_params": with(params, map[string]any{"remote_request_id": "0123"})}))
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200 (the stream's headers go first)", resp.StatusCode)
		}
		ev, err := sseReader{r: bufio.NewReader(resp.Body)}.next()
		if err != nil || !strings.Contains(ev, `"InternalServerError"`) {
			t.Fatalf("first event %q (%v), want vLLM's error", ev, err)
		}
	})
	if got := decode.Stats().KVTransferFailures; got != 7 {
		t.Errorf("decode counted %d failed transfers, want 7", got)
	}
}

// A decode worker prefills a request that asks for no transfer, or names one incompletely
// (NixlConnector then does not use the connector), itself.
func TestDecodeRolePrefillsPlainAndIncompleteRequests(t *testing.T) {
	decode, dsrv := startEngine(t, roleConfig(RoleDecode))
	prompt := words("plain", 30)
	total := 0
	for name, extra := range map[string]map[string]any{
		"plain":      nil,
		"incomplete": {"kv_transfer_params": map[string]any{"do_remote_prefill": true, "remote_block_ids": []int{1, 2}}},
	} {
		resp := post(t, t.Context(), dsrv, "/v1/chat/completions", chat(prompt, 4, extra))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", name, resp.StatusCode)
		}
		a := decodeJSON[testResponse](t, resp)
		total += a.Usage.PromptTokens - a.Usage.PromptTokensDetails.CachedTokens
	}
	if s := decode.Stats(); s.PromptTokensComputed != int64(total) || s.KVReceivedTokens != 0 {
		t.Errorf("decode computed %d prompt tokens and received %d, want %d and 0", s.PromptTokensComputed, s.KVReceivedTokens, total)
	}
}

// SGLang's flow, as its mini load balancer drives it: the same request with the same
// bootstrap_host, bootstrap_port and bootstrap_room goes to both workers at once; the decode
// worker waits for the room's prefill and decodes without it.
func TestSGLangRoomHandoff(t *testing.T) {
	prefill, psrv := startEngine(t, roleConfig(RolePrefill))
	decode, dsrv := startEngine(t, roleConfig(RoleDecode))
	_, whole := startEngine(t, fastConfig())
	prompt := words("room", 64)
	body := chat(prompt, 6, map[string]any{
		"bootstrap_host": "127.0.0.1", "bootstrap_port": serverPort(t, psrv), "bootstrap_room": uint64(1) << 62})

	decoded := make(chan *http.Response, 1)
	go func() {
		resp, err := send(t.Context(), dsrv, "/v1/chat/completions", body)
		if err != nil {
			t.Errorf("decode: %v", err)
		}
		decoded <- resp
	}()
	// The decode worker asks before the prefill is done.
	waitFor(t, "the decode worker waiting for its room", func() bool { return decode.Stats().Receiving == 1 })
	presp := post(t, t.Context(), psrv, "/v1/chat/completions", body)
	if presp.StatusCode != http.StatusOK {
		t.Fatalf("prefill: status %d", presp.StatusCode)
	}
	pa := decodeJSON[testResponse](t, presp)
	if pa.Usage.CompletionTokens != 1 {
		t.Errorf("prefill generated %d tokens, want 1", pa.Usage.CompletionTokens)
	}
	dresp := <-decoded
	if dresp == nil {
		return
	}
	if dresp.StatusCode != http.StatusOK {
		t.Fatalf("decode: status %d", dresp.StatusCode)
	}
	da := decodeJSON[testResponse](t, dresp)
	ref := decodeJSON[testResponse](t, post(t, t.Context(), whole, "/v1/chat/completions", chat(prompt, 6, nil)))
	if content(da) != content(ref) {
		t.Errorf("decode answered %q, an undivided engine %q", content(da), content(ref))
	}
	if s := decode.Stats(); s.PromptTokensComputed != 1 || s.KVReceivedTokens != int64(pa.Usage.PromptTokens-1) {
		t.Errorf("decode computed %d prompt tokens and received %d, want 1 and %d", s.PromptTokensComputed, s.KVReceivedTokens, pa.Usage.PromptTokens-1)
	}
	if s := prefill.Stats(); s.HeldTransfers != 0 || s.KVCacheUsage != 0 {
		t.Errorf("prefill holds %d at KV usage %v after the pull, want 0 at 0", s.HeldTransfers, s.KVCacheUsage)
	}
}

// SGLang's refusals: a decode worker whose room never gets its prefill fails the request
// after its wait (500 "Decode transfer failed ..."), and a disaggregated request without a
// room gets 400.
func TestSGLangRefusals(t *testing.T) {
	_, psrv := startEngine(t, roleConfig(RolePrefill))
	dcfg := roleConfig(RoleDecode)
	dcfg.KVWaitTimeout = 50 * time.Millisecond
	decode, dsrv := startEngine(t, dcfg)
	port := serverPort(t, psrv)
	tests := []struct {
		name   string
		srv    *httptest.Server
		fields map[string]any
		status int
		msg    string
	}{
		{"room never prefilled", dsrv, map[string]any{"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 7},
			500, "Decode transfer failed for request bootstrap_room=7"},
		{"decode without room", dsrv, map[string]any{"bootstrap_host": "127.0.0.1", "bootstrap_port": port},
			400, "Disaggregated request received without bootstrap room id"},
		{"prefill without room", psrv, map[string]any{"bootstrap_host": "127.0.0.1"},
			400, "Disaggregated request received without bootstrap room id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, t.Context(), tt.srv, "/v1/chat/completions", chat(words("lost", 20), 4, tt.fields))
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			got := decodeJSON[engineError](t, resp)
			if got.Object != "error" || got.Code != tt.status || !strings.HasPrefix(got.Message, tt.msg) {
				t.Errorf("error %+v, want SGLang's %d %q", got, tt.status, tt.msg)
			}
		})
	}
	if s := decode.Stats(); s.KVTransferFailures != 1 || s.Receiving != 0 {
		t.Errorf("decode counted %d failed transfers with %d still receiving, want 1 and 0", s.KVTransferFailures, s.Receiving)
	}
}

// Hostile disaggregation fields get 400 before anything is pulled or held, and what a prefill
// worker holds stays bounded by MaxHeldTransfers however many transfers nobody pulls.
func TestHostileDisaggregationFields(t *testing.T) {
	pcfg := roleConfig(RolePrefill)
	pcfg.MaxHeldTransfers = 3
	prefill, psrv := startEngine(t, pcfg)
	decode, dsrv := startEngine(t, roleConfig(RoleDecode))
	good := map[string]any{"do_remote_prefill": true, "remote_engine_id": "e", "remote_request_id": "r",
		"remote_block_ids": []int{1}, "remote_host": "127.0.0.1", "remote_port": 1}
	params := func(k string, v any) map[string]any {
		p := map[string]any{}
		for k, v := range good {
			p[k] = v
		}
		p[k] = v
		return map[string]any{"kv_transfer_params": p}
	}
	huge := make([]int, 100_000)
	tests := []struct {
		name   string
		srv    *httptest.Server
		fields map[string]any
	}{
		{"negative block id", dsrv, params("remote_block_ids", []int{-1})},
		{"block id past int32", dsrv, params("remote_block_ids", []int64{1 << 40})},
		{"more block ids than a request has", dsrv, params("remote_block_ids", huge)},
		{"port past 65535", dsrv, params("remote_port", 70000)},
		{"port negative", dsrv, params("remote_port", -1)},
		{"host with a path", dsrv, params("remote_host", "evil.example/x?")},
		{"huge engine id", dsrv, params("remote_engine_id", strings.Repeat("e", 10_000))},
		{"room past 2^63-1", dsrv, map[string]any{"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": uint64(1) << 63}},
		{"negative room", psrv, map[string]any{"bootstrap_room": -1}},
		{"room not an integer", psrv, map[string]any{"bootstrap_room": 1.5}},
		{"bootstrap port past 65535", dsrv, map[string]any{"bootstrap_host": "h", "bootstrap_port": 1 << 20, "bootstrap_room": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, t.Context(), tt.srv, "/v1/chat/completions", chat("hostile", 2, tt.fields))
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
		})
	}
	if s := decode.Stats(); s.Receiving != 0 || s.KVTransferFailures != 0 {
		t.Errorf("a malformed request was pulled: %d receiving, %d failed", s.Receiving, s.KVTransferFailures)
	}

	// A flood of prefills nobody pulls.
	for i := range 10 {
		resp := post(t, t.Context(), psrv, "/v1/chat/completions", toyProxyPrefill(words("flood"+strconv.Itoa(i), 40)))
		resp.Body.Close()
	}
	for i := range 5 {
		resp := post(t, t.Context(), psrv, "/v1/chat/completions", chat(words("rooms"+strconv.Itoa(i), 40), 2, map[string]any{"bootstrap_room": i}))
		resp.Body.Close()
	}
	if s := prefill.Stats(); s.HeldTransfers != 3 || s.HeldExpired != 12 {
		t.Errorf("prefill holds %d with %d pushed out, want 3 and 12", s.HeldTransfers, s.HeldExpired)
	}
	// A room already held is refused, not overwritten.
	resp := post(t, t.Context(), psrv, "/v1/chat/completions", chat(words("again", 40), 2, map[string]any{"bootstrap_room": 4}))
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a second prefill of a held room: status %d, want 400", resp.StatusCode)
	}

	// The pull endpoint itself.
	for name, body := range map[string]string{
		"not JSON":       `{`,
		"names nothing":  `{}`,
		"unknown":        `{"request_id":"nope","engine_id":"x"}`,
		"room not held":  `{"room":99}`,
		"huge block ids": `{"request_id":"x","block_ids":[` + strings.Repeat("1,", 600_000) + `1]}`,
	} {
		resp, err := http.Post(psrv.URL+"/kv/pull", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("pull %s: status %d, want 4xx", name, resp.StatusCode)
		}
	}
}

// Role both, the default, is today's engine: it ignores every disaggregation field, holds
// nothing and pulls nothing.
func TestRoleBothIgnoresDisaggregationFields(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	if got := e.Config().Role; got != RoleBoth {
		t.Fatalf("default role %q, want %q", got, RoleBoth)
	}
	prompt := words("both", 40)
	for name, extra := range map[string]map[string]any{
		"do_remote_decode":  toyProxyPrefill(prompt),
		"do_remote_prefill": {"kv_transfer_params": map[string]any{"do_remote_prefill": true, "remote_engine_id": "e", "remote_request_id": "r", "remote_block_ids": []int{1}, "remote_host": "127.0.0.1", "remote_port": 1}},
		"bootstrap room":    {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 3},
		"room missing":      {"bootstrap_host": "127.0.0.1"},
	} {
		body := chat(prompt, 3, extra)
		if name == "do_remote_decode" {
			body = extra
		}
		resp := post(t, t.Context(), srv, "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", name, resp.StatusCode)
		}
		if a := decodeJSON[vllmAnswer](t, resp); a.KVTransferParams != nil {
			t.Errorf("%s: answer has kv_transfer_params %v", name, a.KVTransferParams)
		}
	}
	if s := e.Stats(); s.HeldTransfers != 0 || s.KVReceivedTokens != 0 || s.Completed != 4 || s.KVCacheUsage != 0 {
		t.Errorf("role both held %d, received %d tokens, completed %d, KV usage %v; want 0, 0, 4, 0",
			s.HeldTransfers, s.KVReceivedTokens, s.Completed, s.KVCacheUsage)
	}
}

// /metrics keeps its meaning in both roles: a prefill worker's held blocks are KV in use, and
// a decode worker's request pulling its KV counts as waiting.
func TestDisaggregationMetrics(t *testing.T) {
	_, psrv := startEngine(t, roleConfig(RolePrefill))
	dcfg := roleConfig(RoleDecode)
	dcfg.KVTransferPerBlock = time.Second // the request stays in transfer until cancelled
	decode, dsrv := startEngine(t, dcfg)
	prompt := words("metrics", 40)
	_, params := prefillVLLM(t, psrv, prompt)
	if v := scrape(t, psrv, `vllm:kv_cache_usage_perc{model_name="demo-7b"}`); v == "0" {
		t.Errorf("prefill's kv_cache_usage_perc is 0 while it holds a transfer")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := send(ctx, dsrv, "/v1/chat/completions", chat(prompt, 2, map[string]any{"kv_transfer_params": params}))
		if err == nil {
			resp.Body.Close()
		}
	}()
	prefill := psrv.Config.Handler.(*Engine)
	waitFor(t, "the pull", func() bool { return decode.Stats().Receiving == 1 && prefill.Stats().HeldTransfers == 0 })
	if v := scrape(t, dsrv, `vllm:num_requests_waiting{model_name="demo-7b"}`); v != "1" {
		t.Errorf("decode's num_requests_waiting = %s during the transfer, want 1", v)
	}
	if v := scrape(t, psrv, `vllm:kv_cache_usage_perc{model_name="demo-7b"}`); v != "0" {
		t.Errorf("prefill's kv_cache_usage_perc = %s after the pull, want 0", v)
	}
	cancel()
	<-done
	waitFor(t, "the cancelled pull to end", func() bool { return decode.Stats().Receiving == 0 })
}
