package routing

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Hand-built events in vLLM's layout (msgspec array_like, tag first).

func stored(hashes []any, parent any, tokens []uint64, blockSize int, tail ...any) []any {
	return append([]any{"BlockStored", hashes, parent, tokens, blockSize}, tail...)
}

func removed(hashes ...any) []any { return []any{"BlockRemoved", hashes, nil} }

func cleared() []any { return []any{"AllBlocksCleared"} }

// kvPayload encodes events as one batch [ts, events] (plus extra trailing elements), integers
// in their smallest form as vLLM's msgspec writes them.
func kvPayload(t testing.TB, events []any, extra ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(append([]any{1732390000.5, events}, extra...)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func applyPayload(t testing.TB, x *kvIndex, payload []byte) {
	t.Helper()
	var b kvBatch
	if err := decodeKVBatch(payload, &b); err != nil {
		t.Fatalf("decodeKVBatch: %v", err)
	}
	x.apply(&b)
}

// match returns the number of leading full blocks of tokens x holds.
func (x *kvIndex) match(tokens []uint64) int {
	var h kvHasher
	return x.matchKeys(h.blockKeys(nil, tokens, x.blockSize))
}

// seqTokens returns n token ids from start.
func seqTokens(start, n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(start + i)
	}
	return ids
}

func TestKVIndexFollowsEvents(t *testing.T) {
	const bs = 4
	prompt := seqTokens(100, 4*bs+2) // 4 full blocks and a partial one
	x := newKVIndex(0, 1000)
	if got := x.match(prompt); got != 0 {
		t.Fatalf("empty index matched %d blocks", got)
	}
	// The first two blocks in one event (integer hashes, lora_id and medium given as nil), the
	// next two in another chained on the engine's hash of block 2 (bytes hashes, the trailing
	// defaults left out as msgspec's omit_defaults does).
	applyPayload(t, x, kvPayload(t, []any{
		stored([]any{11, 12}, nil, prompt[:2*bs], bs, nil, nil),
	}))
	if got := x.match(prompt); got != 2 {
		t.Fatalf("after 2 blocks stored: matched %d blocks, want 2", got)
	}
	applyPayload(t, x, kvPayload(t, []any{
		stored([]any{[]byte("h3"), []byte("h4")}, 12, prompt[2*bs:4*bs], bs),
	}, 0 /* data-parallel rank */))
	if got := x.match(prompt); got != 4 {
		t.Fatalf("after 4 blocks stored: matched %d blocks, want 4", got)
	}
	other := append(append([]uint64{}, prompt[:bs]...), seqTokens(900, 3*bs)...)
	if got := x.match(other); got != 1 {
		t.Fatalf("a prompt sharing only block 1: matched %d blocks, want 1", got)
	}
	applyPayload(t, x, kvPayload(t, []any{removed([]byte("h3"))}))
	if got := x.match(prompt); got != 2 {
		t.Fatalf("after block 3 removed: matched %d blocks, want 2", got)
	}
	applyPayload(t, x, kvPayload(t, []any{cleared()}))
	if got, n := x.match(prompt), x.blocks(); got != 0 || n != 0 {
		t.Fatalf("after AllBlocksCleared: matched %d blocks of %d indexed, want none", got, n)
	}
}

// TestKVIndexReadsEveryIntegerWidth: token ids, hashes and block sizes may come in any msgpack
// integer form (msgspec compacts them; other encoders write uint64).
func TestKVIndexReadsEveryIntegerWidth(t *testing.T) {
	ids := []uint64{5, 200, 70_000, 5_000_000_000, 1 << 63, 300, 127, 128}
	for _, compact := range []bool{false, true} {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.UseCompactInts(compact)
		ev := []any{"BlockStored", []any{int64(-7), uint64(1 << 40)}, nil, ids, int8(4)}
		if err := enc.Encode([]any{1.5, []any{ev}}); err != nil {
			t.Fatal(err)
		}
		var b kvBatch
		if err := decodeKVBatch(buf.Bytes(), &b); err != nil {
			t.Fatalf("compact %v: %v", compact, err)
		}
		got := b.events[0]
		var tokens []uint64
		for i := 0; i+8 <= len(got.tokens); i += 8 {
			tokens = append(tokens, binary.LittleEndian.Uint64(got.tokens[i:]))
		}
		if !slices.Equal(tokens, ids) || got.blockSize != 4 || !slices.Equal(got.hashes, []uint64{^uint64(6), 1 << 40}) {
			t.Fatalf("compact %v: got tokens %v hashes %v block size %d", compact, tokens, got.hashes, got.blockSize)
		}
	}
}

// TestDecodeKVBatchReadsLongRunsOfEveryWidth: token ids and hashes of every width, in runs long
// enough that most of them go through the fast loop (putUints) and the last ones, near the end
// of the payload, through the checked reader, decode to what was encoded.
func TestDecodeKVBatchReadsLongRunsOfEveryWidth(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	value := func() uint64 { // each width about as often: fixint, uint8 to uint64
		return rng.Uint64() >> []int{57, 56, 48, 32, 0}[rng.IntN(5)]
	}
	for _, compact := range []bool{false, true} {
		for round := range 50 {
			ids := make([]uint64, 1+rng.IntN(300))
			hashes := make([]uint64, 1+rng.IntN(40))
			for i := range ids {
				ids[i] = value()
			}
			for i := range hashes {
				hashes[i] = value()
			}
			var buf bytes.Buffer
			enc := msgpack.NewEncoder(&buf)
			enc.UseCompactInts(compact)
			// The tokens end 3 bytes before the payload does: the last ones are read checked.
			if err := enc.Encode([]any{1.5, []any{removed(toAny(hashes)...), stored(toAny(hashes), nil, ids, 1)}}); err != nil {
				t.Fatal(err)
			}
			var b kvBatch
			if err := decodeKVBatch(buf.Bytes(), &b); err != nil {
				t.Fatalf("compact %v round %d: %v", compact, round, err)
			}
			if got := b.events[0].hashes; !slices.Equal(got, hashes) {
				t.Fatalf("compact %v round %d: removed hashes %v, want %v", compact, round, got, hashes)
			}
			got := b.events[1]
			var tokens []uint64
			for i := 0; i+8 <= len(got.tokens); i += 8 {
				tokens = append(tokens, binary.LittleEndian.Uint64(got.tokens[i:]))
			}
			if !slices.Equal(tokens, ids) || !slices.Equal(got.hashes, hashes) {
				t.Fatalf("compact %v round %d: tokens %v hashes %v, want %v and %v", compact, round, tokens, got.hashes, ids, hashes)
			}
		}
	}
}

func toAny(vs []uint64) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return out
}

