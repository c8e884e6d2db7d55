package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A batch request that wants a whole answer goes to llama-server as a stream (the engine notices
// a cancelled stream at its next token, a cancelled whole answer only at its once-a-second
// check), and usher assembles the whole answer: the client gets what the engine answers a
// direct whole request, token for token. Preempted by an interactive request, the batch request
// is cancelled at the engine, sent again and still answered whole.
func TestEngineWholeBatchAnswerIsAssembledFromAStream(t *testing.T) {
	s := startEngineStack(t, engineStackOptions{workers: 1, slots: 1})
	e := s.engines[0]
	body := engineChat("count to ten", 24, false)

	direct := whole[chatAnswer](t, func() (*http.Response, error) {
		return http.Post(e.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	})
	via := whole[chatAnswer](t, func() (*http.Response, error) {
		return s.post(context.Background(), http.DefaultClient, bulkKey, "batch", body)
	})
	if via.Object != "chat.completion" || len(via.Choices) != 1 || len(direct.Choices) != 1 {
		t.Fatalf("through usher %+v, direct %+v", via, direct)
	}
	if got, want := via.Choices[0], direct.Choices[0]; got.Message != want.Message || got.FinishReason != want.FinishReason {
		t.Errorf("through usher %+v, want the engine's own whole answer %+v", got, want)
	}
	if via.Usage.CompletionTokens != direct.Usage.CompletionTokens || via.Usage.PromptTokens != direct.Usage.PromptTokens {
		t.Errorf("usage through usher %+v, direct %+v", via.Usage, direct.Usage)
	}
	if !strings.HasPrefix(via.ID, "chatcmpl-") || via.Created == 0 {
		t.Errorf("id %q, created %d through usher, want the engine's", via.ID, via.Created)
	}
	if via.Model != direct.Model {
		t.Errorf("model through usher %q, direct %q", via.Model, direct.Model)
	}

	// The same for /v1/completions, whose chunks carry text instead of a delta.
	completion := fmt.Sprintf(`{"model":%q,"prompt":"one two three","max_tokens":12,"temperature":0}`, engineModel)
	post := func(url string, h map[string]string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(completion))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		return http.DefaultClient.Do(req)
	}
	directText := whole[completionAnswer](t, func() (*http.Response, error) { return post(e.URL, nil) })
	viaText := whole[completionAnswer](t, func() (*http.Response, error) {
		return post(s.gw.url, map[string]string{"Authorization": "Bearer " + bulkKey, "X-Usher-Priority": "batch"})
	})
	if viaText.Object != "text_completion" || len(viaText.Choices) != 1 || len(directText.Choices) != 1 ||
		viaText.Choices[0] != directText.Choices[0] || viaText.Usage != directText.Usage {
		t.Errorf("completion through usher %+v, want the engine's own %+v", viaText, directText)
	}

	// Preemption: the one slot holds a long batch answer; an interactive request takes it.
	long := make(chan chatAnswer, 1)
	go func() {
		long <- whole[chatAnswer](t, func() (*http.Response, error) {
			return s.post(context.Background(), http.DefaultClient, bulkKey, "batch", engineChat("a very long answer please", 200, false))
		})
	}()
	eventually(t, 10*time.Second, "the engine generates the batch answer", func() bool {
		return metrics(t, e).RequestsProcessing == 1
	})
	slots, err := e.Slots(context.Background())
	if err != nil || len(slots) != 1 || !slots[0].IsProcessing || !slots[0].Params.Stream {
		t.Fatalf("the engine's slot %+v (%v): want it streaming the batch request that asked for a whole answer", slots, err)
	}
	inter := whole[chatAnswer](t, func() (*http.Response, error) {
		return s.post(context.Background(), http.DefaultClient, chatKey, "interactive", engineChat("hi", 4, false))
	})
	if len(inter.Choices) != 1 {
		t.Fatalf("interactive answer %+v", inter)
	}
	if !strings.Contains(e.Log(), "cancel task") {
		t.Fatalf("the engine logged no cancel of the preempted batch answer; log tail:\n%s", e.Log())
	}
	select {
	case a := <-long:
		if len(a.Choices) != 1 || a.Usage.CompletionTokens != 200 || a.Choices[0].FinishReason != "length" {
			t.Errorf("the preempted batch request, sent again: %+v, want its whole answer of 200 tokens", a)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the preempted batch request was not answered")
	}
}

// chatAnswer is a whole chat completion as the tests read it.
type chatAnswer struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Created int64  `json:"created"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage answerUsage `json:"usage"`
}

// answerUsage is an answer's usage as the tests read it.
type answerUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// whole makes the request and decodes its 200 answer as a T; it fails t otherwise (with Errorf:
// it may run on another goroutine).
func whole[T any](t *testing.T, do func() (*http.Response, error)) T {
	t.Helper()
	var a T
	resp, err := do()
	if err != nil {
		t.Error(err)
		return a
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &a) != nil {
		t.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return a
}

// completionAnswer is a whole text completion as the tests read it.
type completionAnswer struct {
	Object  string `json:"object"`
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage answerUsage `json:"usage"`
}
