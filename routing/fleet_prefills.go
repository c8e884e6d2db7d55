package routing

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Interactive prefills told to the fleet. A lower-class piece, and a lower-class request after
// its pieces, waits while an interactive prompt is in prefill on its worker
// (Lease.AwaitInteractive), and an interactive request prefers a worker with none
// (clearOfInteractivePrefill); but a replica counts only the prompts it sent itself. Behind three
// replicas the others' pieces went into the steps of an interactive prompt's prefill: on three
// llama-servers, 26 of 56 interactive requests that missed their objective had a lower-class
// prompt begin its prefill on their worker during their own, against 2 of 32 behind one replica
// (docs/benchmarks.md, twenty-second session). So with a ShareStore that carries marks
// (PrefillMarks: the RedisStore, over Pub/Sub) a replica tells the others when an interactive
// prompt it sent begins and ends its prefill, and counts their prompts beside its own
// (Worker.fleetPrefills). Marks are sent one at a time, in order; delivery is at most once, and
// a replica may stop without telling an end, so another's mark counts for fleetPrefillTTL at
// most.

// PrefillMarks carries the marks of the interactive prompts in prefill among the replicas of a
// fleet. A ShareStore may implement it; without it each replica counts its own prompts only.
type PrefillMarks interface {
	// MarkPrefill tells every other replica watching of m. Delivery is at most once.
	MarkPrefill(ctx context.Context, m PrefillMark) error
	// WatchPrefillMarks calls marked with each mark another replica made, with that replica's
	// name, in the order it made them, until ctx ends; marks made while it was not connected
	// are lost.
	WatchPrefillMarks(ctx context.Context, marked func(replica string, m PrefillMark))
}

// PrefillMark is one replica's interactive prompt beginning, or (Ended) ending, its prefill on
// Worker. Seq numbers the prompt among the replica's marks: its end carries the same.
type PrefillMark struct {
	Worker string `json:"w"`
	Seq    uint64 `json:"n"`
	Ended  bool   `json:"e,omitempty"`
}

const (
	// fleetPrefillTTL bounds how long another replica's mark counts: an interactive prefill
	// takes well under it, and a mark whose end was lost holds the worker's lower-class pieces
	// back for no longer.
	fleetPrefillTTL = 5 * time.Second
	// maxFleetPrefills bounds the other replicas' marks counted at once; one beyond it is not.
	maxFleetPrefills = 4096
	// maxPrefillMarkBytes bounds a mark as sent and as read: a worker ID and a replica's name fit
	// well within it; a larger one is not sent, and dropped when read.
	maxPrefillMarkBytes = 4 << 10
	// prefillMarksQueue bounds the marks waiting to be sent; one beyond it is dropped (its
	// prompt is then this replica's alone to hold pieces for).
	prefillMarksQueue = 1024
)

// fleetPrefills is a pool's side of PrefillMarks: its own marks waiting to be sent, and the other
// replicas' marks counted on their workers.
type fleetPrefills struct {
	pool *Pool
	feed PrefillMarks
	out  chan PrefillMark

	seq atomic.Uint64 // the last of this replica's marks

	mu   sync.Mutex                   // guards live
	live map[remoteMark]remotePrefill // the others' prompts in prefill
}

// remoteMark names another replica's prompt: its replica and its Seq.
type remoteMark struct {
	replica string
	seq     uint64
}

// remotePrefill is another replica's prompt counted on w since a time.
type remotePrefill struct {
	w     *Worker
	since time.Time
}

func newFleetPrefills(p *Pool, feed PrefillMarks) *fleetPrefills {
	return &fleetPrefills{pool: p, feed: feed, out: make(chan PrefillMark, prefillMarksQueue), live: map[remoteMark]remotePrefill{}}
}

// began queues the mark of an interactive prompt of this replica's beginning its prefill on w,
// and returns its Seq; 0 when the queue was full and nothing will be sent. Cost: an atomic add
// and a channel send that does not block.
func (f *fleetPrefills) began(w *Worker) uint64 {
	seq := f.seq.Add(1)
	if !f.send(PrefillMark{Worker: w.spec.ID, Seq: seq}) {
		return 0
	}
	return seq
}