func TestKVIndexIgnoresWhatAPromptCannotHit(t *testing.T) {
	const bs = 2
	prompt := seqTokens(1, 3*bs)
	tests := []struct {
		name   string
		events []any
		want   int
	}{
		{"unknown parent (a missed event)", []any{stored([]any{2}, 99, prompt[bs:2*bs], bs)}, 0},
		{"a LoRA adapter's blocks", []any{stored([]any{1}, nil, prompt[:bs], bs, 7, nil)}, 0},
		{"offloaded to CPU", []any{stored([]any{1}, nil, prompt[:bs], bs, nil, "CPU")}, 0},
		{"GPU medium", []any{stored([]any{1}, nil, prompt[:bs], bs, nil, "GPU")}, 1},
		{"fewer tokens than blocks", []any{stored([]any{1, 2}, nil, prompt[:bs+1], bs)}, 1},
		{"a removal on CPU leaves the GPU copy", []any{stored([]any{1}, nil, prompt[:bs], bs), []any{"BlockRemoved", []any{1}, "CPU"}}, 1},
		{"fields of a later version", []any{stored([]any{1}, nil, prompt[:bs], bs, nil, nil, "extra", 3)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newKVIndex(0, 100)
			applyPayload(t, x, kvPayload(t, tt.events))
			if got := x.match(prompt); got != tt.want {
				t.Fatalf("matched %d blocks, want %d", got, tt.want)
			}
		})
	}
}

func TestKVIndexBlockSize(t *testing.T) {
	prompt := seqTokens(1, 8)
	t.Run("configured: another size is dropped", func(t *testing.T) {
		x := newKVIndex(4, 100)
		applyPayload(t, x, kvPayload(t, []any{stored([]any{1}, nil, prompt[:2], 2)}))
		if x.blocks() != 0 || x.match(prompt) != 0 {
			t.Fatalf("indexed %d blocks of size 2 in an index of size 4", x.blocks())
		}
	})
	t.Run("learned: a new size starts over", func(t *testing.T) {
		x := newKVIndex(0, 100)
		applyPayload(t, x, kvPayload(t, []any{stored([]any{1}, nil, prompt[:2], 2)}))
		applyPayload(t, x, kvPayload(t, []any{stored([]any{5}, nil, prompt[:4], 4)}))
		if got, n := x.match(prompt), x.blocks(); got != 1 || n != 1 {
			t.Fatalf("matched %d blocks of %d indexed, want 1 of 1", got, n)
		}
	})
}

