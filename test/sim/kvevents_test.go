package sim

import (
	"context"
	"encoding/binary"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// replayAll asks the engine's replay socket for every batch from seq 0 and decodes them.
func replayAll(t *testing.T, replay string) [][]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial("tcp://" + replay); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
		t.Fatal(err)
	}
	var batches [][]any
	for want := uint64(0); ; want++ {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			t.Fatalf("replay answered %d frames, want [\"\", seq, payload]", len(msg.Frames))
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if len(msg.Frames[2]) == 0 {
			if seq != ^uint64(0) {
				t.Fatalf("end of replay has seq %d, want -1", seq)
			}
			return batches
		}
		if seq != want {
			t.Fatalf("replayed seq %d, want %d", seq, want)
		}
		var batch []any
		if err := msgpack.Unmarshal(msg.Frames[2], &batch); err != nil {
			t.Fatalf("batch %d: %v", seq, err)
		}
		batches = append(batches, batch)
	}
}

// eventsOf flattens batches [ts, [event...]] into their events.
func eventsOf(t *testing.T, batches [][]any) [][]any {
	t.Helper()
	var out [][]any
	for _, b := range batches {
		if len(b) != 2 {
			t.Fatalf("batch %v is not [ts, events]", b)
		}
		if _, ok := b[0].(float64); !ok {
			t.Fatalf("batch ts %T, want a float", b[0])
		}
		for _, ev := range b[1].([]any) {
			out = append(out, ev.([]any))
		}
	}
	return out
}

func asUint(v any) uint64 {
	switch n := v.(type) {
	case uint64:
		return n
	case int64:
		return uint64(n)
	case int8:
		return uint64(n)
	case uint8:
		return uint64(n)
	case int16:
		return uint64(n)
	case uint16:
		return uint64(n)
	case int32:
		return uint64(n)
	case uint32:
		return uint64(n)
	}
	return 0
}

func TestKVEventsInVLLMsFormat(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 4
	cfg.KVCacheTokens = 8 * 4 // 8 blocks, so a second prompt evicts the first
	cfg.KVEvents = "127.0.0.1:0"
	e, srv := startEngine(t, cfg)
	_, replay := e.KVEventsAddrs()

	prompt := words("a", 13) // 3 full blocks, then a partial one
	resp := post(t, context.Background(), srv, "/v1/completions", map[string]any{"model": "demo-7b", "prompt": prompt, "max_tokens": 1})
	resp.Body.Close()
	ids := tokenize(prompt)
	var evs [][]any
	waitFor(t, "the prompt's blocks stored", func() bool {
		evs = eventsOf(t, replayAll(t, replay))
		return len(evs) > 0
	})
	first := evs[0]
	if len(first) != 7 || first[0] != "BlockStored" {
		t.Fatalf("first event %v, want BlockStored with 6 fields", first)
	}
	hashes := first[1].([]any)
	tokens := first[3].([]any)
	if len(hashes) != 3 || first[2] != nil || asUint(first[4]) != 4 || first[5] != nil || first[6] != nil {
		t.Fatalf("BlockStored %v: want 3 hashes, no parent, block_size 4, nil lora_id and medium", first)
	}
	gotTokens := make([]uint64, len(tokens))
	for i, tok := range tokens {
		gotTokens[i] = asUint(tok)
	}
	if !reflect.DeepEqual(gotTokens, ids[:12]) {
		t.Fatalf("token_ids %v, want the prompt's first 12 %v", gotTokens, ids[:12])
	}
	if h := blockHash(0, ids[:4]); asUint(hashes[0]) != h {
		t.Fatalf("first block hash %d, want the engine's %d", asUint(hashes[0]), h)
	}

	// Another prompt of 8 blocks takes every block: the first prompt's are removed.
	resp = post(t, context.Background(), srv, "/v1/completions", map[string]any{"model": "demo-7b", "prompt": words("b", 30), "max_tokens": 1})
	resp.Body.Close()
	waitFor(t, "the first prompt's blocks removed", func() bool {
		gone := map[uint64]bool{}
		for _, ev := range eventsOf(t, replayAll(t, replay)) {
			if ev[0] == "BlockRemoved" {
				for _, h := range ev[1].([]any) {
					gone[asUint(h)] = true
				}
			}
		}
		for _, h := range hashes {
			if !gone[asUint(h)] {
				return false
			}
		}
		return true
	})

	// A subscriber sees the events live: [topic, seq, payload]. Reset the cache until one
	// arrives (the subscription takes effect a moment after the dial).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, _ := e.KVEventsAddrs()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial("tcp://" + events); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got *zmq4.Msg
	go func() {
		msg, err := sub.Recv()
		if err == nil {
			mu.Lock()
			got = &msg
			mu.Unlock()
		}
	}()
	waitFor(t, "a live event", func() bool {
		if r := post(t, context.Background(), srv, "/reset_prefix_cache", map[string]any{}); r.StatusCode != http.StatusOK {
			t.Fatalf("reset_prefix_cache: status %d", r.StatusCode)
		}
		mu.Lock()
		defer mu.Unlock()
		return got != nil
	})
	if len(got.Frames) != 3 || len(got.Frames[0]) != 0 || len(got.Frames[1]) != 8 {
		t.Fatalf("live message has frames %q, want [\"\", seq, payload]", got.Frames)
	}
	var batch []any
	if err := msgpack.Unmarshal(got.Frames[2], &batch); err != nil {
		t.Fatal(err)
	}
	if evs := eventsOf(t, [][]any{batch}); len(evs) != 1 || len(evs[0]) != 1 || evs[0][0] != "AllBlocksCleared" {
		t.Fatalf("live batch %v, want one AllBlocksCleared", batch)
	}
}

