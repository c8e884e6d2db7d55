package bench_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/test/bench"
)

func gspConfig() bench.SharedPrefixConfig {
	return bench.SharedPrefixConfig{Groups: 4, PromptsPerGroup: 5, SystemPromptLen: 60, QuestionLen: 7, OutputLen: 3}
}

func TestSharedPrefixGroupsShareSystemPrompts(t *testing.T) {
	w := bench.NewSharedPrefix(gspConfig(), 42)
	if w.Len() != 20 {
		t.Fatalf("Len: got %d, want 20", w.Len())
	}
	systems := map[string]string{} // session -> system prompt
	questions := map[string]bool{}
	var sessions []string
	for i := 0; i < w.Len(); i++ {
		it, _ := w.Next()
		sessions = append(sessions, it.Session)
		if got := len(strings.Fields(it.System)); got != 60 {
			t.Errorf("system prompt words: got %d, want 60", got)
		}
		if got := len(strings.Fields(it.Prompt)); got != 7 {
			t.Errorf("question words: got %d, want 7", got)
		}
		if it.PromptWords != 67 || it.MaxTokens != 3 {
			t.Errorf("got PromptWords %d MaxTokens %d, want 67 and 3", it.PromptWords, it.MaxTokens)
		}
		if s, ok := systems[it.Session]; ok && s != it.System {
			t.Errorf("session %s: two different system prompts in one group", it.Session)
		}
		systems[it.Session] = it.System
		if questions[it.Prompt] {
			t.Errorf("question %q repeats within one pass", it.Prompt)
		}
		questions[it.Prompt] = true
	}
	if len(systems) != 4 {
		t.Errorf("groups: got %d distinct, want 4", len(systems))
	}
	seenSystems := map[string]bool{}
	for _, s := range systems {
		if seenSystems[s] {
			t.Error("two groups share a system prompt")
		}
		seenSystems[s] = true
	}
	if sessions[0] == sessions[1] && sessions[1] == sessions[2] && sessions[2] == sessions[3] && sessions[3] == sessions[4] {
		t.Errorf("first five prompts are all of group %s: order is not shuffled across groups", sessions[0])
	}
	// The order repeats after one pass.
	again, _ := w.Next()
	first, _ := bench.NewSharedPrefix(gspConfig(), 42).Next()
	if !reflect.DeepEqual(again, first) {
		t.Error("second pass does not start where the first did")
	}
}

func TestSharedPrefixIsDeterministic(t *testing.T) {
	take := func(seed uint64) []bench.Item {
		w := bench.NewSharedPrefix(gspConfig(), seed)
		var items []bench.Item
		for i := 0; i < w.Len(); i++ {
			it, _ := w.Next()
			items = append(items, it)
		}
		return items
	}
	if !reflect.DeepEqual(take(7), take(7)) {
		t.Error("same seed, different prompts")
	}
	if reflect.DeepEqual(take(7), take(8)) {
		t.Error("different seeds, same prompts")
	}
}

func TestRandomLengths(t *testing.T) {
	tests := []struct {
		name   string
		cfg    bench.RandomConfig
		lo, hi int
	}{
		{"fixed", bench.RandomConfig{InputLen: 50, OutputLen: 10}, 50, 50},
		{"spread", bench.RandomConfig{InputLen: 100, OutputLen: 10, Spread: 0.5}, 50, 150},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := bench.NewRandom(tc.cfg, 3)
			distinct := map[int]bool{}
			prompts := map[string]bool{}
			for i := 0; i < 200; i++ {
				it, _ := w.Next()
				n := len(strings.Fields(it.Prompt))
				if n != it.PromptWords || n < tc.lo || n > tc.hi {
					t.Fatalf("prompt words: got %d (PromptWords %d), want %d..%d", n, it.PromptWords, tc.lo, tc.hi)
				}
				distinct[n] = true
				if prompts[it.Prompt] {
					t.Fatal("a random prompt repeats")
				}
				prompts[it.Prompt] = true
			}
			if tc.lo != tc.hi && len(distinct) < 20 {
				t.Errorf("got %d distinct lengths in 200, want a spread", len(distinct))
			}
		})
	}
}

func TestRunSharedPrefixSendsGroupsAsSessions(t *testing.T) {
	e := &fakeEngine{tokens: 1}
	srv := e.start(t)
	cfg := smallRandom(srv.URL, 0) // one pass by default: 4 groups x 5 prompts
	cfg.Workload = bench.WorkloadSharedPrefix
	cfg.SharedPrefix = gspConfig()
	rep := run(t, cfg)
	if rep.Overall.OK != 20 {
		t.Fatalf("ok: got %d, want 20", rep.Overall.OK)
	}
	system := map[string]string{}
	for _, s := range e.requests() {
		sid := s.header.Get("X-Session-ID")
		if len(s.body.Messages) != 2 || s.body.Messages[0].Role != "system" || s.body.Messages[1].Role != "user" {
			t.Fatalf("messages: got %+v, want a system and a user message", s.body.Messages)
		}
		if prev, ok := system[sid]; ok && prev != s.body.Messages[0].Content {
			t.Errorf("session %q: system prompts differ", sid)
		}
		system[sid] = s.body.Messages[0].Content
	}
	if len(system) != 4 {
		t.Errorf("sessions: got %d, want 4", len(system))
	}
}

func TestRunTraceWorkload(t *testing.T) {
	e := &fakeEngine{tokens: 1}
	srv := e.start(t)
	cfg := smallRandom(srv.URL, 0)
	cfg.Workload = bench.WorkloadTrace
	cfg.Endpoint = bench.EndpointCompletions
	cfg.Trace = bench.TraceConfig{File: "testdata/mooncake.jsonl", TimeScale: 20, TokenScale: 8}
	rep := run(t, cfg)
	if rep.Overall.OK != 5 || rep.Run.TimeScale != 20 || rep.Run.TokenScale != 8 {
		t.Errorf("got ok %d time scale %v token scale %v, want 5, 20, 8", rep.Overall.OK, rep.Run.TimeScale, rep.Run.TokenScale)
	}
	reqs := e.requests()
	if first, last := reqs[0].at, reqs[len(reqs)-1].at; last.Sub(first) < 120*time.Millisecond {
		t.Errorf("trace spans 3 s / 20 = 150 ms, but requests came within %v", last.Sub(first))
	}
}
