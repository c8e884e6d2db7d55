package routing

import (
	"context"
	"encoding/binary"
	"io"
	"log"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// kvTestPublisher is an engine's event publisher as vLLM runs it: a PUB socket for live
// batches and a ROUTER socket replaying the batches it keeps.
type kvTestPublisher struct {
	pub, router zmq4.Socket
	mu          sync.Mutex // guards kept
	kept        map[uint64][]byte
}

func newKVTestPublisher(t *testing.T) *kvTestPublisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	quiet := zmq4.WithLogger(log.New(io.Discard, "", 0))
	p := &kvTestPublisher{pub: zmq4.NewPub(ctx, quiet), router: zmq4.NewRouter(ctx, quiet), kept: map[uint64][]byte{}}
	if err := p.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := p.router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		end := binary.BigEndian.AppendUint64(nil, ^uint64(0))
		for {
			msg, err := p.router.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			p.mu.Lock()
			for s := binary.BigEndian.Uint64(msg.Frames[2]); p.kept[s] != nil; s++ {
				_ = p.router.Send(zmq4.NewMsgFrom(msg.Frames[0], []byte{}, binary.BigEndian.AppendUint64(nil, s), p.kept[s]))
			}
			p.mu.Unlock()
			_ = p.router.Send(zmq4.NewMsgFrom(msg.Frames[0], []byte{}, end, []byte{}))
		}
	}()
	t.Cleanup(func() { cancel(); p.pub.Close(); p.router.Close(); <-done })
	return p
}

// keep makes batch seq replayable; send publishes it live.
func (p *kvTestPublisher) keep(seq uint64, payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kept[seq] = payload
}

func (p *kvTestPublisher) send(t *testing.T, seq uint64, payload []byte) {
	t.Helper()
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
		t.Fatal(err)
	}
}

func (p *kvTestPublisher) endpoints(replay bool) string {
	_, port, _ := net.SplitHostPort(p.pub.Addr().String())
	s := "127.0.0.1:" + port
	if replay {
		_, rport, _ := net.SplitHostPort(p.router.Addr().String())
		s += ",127.0.0.1:" + rport
	}
	return s
}

// runKVAware runs a kv_aware policy over one worker w0 whose events come from p.
func runKVAware(t *testing.T, p *kvTestPublisher, replay bool) *KVAware {
	t.Helper()
	fallback, _ := newTestCacheAware(t, CacheAwareConfig{})
	k, err := NewKVAware(KVAwareConfig{Endpoints: map[string]string{"w0": p.endpoints(replay)}}, fallback, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Routing by events is the global scope's: these tests are about the events.
	k.scope = CacheScopeGlobal
	k.WorkersChanged(cacheWorkers(t, 1))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return k
}

// waitHeld waits until w0's index holds want blocks, publishing seq (live) again while it does
// not: a subscription takes effect a moment after the dial, and a batch sent twice is applied once.
func waitHeld(t *testing.T, k *KVAware, p *kvTestPublisher, seq uint64, payload []byte, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := k.HeldBlocks("w0"); n == want {
			return
		}
		if time.Now().After(deadline) {
			n, _ := k.HeldBlocks("w0")
			t.Fatalf("w0 holds %d blocks, want %d", n, want)
		}
		if payload != nil {
			p.send(t, seq, payload)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// heldOf returns the leading blocks of prompt w0's index holds.
func heldOf(k *KVAware, prompt []uint64) int {
	k.mu.Lock()
	kw := k.workers["w0"]
	k.mu.Unlock()
	kw.mu.RLock()
	defer kw.mu.RUnlock()
	return kw.idx.match(prompt)
}

func TestKVAwareFillsAGapFromTheReplaySocket(t *testing.T) {
	const bs = 2
	prompt := seqTokens(1, 3*bs)
	a := kvPayload(t, []any{stored([]any{1}, nil, prompt[:bs], bs)})
	b := kvPayload(t, []any{stored([]any{2}, 1, prompt[bs:2*bs], bs)})
	c := kvPayload(t, []any{stored([]any{3}, 2, prompt[2*bs:], bs)})
	p := newKVTestPublisher(t)
	p.keep(0, a) // sent before usher subscribed: only the replay socket has it
	k := runKVAware(t, p, true)
	waitHeld(t, k, p, 0, nil, 1)
	p.keep(1, b) // lost on the way: the subscriber sees 2 after 0
	p.keep(2, c)
	waitHeld(t, k, p, 2, c, 3)
	if got := heldOf(k, prompt); got != 3 {
		t.Fatalf("after the gap was filled: matched %d blocks, want 3", got)
	}
}

func TestKVAwareStartsOverAfterAGapItCannotFill(t *testing.T) {
	const bs = 2
	prompt := seqTokens(1, 3*bs)
	a := kvPayload(t, []any{stored([]any{1, 2}, nil, prompt[:2*bs], bs)})
	c := kvPayload(t, []any{stored([]any{3}, 2, prompt[2*bs:], bs)})
	d := kvPayload(t, []any{stored([]any{9}, nil, seqTokens(50, bs), bs)})
	for _, replay := range []bool{false, true} { // no replay socket, or one without batch 1
		t.Run(map[bool]string{false: "no replay socket", true: "replay without the batch"}[replay], func(t *testing.T) {
			p := newKVTestPublisher(t)
			k := runKVAware(t, p, replay)
			waitHeld(t, k, p, 0, a, 2)
			// Batch 1 is lost: what w0 holds is unknown, so its index starts over, and batch 2
			// (chained on a block the index no longer knows) adds nothing.
			p.send(t, 2, c)
			waitHeld(t, k, p, 3, d, 1)
			if got := heldOf(k, prompt); got != 0 {
				t.Fatalf("after a gap not filled: matched %d blocks of the old prompt, want 0", got)
			}
		})
	}
}

// TestKVAwareStartsOverWhenTheSequenceGoesBack: a publisher that started over from any number,
// not only 0, is a restarted engine; the index drops the old cache's blocks and takes the new
// publisher's from its first batch, the ones before the live one from its replay socket.
func TestKVAwareStartsOverWhenTheSequenceGoesBack(t *testing.T) {
	const bs = 2
	old, fresh := seqTokens(1, 3*bs), seqTokens(500, 4*bs)
	p := newKVTestPublisher(t)
	k := runKVAware(t, p, true)
	for i := range 3 {
		var parent any
		if i > 0 {
			parent = i
		}
		payload := kvPayload(t, []any{stored([]any{i + 1}, parent, old[i*bs:(i+1)*bs], bs)})
		p.keep(uint64(i), payload)
		waitHeld(t, k, p, uint64(i), payload, i+1)
	}
	// The engine restarts; its new publisher's batch 0 was sent before usher saw it go, and
	// batch 1 is the first usher receives: 1 after 2. Its engine hashes are the old ones.
	p.mu.Lock()
	p.kept = map[uint64][]byte{0: kvPayload(t, []any{stored([]any{1, 2}, nil, fresh[:2*bs], bs)})}
	p.mu.Unlock()
	b1 := kvPayload(t, []any{stored([]any{3, 4}, 2, fresh[2*bs:], bs)})
	p.send(t, 1, b1)
	waitHeld(t, k, p, 1, nil, 4)
	if got := heldOf(k, fresh); got != 4 {
		t.Fatalf("the new cache's prompt: matched %d blocks, want 4", got)
	}
	if got := heldOf(k, old); got != 0 {
		t.Fatalf("the old cache's prompt: matched %d blocks, want 0", got)
	}
}
