package test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/test/sim"
)

// kvSample returns the value of one usher_routing_kv_* series of worker (event "" for the gauge).
func kvSample(t *testing.T, g prometheus.Gatherer, name, worker, event string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" && l.GetValue() != worker || l.GetName() == "event" && l.GetValue() != event {
					continue series
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// removedBlocks counts the block hashes of every BlockRemoved an engine published, read back
// from its replay socket.
func removedBlocks(t *testing.T, e *sim.Engine) int {
	t.Helper()
	_, replay := e.KVEventsAddrs()
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
	n := 0
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) == 0 || binary.BigEndian.Uint64(msg.Frames[1]) == ^uint64(0) {
			return n
		}
		var batch struct {
			_msgpack struct{} `msgpack:",as_array"`
			TS       float64
			Events   [][]any
		}
		if err := msgpack.Unmarshal(msg.Frames[2], &batch); err != nil {
			t.Fatal(err)
		}
		for _, ev := range batch.Events {
			if ev[0] == "BlockRemoved" {
				n += len(ev[1].([]any))
			}
		}
	}
}

// direct sends a completion straight to an engine, behind usher's back.
func direct(t *testing.T, e *sim.Engine, prompt string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, prompt)
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("direct completion: status %d: %s", rec.Code, rec.Body)
	}
}

// kvEndpoints is kv_aware's endpoints setting for the stack's sims: each one's publisher and
// replay socket.
func kvEndpoints(engines []*sim.Engine) map[string]string {
	ends := map[string]string{}
	for i, e := range engines {
		events, replay := e.KVEventsAddrs()
		ends[fmt.Sprintf("sim-%d", i)] = events + "," + replay
	}
	return ends
}

func kvWords(tag string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return strings.Join(w, " ")
}

// TestKVAwareFollowsTheEnginesEvents puts usher with kv_aware in front of three sims that
// publish their KV events as vLLM does. Prompts are placed on engines behind usher's back, so
// only the events can tell where they are: a repeat of the prefix goes to the engine holding it
// (kv_hit), and stops going there once that engine evicted it (BlockRemoved) or reset its cache
// (AllBlocksCleared).
func TestKVAwareFollowsTheEnginesEvents(t *testing.T) {
	const bs = 4
	s := startStack(t, stackOptions{workers: 3, policy: "kv_aware",
		sim: func(_ int, c *sim.Config) {
			c.BlockSize = bs
			c.KVCacheTokens = 48 * bs
			c.KVEvents = "127.0.0.1:0"
		},
		routing: func(c *routing.Config, engines []*sim.Engine) {
			ends := kvEndpoints(engines)
			// The events decide only where every tenant shares the caches (see KVAware).
			c.CacheScope = routing.CacheScopeGlobal
			// Half the prompt must be held (the default is one block): an engine that evicted
			// the tail of a prefix may keep its head, which by default still counts.
			c.Models = map[string]routing.ModelConfig{model: {KVAware: routing.KVAwareConfig{Endpoints: ends, Threshold: 0.5}}}
		}})
	complete := func(prompt string) (worker, route string) {
		resp := s.do(context.Background(), t, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, prompt))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header.Get("X-Usher-Worker"), resp.Header.Get("X-Usher-Route")
	}
	stored := func(id string) float64 { return kvSample(t, s.reg, "usher_routing_kv_events_total", id, "stored") }

	// Each of sim-1 and sim-2 gets its own 32-block prefix, straight from a client of its own.
	prefixes := map[string]string{"sim-1": kvWords("one", 32*bs), "sim-2": kvWords("two", 32*bs)}
	for id, p := range prefixes {
		direct(t, s.engine(t, id), p)
		eventually(t, 10*time.Second, id+"'s blocks indexed", func() bool { return stored(id) >= 32 })
	}
	for id, p := range prefixes {
		if w, route := complete(p + " and a question"); w != id || route != string(routing.RouteKVHit) {
			t.Fatalf("a repeat of %s's prefix went to %s (%s), want %s (kv_hit)", id, w, route, id)
		}
	}

	// sim-1 evicts its prefix for another (its cache holds 48 blocks): BlockRemoved.
	e1 := s.engine(t, "sim-1")
	direct(t, e1, kvWords("three", 44*bs))
	eventually(t, 10*time.Second, "sim-1's removals applied", func() bool {
		n := removedBlocks(t, e1)
		return n >= 28 && kvSample(t, s.reg, "usher_routing_kv_events_total", "sim-1", "removed") == float64(n)
	})
	if w, route := complete(prefixes["sim-1"] + " and another question"); route == string(routing.RouteKVHit) {
		t.Fatalf("an evicted prefix still went to %s by kv_hit", w)
	}
	if w, route := complete(kvWords("three", 44*bs) + " more"); w != "sim-1" || route != string(routing.RouteKVHit) {
		t.Fatalf("the prefix sim-1 now holds went to %s (%s), want sim-1 (kv_hit)", w, route)
	}

	// sim-2 resets its cache: AllBlocksCleared.
	s.engine(t, "sim-2").ResetPrefixCache()
	eventually(t, 10*time.Second, "sim-2's index emptied", func() bool {
		return kvSample(t, s.reg, "usher_routing_kv_events_total", "sim-2", "cleared") >= 1 &&
			kvSample(t, s.reg, "usher_routing_kv_blocks", "sim-2", "") == 0
	})
	if w, route := complete(prefixes["sim-2"] + " and a last question"); route == string(routing.RouteKVHit) {
		t.Fatalf("a cleared prefix still went to %s by kv_hit", w)
	}
}

