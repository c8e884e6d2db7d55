package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Issue 14, prefill-heavy batch: beside interactive traffic, a long batch prompt reaches a real
// llama-server in pieces (routing.concurrency.prefill_piece_tokens, learnt by default), each a
// request the engine keeps in its slot's prompt cache. The engine computes the prompt about once,
// not once a piece; the client gets one answer with the whole prompt's usage; and the cached
// tokens usher counts are what the engine held before the pieces, not what they put there.
func TestEnginePrefillsALongBatchPromptInPieces(t *testing.T) {
	s := startEngineStack(t, engineStackOptions{workers: 1, slots: 2})
	ctx := context.Background()
	post := func(class, body string) chatResponse {
		t.Helper()
		resp, err := s.post(ctx, http.DefaultClient, chatKey, class, body)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s request: status %d: %s", class, resp.StatusCode, data)
		}
		var c chatResponse
		if err := json.Unmarshal(data, &c); err != nil || c.Usage == nil {
			t.Fatalf("%s answer without usage: %s", class, data)
		}
		return c
	}
	post("interactive", engineChat("hello there", 4, false))

	words := make([]string, 600)
	for i := range words {
		words[i] = fmt.Sprintf("item%d", i)
	}
	before := metrics(t, s.engines[0])
	cachedBefore := gatewayCounter(t, s.gw.url, "usher_tokens_total", `kind="cached"`)
	c := post("batch", engineChat(strings.Join(words, " "), 4, false))
	computed := metrics(t, s.engines[0]).PromptTokens - before.PromptTokens
	pieces := gatewayCounter(t, s.gw.url, "usher_prefill_pieces_total", "")
	counted := gatewayCounter(t, s.gw.url, "usher_tokens_total", `kind="cached"`) - cachedBefore
	prompt := float64(c.Usage.PromptTokens)
	t.Logf("prompt %v tokens in %v pieces; the engine computed %v prompt tokens; it reported %d cached, usher counted %v",
		prompt, pieces, computed, c.Usage.PromptTokensDetails.CachedTokens, counted)
	if pieces < 3 {
		t.Fatalf("%v pieces, want at least 3 for a prompt of %v tokens beside interactive prompts of a few", pieces, prompt)
	}
	// Without the slot's cache every piece would compute its whole prefix again: about
	// (pieces+1)/2 times the prompt.
	if computed > 1.2*prompt {
		t.Errorf("the engine computed %v prompt tokens for a prompt of %v: the pieces were not reused", computed, prompt)
	}
	if counted > 0.5*prompt {
		t.Errorf("usher counted %v cached tokens of %v: the pieces' own cache counts as the request's", counted, prompt)
	}
}

// gatewayCounter sums the samples of the counter name on the gateway's /metrics whose labels
// contain label ("" for all).
func gatewayCounter(t *testing.T, url, name, label string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) || !strings.Contains(series, label) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("%s: %v", sc.Text(), err)
		}
		sum += v
	}
	return sum
}