func TestKVIndexBoundedForgetsOldestFirst(t *testing.T) {
	const bs, max = 2, 8
	x := newKVIndex(0, max)
	var prompts [][]uint64
	for p := range 20 { // 20 one-block prompts, 2 blocks each: far past the bound
		prompt := seqTokens(1000*p, 2*bs)
		prompts = append(prompts, prompt)
		applyPayload(t, x, kvPayload(t, []any{stored([]any{2 * p, 2*p + 1}, nil, prompt, bs)}))
		if x.blocks() > max {
			t.Fatalf("after prompt %d: %d blocks indexed, bound %d", p, x.blocks(), max)
		}
	}
	if got := x.match(prompts[19]); got != 2 {
		t.Fatalf("newest prompt matched %d blocks, want 2", got)
	}
	if got := x.match(prompts[0]); got != 0 {
		t.Fatalf("oldest prompt matched %d blocks, want 0 (forgotten)", got)
	}
	if len(x.order)-x.head > 2*max+1024 {
		t.Fatalf("insertion order holds %d entries for %d blocks", len(x.order)-x.head, x.blocks())
	}
}

func TestDecodeKVBatchRefusesMalformed(t *testing.T) {
	raw := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	tests := []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"not an array", raw("x")},
		{"no events", raw([]any{1.0})},
		{"events not an array", raw([]any{1.0, 3})},
		{"untagged event", raw([]any{1.0, []any{[]any{}}})},
		{"unknown tag", raw([]any{1.0, []any{[]any{"BlockMoved", []any{1}}}})},
		{"stored without tokens", raw([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil}}})},
		{"zero block size", raw([]any{1.0, []any{stored([]any{1}, nil, []uint64{1}, 0)}})},
		{"hash of a map", raw([]any{1.0, []any{removed(map[string]int{"a": 1})}})},
		{"token id a string", raw([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{"t"}, 1}}})},
		{"truncated", raw([]any{1.0, []any{stored([]any{1, 2}, nil, seqTokens(0, 8), 4)}})[:12]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b kvBatch
			if err := decodeKVBatch(tt.payload, &b); !errors.Is(err, errKVBatch) {
				t.Fatalf("got %v, want errKVBatch", err)
			}
		})
	}
}

func FuzzDecodeKVBatch(f *testing.F) {
	f.Add(kvPayload(f, []any{stored([]any{1, []byte("h2")}, nil, seqTokens(0, 8), 4), removed(1), cleared()}))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var b kvBatch
		if decodeKVBatch(payload, &b) == nil {
			newKVIndex(0, 64).apply(&b)
		}
	})
}

