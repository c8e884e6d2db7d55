package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// KV-cache events as vLLM publishes them (vllm/distributed/kv_events.py), from the engine's
// block pool: a ZeroMQ PUB socket sends each batch as [topic "", sequence number (8 bytes, big
// endian), msgpack payload [ts, [event...]]], and a ROUTER socket answers a request for the
// batches from a sequence number on with [seq, payload] each, then [-1, ""].
//
//	["BlockStored", [hash...], parent hash or nil, [token id...], block_size, nil, nil]
//	["BlockRemoved", [hash...], nil]
//	["AllBlocksCleared"]

// kvReplayKeep is how many batches the replay socket can give back.
const kvReplayKeep = 4096

// kvEvent is one event of the pool, queued for the publisher.
type kvEvent struct {
	kind   string
	hashes []uint64
	parent uint64
	root   bool // no parent: the prompt's first block
	tokens []uint64
}

// kvEventLog is the events of a block pool not yet published. Its methods are safe for
// concurrent use: the pool appends under the Engine's mutex, the publisher takes them without it.
type kvEventLog struct {
	mu      sync.Mutex // guards pending
	pending []kvEvent
	wake    chan struct{} // capacity 1
}

func newKVEventLog() *kvEventLog { return &kvEventLog{wake: make(chan struct{}, 1)} }

func (l *kvEventLog) add(ev kvEvent) {
	l.mu.Lock()
	// Consecutive blocks of one prompt stored together go in one event, as vLLM sends them;
	// so do consecutive removals.
	if n := len(l.pending); n > 0 && ev.kind != "AllBlocksCleared" && l.pending[n-1].kind == ev.kind {
		last := &l.pending[n-1]
		if ev.kind == "BlockRemoved" || !ev.root && last.hashes[len(last.hashes)-1] == ev.parent {
			last.hashes = append(last.hashes, ev.hashes...)
			last.tokens = append(last.tokens, ev.tokens...)
			l.mu.Unlock()
			l.signal()
			return
		}
	}
	l.pending = append(l.pending, ev)
	l.mu.Unlock()
	l.signal()
}

func (l *kvEventLog) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *kvEventLog) take() []kvEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	evs := l.pending
	l.pending = nil
	return evs
}

// kvPublisher publishes an engine's kvEventLog; see the wire format above.
type kvPublisher struct {
	log       *kvEventLog
	blockSize int
	pub       zmq4.Socket
	router    zmq4.Socket
	done      chan struct{}
	cancel    context.CancelFunc

	mu   sync.Mutex // guards ring and next
	ring [][]byte   // the last kvReplayKeep payloads; ring[seq % kvReplayKeep]
	next uint64     // sequence number of the next batch
}

// listenKVEvents binds the publisher to addr (host:port; port 0 picks one) and its replay
// socket to the next port (any free one when port is 0), and starts publishing log.
func listenKVEvents(addr string, blockSize int, l *kvEventLog) (*kvPublisher, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("kv events address: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65534 {
		return nil, fmt.Errorf("kv events address: bad port %q", port)
	}
	replayPort := 0
	if p > 0 {
		replayPort = p + 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	quiet := zmq4.WithLogger(log.New(io.Discard, "", 0))
	k := &kvPublisher{log: l, blockSize: blockSize, pub: zmq4.NewPub(ctx, quiet), router: zmq4.NewRouter(ctx, quiet),
		done: make(chan struct{}), cancel: cancel, ring: make([][]byte, kvReplayKeep)}
	if err := k.pub.Listen("tcp://" + addr); err != nil {
		cancel()
		return nil, fmt.Errorf("kv events: %w", err)
	}
	if err := k.router.Listen("tcp://" + net.JoinHostPort(host, strconv.Itoa(replayPort))); err != nil {
		k.pub.Close()
		cancel()
		return nil, fmt.Errorf("kv events replay: %w", err)
	}
	replayed := make(chan struct{})
	go func() { defer close(replayed); k.serveReplay() }()
	go func() {
		defer close(k.done)
		k.publish(ctx)
		<-replayed
	}()
	return k, nil
}

// addrs returns the bound addresses of the publisher and the replay socket.
func (k *kvPublisher) addrs() (events, replay string) {
	return k.pub.Addr().String(), k.router.Addr().String()
}

// close stops publishing and closes both sockets; events not yet sent are dropped.
func (k *kvPublisher) close() {
	k.cancel()
	k.pub.Close()
	k.router.Close()
	<-k.done
}

func (k *kvPublisher) publish(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.log.wake:
		}
		evs := k.log.take()
		if len(evs) == 0 {
			continue
		}
		payload, err := encodeKVBatch(float64(time.Now().UnixNano())/1e9, evs, k.blockSize)
		if err != nil {
			continue
		}
		k.mu.Lock()
		seq := k.next
		k.next++
		k.ring[seq%kvReplayKeep] = payload
		k.mu.Unlock()
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		_ = k.pub.Send(zmq4.NewMsgFrom([]byte{}, s[:], payload))
	}
}

// serveReplay answers [identity, "", start seq] with the batches it still has from start on.
func (k *kvPublisher) serveReplay() {
	end := make([]byte, 8)
	binary.BigEndian.PutUint64(end, ^uint64(0)) // -1
	for {
		msg, err := k.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		k.mu.Lock()
		var out [][]byte
		var seqs []uint64
		if start < k.next && k.next-start <= kvReplayKeep {
			for s := start; s < k.next; s++ {
				out = append(out, k.ring[s%kvReplayKeep])
				seqs = append(seqs, s)
			}
		}
		k.mu.Unlock()
		for i, payload := range out {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], seqs[i])
			if k.router.Send(zmq4.NewMsgFrom(id, []byte{}, s[:], payload)) != nil {
				break
			}
		}
		_ = k.router.Send(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}

// encodeKVBatch writes evs as one msgpack batch in vLLM's array-like layout.
func encodeKVBatch(ts float64, evs []kvEvent, blockSize int) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	put := func(errs ...error) error {
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	hashes := func(hs []uint64) error {
		if err := e.EncodeArrayLen(len(hs)); err != nil {
			return err
		}
		for _, h := range hs {
			if err := e.EncodeUint64(h); err != nil {
				return err
			}
		}
		return nil
	}
	if err := put(e.EncodeArrayLen(2), e.EncodeFloat64(ts), e.EncodeArrayLen(len(evs))); err != nil {
		return nil, err
	}
	for _, ev := range evs {
		var err error
		switch ev.kind {
		case "BlockStored":
			err = put(e.EncodeArrayLen(7), e.EncodeString(ev.kind), hashes(ev.hashes))
			if err == nil && ev.root {
				err = e.EncodeNil()
			} else if err == nil {
				err = e.EncodeUint64(ev.parent)
			}
			if err == nil {
				err = hashes(ev.tokens)
			}
			if err == nil {
				err = put(e.EncodeInt(int64(blockSize)), e.EncodeNil(), e.EncodeNil())
			}
		case "BlockRemoved":
			err = put(e.EncodeArrayLen(3), e.EncodeString(ev.kind), hashes(ev.hashes), e.EncodeNil())
		default:
			err = put(e.EncodeArrayLen(1), e.EncodeString(ev.kind))
		}
		if err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}