// TestKVAwareRoutesChatByTheEnginesEvents: a chat request is tokenized by the engine's own chat
// template (the messages go to /tokenize as vLLM takes them), so its blocks are the ones the
// engine published when it cached an earlier turn of the same conversation: the next turn goes
// to that engine by kv_hit, not by cache_aware's guess, and each engine tokenizes in its turn.
func TestKVAwareRoutesChatByTheEnginesEvents(t *testing.T) {
	const bs = 4
	var tokenized [3]atomic.Int64
	s := startStack(t, stackOptions{workers: 3, policy: "kv_aware",
		sim: func(_ int, c *sim.Config) {
			c.BlockSize = bs
			c.KVEvents = "127.0.0.1:0"
		},
		routing: func(c *routing.Config, engines []*sim.Engine) {
			ends := kvEndpoints(engines)
			c.CacheScope = routing.CacheScopeGlobal // the events decide only there (see KVAware)
			c.Models = map[string]routing.ModelConfig{model: {KVAware: routing.KVAwareConfig{Endpoints: ends}}}
		},
		engineHandler: func(i int, h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/tokenize" {
					tokenized[i].Add(1)
				}
				h.ServeHTTP(w, r)
			})
		}})
	chat := func(system, question string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, model, system, question)
	}
	stored := func(id string) float64 { return kvSample(t, s.reg, "usher_routing_kv_events_total", id, "stored") }

	// Each engine serves the first turn of a conversation with a long system prompt of its own,
	// straight from a client of its own: only its events can tell.
	systems := map[string]string{"sim-0": kvWords("zero", 32*bs), "sim-1": kvWords("one", 32*bs), "sim-2": kvWords("two", 32*bs)}
	for id, system := range systems {
		rec := httptest.NewRecorder()
		s.engine(t, id).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chat(system, "hello"))))
		if rec.Code != http.StatusOK {
			t.Fatalf("direct chat: status %d: %s", rec.Code, rec.Body)
		}
		eventually(t, 10*time.Second, id+"'s blocks indexed", func() bool { return stored(id) >= 32 })
	}
	for round := range 3 {
		for id, system := range systems {
			resp := s.do(context.Background(), t, "/v1/chat/completions", chat(system, fmt.Sprintf("question %d", round)))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if w, route := resp.Header.Get("X-Usher-Worker"), resp.Header.Get("X-Usher-Route"); w != id || route != string(routing.RouteKVHit) {
				t.Fatalf("round %d: a chat on %s's system prompt went to %s (%s), want %s (kv_hit)", round, id, w, route, id)
			}
		}
	}
	for i := range tokenized {
		if n := tokenized[i].Load(); n != 3 {
			t.Errorf("sim-%d tokenized %d of the 9 chats, want 3 (one in three)", i, n)
		}
	}
}