// kvTestPolicy is a KVAware over workers whose indexes tests fill directly.
func kvTestPolicy(t *testing.T, workers []*Worker) *KVAware {
	t.Helper()
	fallback, _ := newTestCacheAware(t, CacheAwareConfig{})
	k, err := NewKVAware(KVAwareConfig{}, fallback, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Routing by events is the global scope's: these tests are about the events.
	k.scope = CacheScopeGlobal
	k.WorkersChanged(workers)
	return k
}

// kvFleet is n workers of model "m" whose engines (/tokenize) answer at url, and a kv_aware
// policy over them.
func kvFleet(t *testing.T, n int, url string) ([]*Worker, *KVAware) {
	t.Helper()
	specs := testWorkers(n, "m")
	for i := range specs {
		specs[i].URL = url
	}
	p, _ := newTestPool(t, Config{Workers: specs})
	ws := modelWorkers(t, p, "m")
	return ws, kvTestPolicy(t, ws)
}

// kvPrepared is r prepared by k as Pool.Prepare prepares it (its token ids asked, once per
// request), as a pick sees it.
func kvPrepared(k *KVAware, r *Request, ws []*Worker) choice {
	r.Prepared = k.prepare(context.Background(), choice{Request: r, Prepared: r.Prepared}, ws)
	return choice{Request: r, Prepared: r.Prepared}
}

// kvHold makes worker id hold (after clearing all it held) the first blocks blocks of prompt,
// blocks of bs tokens hashed 1, 2, ..., and marks its events live.
func kvHold(t *testing.T, k *KVAware, id string, prompt []uint64, blocks, bs int) {
	t.Helper()
	kw := k.workers[id]
	hashes := make([]any, blocks)
	for i := range hashes {
		hashes[i] = i + 1
	}
	applyPayload(t, kw.idx, kvPayload(t, []any{cleared(), stored(hashes, nil, prompt[:blocks*bs], bs)}))
	kw.live.Store(true)
}

func TestKVAwarePicksTheHolderWeighedAgainstLoad(t *testing.T) {
	const bs = 4
	prompt := seqTokens(1, 10*bs)
	// One tokenizer for the fleet: every worker's /tokenize answers the prompt's ids.
	var asked atomic.Int32
	tok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		var req struct{ Prompt string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if r.URL.Path != "/tokenize" || req.Prompt != "the prompt" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": prompt})
	}))
	defer tok.Close()
	ws, k := kvFleet(t, 3, tok.URL)
	hold := func(id string, blocks int) { kvHold(t, k, id, prompt, blocks, bs) }
	r := &Request{Model: "m", Prompt: "the prompt"}

	hold("w0", 3)
	hold("w1", 8)
	hold("w2", 6)
	if w, route := k.Pick(context.Background(), kvPrepared(k, r, ws), ws); w.ID() != "w1" || route != RouteKVHit {
		t.Fatalf("got %s (%s), want w1 (kv_hit): the longest holder", w.ID(), route)
	}
	if asked.Load() != 1 {
		t.Fatalf("tokenize asked %d times, want 1", asked.Load())
	}
	// w1 overloaded against the others: the lighter holder of enough takes it.
	ws[1].inFlight.Store(40)
	ws[2].inFlight.Store(1)
	if w, route := k.Pick(context.Background(), kvPrepared(k, r, ws), ws); w.ID() != "w2" || route != RouteKVRebalance {
		t.Fatalf("got %s (%s), want w2 (kv_rebalance)", w.ID(), route)
	}
	if asked.Load() != 1 {
		t.Fatalf("tokenize asked %d times for one request, want 1", asked.Load())
	}
	// By default one held block is enough: the events are exact.
	ws[1].inFlight.Store(0)
	ws[2].inFlight.Store(0)
	hold("w0", 0)
	hold("w1", 1)
	hold("w2", 0)
	if w, route := k.Pick(context.Background(), kvPrepared(k, &Request{Model: "m", Prompt: "the prompt"}, ws), ws); w.ID() != "w1" || route != RouteKVHit {
		t.Fatalf("got %s (%s), want w1 (kv_hit): it holds a block", w.ID(), route)
	}
	// With a threshold of half the prompt (5 of 10 blocks), nobody holds enough: cache_aware
	// decides.
	k.cfg.Threshold = 0.5
	hold("w0", 3)
	if _, route := k.Pick(context.Background(), kvPrepared(k, &Request{Model: "m", Prompt: "the prompt"}, ws), ws); strings.HasPrefix(string(route), "kv_") {
		t.Fatalf("route %s, want one of cache_aware's", route)
	}
}

// TestKVAwareWaitsForAFullHolder: when the worker holding most of the prompt is at its limit
// and the workers with room hold only its first block (a shared system prompt), the request
// waits for a slot there (Pick refuses) for HolderWait, then goes to a worker with room; a
// holder with room again takes it at once, and a holder of less than half the prompt more is
// not waited for.
func TestKVAwareWaitsForAFullHolder(t *testing.T) {
	const bs = 4
	prompt := seqTokens(1, 10*bs)
	tok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": prompt})
	}))
	defer tok.Close()
	ws, k := kvFleet(t, 3, tok.URL)
	now := time.Unix(1_000_000, 0)
	k.now = func() time.Time { return now }
	hold := func(id string, blocks int) { kvHold(t, k, id, prompt, blocks, bs) }
	// full puts w at its token limit with one request in flight (as a long conversation's
	// requests fill a worker's KV cache), or frees it.
	full := func(w *Worker, on bool) {
		if !on {
			w.inFlight.Store(0)
			w.inFlightTokens.Store(0)
			return
		}
		w.inFlight.Store(1)
		w.inFlightTokens.Store(w.tokenLimit.Load())
	}
	pick := func() (*Worker, Route) {
		return k.Pick(context.Background(), kvPrepared(k, &Request{Model: "m", Prompt: "the prompt", Tokens: 50}, ws), ws)
	}
	hold("w0", 9)
	hold("w1", 1)
	hold("w2", 1)
	full(ws[0], true)
	if w, _ := pick(); w != nil {
		t.Fatalf("got %s, want none: wait for w0, which holds 9 of 10 blocks", w.ID())
	}
	now = now.Add(k.cfg.HolderWait / 2)
	if w, _ := pick(); w != nil {
		t.Fatalf("half the wait on: got %s, want none", w.ID())
	}
	full(ws[0], false)
	if w, route := pick(); w != ws[0] || route != RouteKVHit {
		t.Fatalf("got %v (%s), want w0 (kv_hit)", w, route)
	}
	full(ws[0], true)
	if w, _ := pick(); w != nil { // a new request of the prompt: a wait of its own
		t.Fatalf("got %s, want none", w.ID())
	}
	now = now.Add(k.cfg.HolderWait)
	if w, route := pick(); w == nil || w == ws[0] || route != RouteKVHit {
		t.Fatalf("after the wait: got %v (%s), want w1 or w2 (kv_hit)", w, route)
	}
	hold("w1", 5) // 4 blocks short of w0's 9: less than half the prompt
	if w, _ := pick(); w != ws[1] {
		t.Fatalf("got %v, want w1 at once", w)
	}
	k.cfg.HolderWait = -1
	hold("w1", 1)
	if w, _ := pick(); w == nil || w == ws[0] {
		t.Fatalf("holder_wait -1: got %v, want w1 or w2 at once", w)
	}
}