func TestTokenize(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	for _, field := range []string{"prompt", "content"} {
		got := decodeJSON[struct {
			Count  int      `json:"count"`
			Tokens []uint64 `json:"tokens"`
		}](t, post(t, context.Background(), srv, "/tokenize", map[string]any{field: "one two three"}))
		if want := tokenize("one two three"); got.Count != 3 || !reflect.DeepEqual(got.Tokens, want) {
			t.Fatalf("%s: got %+v, want the 3 ids %v", field, got, want)
		}
	}
	if resp := post(t, context.Background(), srv, "/tokenize", map[string]any{}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("no prompt: status %d, want 400", resp.StatusCode)
	}
}

// TestTokenizeChat: vLLM's chat form of /tokenize renders the messages with the template the
// chat endpoint prefills (and caches the blocks of), generation prompt and all unless told not.
func TestTokenizeChat(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	msgs := []chatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: []any{map[string]any{"type": "text", "text": "hello there"}}}}
	chat := renderChat(msgs)
	for _, tt := range []struct {
		name string
		gen  any
		want []uint64
	}{
		{"generation prompt by default", nil, tokenize(chat)},
		{"generation prompt asked", true, tokenize(chat)},
		{"no generation prompt", false, tokenize(strings.TrimSuffix(chat, chatGenerationPrompt))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body := map[string]any{"model": "m", "messages": msgs}
			if tt.gen != nil {
				body["add_generation_prompt"] = tt.gen
			}
			got := decodeJSON[struct {
				Tokens []uint64 `json:"tokens"`
			}](t, post(t, context.Background(), srv, "/tokenize", body))
			if !reflect.DeepEqual(got.Tokens, tt.want) {
				t.Fatalf("got %d ids %v, want %d ids %v", len(got.Tokens), got.Tokens, len(tt.want), tt.want)
			}
		})
	}
	if len(tokenize(chat)) != len(tokenize(strings.TrimSuffix(chat, chatGenerationPrompt)))+1 {
		t.Fatal("the generation prompt is not one token of its own")
	}
}