// ended queues the end of the prompt began numbered seq.
func (f *fleetPrefills) ended(w *Worker, seq uint64) {
	f.send(PrefillMark{Worker: w.spec.ID, Seq: seq, Ended: true})
}

// send queues m, or drops it when the queue is full; it reports whether m was queued.
func (f *fleetPrefills) send(m PrefillMark) bool {
	select {
	case f.out <- m:
		return true
	default:
		f.pool.metrics.prefillMarks.WithLabelValues("dropped").Inc()
		return false
	}
}

// run sends this replica's marks in order, watches the others' and lets theirs count no longer
// than fleetPrefillTTL, until ctx ends; then it counts none of theirs. Pool.Run runs it.
func (f *fleetPrefills) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			f.feed.WatchPrefillMarks(ctx, f.apply)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second): // the subscription broke: subscribe again
			}
		}
	})
	wg.Go(func() { every(ctx, fleetPrefillTTL/5, func(context.Context) { f.expire() }) })
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			f.drop(func(remotePrefill) bool { return true })
			return
		case m := <-f.out:
			result := "sent"
			if f.feed.MarkPrefill(ctx, m) != nil {
				result = "failed"
			}
			f.pool.metrics.prefillMarks.WithLabelValues(result).Inc()
		}
	}
}

// apply counts another replica's mark: a beginning on a worker this pool has adds to its
// fleetPrefills, the end takes it off again and wakes AwaitInteractive.
func (f *fleetPrefills) apply(replica string, m PrefillMark) {
	k := remoteMark{replica: replica, seq: m.Seq}
	if m.Ended {
		f.mu.Lock()
		r, ok := f.live[k]
		if ok {
			delete(f.live, k)
			r.w.fleetPrefills.Add(-1)
		}
		f.mu.Unlock()
		if ok {
			f.pool.interactivePrefilled.notify()
		}
		return
	}
	w, err := f.pool.find(m.Worker)
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[k]; ok {
		return
	}
	if len(f.live) >= maxFleetPrefills {
		f.pool.metrics.prefillMarks.WithLabelValues("over").Inc()
		return
	}
	f.live[k] = remotePrefill{w: w, since: f.pool.now()}
	w.fleetPrefills.Add(1)
	f.pool.metrics.prefillMarks.WithLabelValues("received").Inc()
}

// expire stops counting the other replicas' marks older than fleetPrefillTTL.
func (f *fleetPrefills) expire() {
	cut := f.pool.now().Add(-fleetPrefillTTL)
	if n := f.drop(func(r remotePrefill) bool { return r.since.Before(cut) }); n > 0 {
		f.pool.metrics.prefillMarks.WithLabelValues("expired").Add(float64(n))
	}
}

// drop stops counting the other replicas' marks that gone reports, wakes AwaitInteractive when
// it dropped any, and returns how many.
func (f *fleetPrefills) drop(gone func(remotePrefill) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, r := range f.live {
		if gone(r) {
			delete(f.live, k)
			r.w.fleetPrefills.Add(-1)
			n++
		}
	}
	if n > 0 {
		f.pool.interactivePrefilled.notify()
	}
	return n
}

// encodePrefillMark is m as sent, with the sender's name, or an error if it is too large.
func encodePrefillMark(replica string, m PrefillMark) ([]byte, error) {
	b, err := json.Marshal(struct {
		From string `json:"r"`
		PrefillMark
	}{replica, m})
	if err == nil && len(b) > maxPrefillMarkBytes {
		err = fmt.Errorf("prefill mark of %d bytes, over %d", len(b), maxPrefillMarkBytes)
	}
	return b, err
}

// decodePrefillMark reads a mark as encodePrefillMark wrote it, with its sender's name; ok is
// false for a malformed or oversized one, one without a sender, worker or number, or one of
// replica's own.
func decodePrefillMark(replica, payload string) (from string, m PrefillMark, ok bool) {
	if len(payload) > maxPrefillMarkBytes {
		return "", PrefillMark{}, false
	}
	var v struct {
		From string `json:"r"`
		PrefillMark
	}
	if json.Unmarshal([]byte(payload), &v) != nil || v.From == "" || v.From == replica || v.Worker == "" || v.Seq == 0 {
		return "", PrefillMark{}, false
	}
	return v.From, v.PrefillMark, true
}