// TestKVAwareTokenizesOnTheWorkersInTurn: the /tokenize calls rotate over the workers that
// publish events and are up, those below their concurrency limit first.
func TestKVAwareTokenizesOnTheWorkersInTurn(t *testing.T) {
	specs := testWorkers(4, "m")
	var asked [4]atomic.Int32
	for i := range specs {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			asked[i].Add(1)
			_ = json.NewEncoder(w).Encode(map[string]any{"tokens": seqTokens(1, 8)})
		}))
		t.Cleanup(srv.Close)
		specs[i].URL = srv.URL
	}
	p, _ := newTestPool(t, Config{Workers: specs})
	ws := modelWorkers(t, p, "m")
	k := kvTestPolicy(t, ws)
	for _, id := range []string{"w0", "w1", "w2"} { // w3 publishes no events
		k.workers[id].live.Store(true)
	}
	counts := func() [4]int32 {
		var c [4]int32
		for i := range asked {
			c[i] = asked[i].Swap(0)
		}
		return c
	}
	pick := func(n int) {
		for range n {
			k.Pick(context.Background(), kvPrepared(k, &Request{Model: "m", Prompt: "p"}, ws), ws)
		}
	}
	pick(9)
	if got := counts(); got != [4]int32{3, 3, 3, 0} {
		t.Fatalf("9 requests tokenized on %v, want [3 3 3 0]", got)
	}
	ws[0].inFlight.Store(ws[0].MaxConcurrency()) // at its limit
	markDown(ws[2])
	pick(4)
	if got := counts(); got != [4]int32{0, 4, 0, 0} {
		t.Fatalf("w0 at its limit, w2 down: tokenized on %v, want [0 4 0 0]", got)
	}
	ws[1].inFlight.Store(ws[1].MaxConcurrency())
	pick(4)
	if got := counts(); got != [4]int32{2, 2, 0, 0} {
		t.Fatalf("w0 and w1 at their limits: tokenized on %v, want [2 2 0 0] (busy ones rather than none)", got)
	}
}

func TestKVAwareWithoutEventsIsCacheAware(t *testing.T) {
	ws := cacheWorkers(t, 3)
	k := kvTestPolicy(t, ws)
	r := &Request{Model: "m", Prompt: strings.Repeat("shared system prompt ", 20)}
	first, _ := k.Pick(context.Background(), kvPrepared(k, r, ws), ws)
	again, route := k.Pick(context.Background(), kvPrepared(k, r, ws), ws)
	if again != first || route != RouteCacheHit {
		t.Fatalf("repeat went to %s (%s), want %s (cache_hit)", again.ID(), route, first.ID())
	}
	if r.Prepared.tokenized {
		t.Fatal("tokenized with no worker publishing events")
	}
}

func TestKVAwareConfig(t *testing.T) {
	var c KVAwareConfig
	c.SetDefaults()
	if errs := c.validate("kv_aware"); len(errs) > 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	bad := c
	bad.EventsPort, bad.MaxBlocksPerWorker, bad.TokenizePath, bad.Threshold = 70000, -1, "tokenize", 1.5
	bad.Endpoints = map[string]string{"w0": "nohost"}
	errs := bad.validate("routing.models[\"m\"].kv_aware")
	var all bytes.Buffer
	for _, e := range errs {
		all.WriteString(e.Error() + "\n")
	}
	for _, field := range []string{".kv_aware.events_port", ".kv_aware.max_blocks_per_worker", ".kv_aware.tokenize_path", ".kv_aware.threshold", `.kv_aware.endpoints["w0"]`} {
		if !strings.Contains(all.String(), field) {
			t.Errorf("no error names %s in:\n%s", field, all.String())
		}
	}
	ev, rp, err := splitKVEndpoints("10.0.0.1:6000,10.0.0.1:6001")
	if err != nil || ev != "tcp://10.0.0.1:6000" || rp != "tcp://10.0.0.1:6001" {
		t.Fatalf("endpoints: got %q %q %v", ev, rp, err)
	}
}

// benchIndex returns an index holding about n blocks of 16 tokens, in prompts of 64 blocks,
// and one prompt of 4 KB (1024 tokens) it holds.
func benchIndex(b *testing.B, n int) (*kvIndex, []uint64) {
	const bs = 16
	x := newKVIndex(bs, 2*n)
	var batch kvBatch
	h := 0
	var prompt []uint64
	for p := 0; x.blocks() < n; p++ {
		prompt = seqTokens(p*1_000_000, 64*bs)
		hashes := make([]any, 64)
		for i := range hashes {
			h++
			hashes[i] = h
		}
		if err := decodeKVBatch(kvPayload(b, []any{stored(hashes, nil, prompt, bs)}), &batch); err != nil {
			b.Fatal(err)
		}
		x.apply(&batch)
	}
	return x, prompt
}

// BenchmarkKVIndexApply is the decode and index update of one batch at 100k indexed blocks: a 4
// KB prompt's 64 blocks stored, none of them held, and 64 held blocks removed. Its batches
// cycle over 65 groups of 64 blocks, batch i storing group i and removing group i+1, so every
// store and every removal does its whole work.
func BenchmarkKVIndexApply(b *testing.B) {
	x, _ := benchIndex(b, 100_000)
	const bs, groups = 16, 65
	hashes := func(g int) []any {
		h := make([]any, 64)
		for j := range h {
			h[j] = 10_000_000 + g*64 + j
		}
		return h
	}
	payloads := make([][]byte, groups)
	for i := range payloads {
		stores := stored(hashes(i), nil, seqTokens(20_000_000+i*100_000, 64*bs), bs)
		payloads[i] = kvPayload(b, []any{stores, removed(hashes((i + 1) % groups)...)})
	}
	var batch kvBatch
	for i := 1; i < groups; i++ { // every group held but group 0
		if err := decodeKVBatch(payloads[i], &batch); err != nil {
			b.Fatal(err)
		}
		x.apply(&batch)
		batch.events = batch.events[:1] // the store alone
		x.apply(&batch)
	}
	held := x.blocks()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := decodeKVBatch(payloads[i%groups], &batch); err != nil {
			b.Fatal(err)
		}
		x.apply(&batch)
	}
	b.StopTimer()
	if x.blocks() != held {
		b.Fatalf("%d blocks held after the batches, want %d: a batch did not store and remove 64", x.blocks(), held)
	}
}

// BenchmarkKVIndexMatch is the match of a 4 KB prompt (1024 tokens, 64 blocks, all held) at
// 100k indexed blocks: the hashing of its blocks and their lookup.
func BenchmarkKVIndexMatch(b *testing.B) {
	x, prompt := benchIndex(b, 100_000)
	if x.match(prompt) != 64 {
		b.Fatalf("matched %d blocks, want 64", x.match(prompt))
	}
	var h kvHasher
	var keys []uint64
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		keys = h.blockKeys(keys[:0], prompt, 16)
		x.matchKeys(keys)
	}
}

// BenchmarkKVAwareTokenize is the /tokenize round trip of a 4 KB prompt (1024 token ids back)
// to a loopback HTTP server: the I/O kv_aware adds to a request's Pick.
func BenchmarkKVAwareTokenize(b *testing.B) {
	ids := seqTokens(1_000_000, 1024)
	answer, _ := json.Marshal(map[string]any{"count": len(ids), "tokens": ids})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write(answer)
	}))
	defer srv.Close()
	specs := testWorkers(1, "m")
	specs[0].URL = srv.URL
	p, _ := newTestPool(b, Config{Workers: specs})
	w := modelWorkers(b, p, "m")[0]
	fallback, _ := NewCacheAware(CacheAwareConfig{}, nil)
	k, err := NewKVAware(KVAwareConfig{}, fallback, nil)
	if err != nil {
		b.Fatal(err)
	}
	// Routing by events is the global scope's: these tests are about the events.
	k.scope = CacheScopeGlobal
	r := &Request{Model: "m", Prompt: strings.Repeat("word ", 1024)[:4096]}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		got, err := k.tokenize(context.Background(), w, r)
		if err != nil || len(got) != len(ids) {
			b.Fatalf("tokenize: %d ids, %v", len(got), err)
		}
	}
}

// TestKVTableAgreesWithAMap runs random inserts and deletes, over few keys so that probe runs
// collide and wrap, against a Go map.
func TestKVTableAgreesWithAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab kvTable[int32]
	want := map[uint64]int32{}
	for op := range 200_000 {
		key := rng.Uint64N(3000)
		if rng.IntN(3) == 0 { // sequential keys too, as engines' integer hashes may be
			key = uint64(op % 500)
		}
		if rng.IntN(2) == 0 {
			i, existed := tab.upsert(key)
			if _, ok := want[key]; ok != existed {
				t.Fatalf("op %d: upsert(%d) existed=%v, want %v", op, key, existed, ok)
			}
			*tab.at(i) = int32(op)
			want[key] = int32(op)
		} else if i := tab.find(key); i >= 0 {
			if _, ok := want[key]; !ok {
				t.Fatalf("op %d: found %d, which was deleted", op, key)
			}
			tab.deleteAt(i)
			delete(want, key)
		} else if _, ok := want[key]; ok {
			t.Fatalf("op %d: did not find %d", op, key)
		}
		if op%1000 == 0 {
			if tab.len() != len(want) {
				t.Fatalf("op %d: %d entries, want %d", op, tab.len(), len(want))
			}
			for k, v := range want {
				if i := tab.find(k); i < 0 || *tab.at(i) != v {
					t.Fatalf("op %d: key %d lost or wrong", op, k)
				}
			}
		}
	}
	tab.reset()
	if tab.len() != 0 || tab.find(1) >= 0 {
		t.Fatal("reset left entries")
	}
}

func TestParseTokenIDs(t *testing.T) {
	tests := []struct {
		raw  string
		want []uint64
		ok   bool
	}{
		{`[]`, []uint64{}, true},
		{` [ 1, 2 ,3 ]`, []uint64{1, 2, 3}, true},
		{"[18446744073709551615]", []uint64{18446744073709551615}, true},
		{"[18446744073709551616]", nil, false},
		{`[1.5]`, nil, false},
		{`[-1]`, nil, false},
		{`[1,]`, nil, false},
		{`[{"id":1}]`, nil, false},
		{`"1 2"`, nil, false},
		{`null`, nil, false},
		{``, nil, false},
	}
	for _, tt := range tests {
		got, err := parseTokenIDs([]byte(tt.raw))
		if (err == nil) != tt.ok || tt.ok && !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %v, %v; want %v (ok %v)", tt.raw, got, err, tt.want, tt.ok)
		}
	}
}

// TestKVIndexAgreesWithAModel stores and removes blocks of random prompts (on a few long-held
// roots, as system prompts are; blocks stored again; removals of hashes never stored) against
// a model of what the engine holds, long enough for the insertion order to be compacted many
// times: each prompt matches exactly its leading blocks held, and each held block has its one
// live entry in the insertion order.
func TestKVIndexAgreesWithAModel(t *testing.T) {
	const bs = 2
	rng := rand.New(rand.NewPCG(7, 8))
	const maxBlocks = 4096 // far above what is held: nothing is forgotten, order is compacted
	x := newKVIndex(bs, maxBlocks)
	chains := map[uint64][]uint64{}  // engine hash → the hashes of its prompt's blocks up to it
	prompts := map[uint64][]uint64{} // engine hash → its prompt's tokens up to its block's end
	held := map[uint64]bool{}
	var heldList []uint64
	roots := make([][]uint64, 4)
	for i := range roots {
		roots[i] = seqTokens(1_000_000*(i+1), 3*bs)
	}
	nextHash := uint64(1)
	check := func(op int, h uint64) {
		want := 0
		for want < len(chains[h]) && held[chains[h][want]] {
			want++
		}
		if got := x.match(prompts[h]); got != want {
			t.Fatalf("op %d: the prompt up to block %d matched %d blocks, want %d", op, h, got, want)
		}
	}
	for op := range 40_000 {
		if rng.IntN(2) == 0 || len(heldList) == 0 { // store a prompt: a root and new blocks
			r := rng.IntN(len(roots))
			prompt := append(append([]uint64{}, roots[r]...), seqTokens(rng.IntN(1<<30), bs*(1+rng.IntN(4)))...)
			hashes := make([]any, len(prompt)/bs)
			var chain []uint64
			for b := range hashes {
				h := nextHash
				if b < len(roots[r])/bs { // a root's blocks keep their hashes
					h = 1<<40 + uint64(8*r+b)
				} else {
					nextHash++
				}
				hashes[b] = h
				chain = append(chain, h)
				chains[h], prompts[h] = slices.Clone(chain), prompt[:(b+1)*bs]
				if !held[h] {
					held[h] = true
					heldList = append(heldList, h)
				}
			}
			applyPayload(t, x, kvPayload(t, []any{stored(hashes, nil, prompt, bs)}))
		} else { // remove random held blocks (as many as a store adds), and one never stored
			gone := []any{uint64(1)<<50 + uint64(op)}
			for range 1 + rng.IntN(5) {
				if len(heldList) == 0 {
					break
				}
				i := rng.IntN(len(heldList))
				gone = append(gone, heldList[i])
				delete(held, heldList[i])
				heldList[i] = heldList[len(heldList)-1]
				heldList = heldList[:len(heldList)-1]
			}
			applyPayload(t, x, kvPayload(t, []any{removed(gone...)}))
			check(op, gone[len(gone)-1].(uint64))
		}
		if op%500 != 0 {
			continue
		}
		if x.blocks() != len(heldList) {
			t.Fatalf("op %d: %d blocks indexed, the engine holds %d", op, x.blocks(), len(heldList))
		}
		live := map[uint64]uint64{} // engine hash → its number, from the insertion order
		for _, o := range x.order[x.head:] {
			if i := x.byEngine.find(o.key); i >= 0 && x.byEngine.at(i).n == o.n {
				if _, twice := live[o.key]; twice {
					t.Fatalf("op %d: block %d twice in the insertion order", op, o.key)
				}
				live[o.key] = o.n
			}
		}
		if len(live) != len(heldList) {
			t.Fatalf("op %d: %d live entries in the insertion order for %d blocks", op, len(live), len(heldList))
		}
		for _, h := range heldList {
			if _, ok := live[h]; !ok {
				t.Fatalf("op %d: block %d held but not in the insertion order", op, h)
			}
			check(op, h)
		}
	}
	if x.next < 4*(2*maxBlocks+1024) {
		t.Fatalf("%d blocks stored: the insertion order was compacted too few times", x.next)
	}
	if len(x.order)-x.head > 2*maxBlocks+1024 {
		t.Fatalf("insertion order holds %d entries for %d blocks", len(x.order)-x.head, x.blocks())
	}
}

// tokenizingWorkers are n workers of model "m" whose engine answers every /tokenize with 8 token
// ids; asked counts those calls.
func tokenizingWorkers(t *testing.T, n int) (specs []WorkerSpec, asked *atomic.Int32) {
	t.Helper()
	asked = new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": seqTokens(1, 8)})
	}))
	t.Cleanup(srv.Close)
	specs = testWorkers(n, "m")
	for i := range specs {
		specs[i].URL = srv.URL
	}
	return specs, asked
}

// newTokenizingPool is a pool of two kv_aware workers of model "m", w0 live, whose engine answers
// every /tokenize with 8 token ids; asked counts those calls.
func newTokenizingPool(t *testing.T) (p *Pool, asked *atomic.Int32) {
	t.Helper()
	specs, asked := tokenizingWorkers(t, 2)
	p, _ = newTestPool(t, Config{Workers: specs, CacheScope: CacheScopeGlobal,
		Models: map[string]ModelConfig{"m": {Policy: "kv_aware"}}})
	k, ok := p.policies[policyKey{"m", StageWhole}].Policy.(*KVAware)
	if !ok {
		t.Fatalf("policy of m is %T, want kv_aware", p.policies[policyKey{"m", StageWhole}].Policy)
	}
	k.workers["w0"].live.Store(true)
	return p, asked
}

// Prepare asks for the prompt's token ids before the request waits; its picks then ask no more
// (they run under the gateway queue's lock, where no I/O may be).
func TestKVAwareTokenizesInPrepareNotInPick(t *testing.T) {
	p, asked := newTokenizingPool(t)
	r := &Request{Model: "m", Prompt: "p", Tokens: 10}
	p.Prepare(context.Background(), r)
	if n := asked.Load(); n != 1 {
		t.Fatalf("Prepare asked /tokenize %d times, want 1", n)
	}
	for range 2 {
		l, err := p.Pick(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(Outcome{})
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("/tokenize asked %d times in all, want once (in Prepare)", n)
	}
}
