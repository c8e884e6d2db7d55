package routing

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
)

// Calls for room, between the replicas of a fleet (see the fleet's reserve in share_reserve.go):
// a replica whose interactive request finds no room, none in the fleet's reserve and nothing of
// its own to preempt calls the others (CallForRoom); one that can end a lower-class request of
// its own on a worker the request may use lends the reserve that room (LendReserve) and tells
// the fleet it lent (a loan call); the waiting replica takes it (TakeReserve).

// RoomCalls carries the calls for room among the replicas of a fleet (a RedisStore). A
// ShareStore may implement it; without it a replica's interactive request waits for room its
// own replica can make.
type RoomCalls interface {
	// CallRoom tells every other replica watching of c. Delivery is at most once: a call lost
	// to a broken connection leaves the request to wait for room as it would without calls.
	CallRoom(ctx context.Context, c RoomCall) error
	// WatchRoomCalls calls called with each call another replica made, until ctx ends.
	WatchRoomCalls(ctx context.Context, called func(RoomCall))
}

// RoomCall is one call for room: an interactive request waits for room on one of Workers for
// Model, or (Lent) a replica lent the fleet's reserve of Workers[0] room for such a request.
type RoomCall struct {
	Model   string   `json:"m"`
	Workers []string `json:"w"`
	Lent    bool     `json:"l,omitempty"`
}

// maxRoomCallBytes bounds a call as sent and as read: a model name and up to MaxShareWorkers
// worker IDs fit well within it; a larger one is not sent, and dropped when read.
const maxRoomCallBytes = 64 << 10

// encodeRoomCall is c as sent, with the caller's name, or an error if it is too large.
func encodeRoomCall(replica string, c RoomCall) ([]byte, error) {
	b, err := json.Marshal(struct {
		From string `json:"r"`
		RoomCall
	}{replica, c})
	if err == nil && len(b) > maxRoomCallBytes {
		err = fmt.Errorf("room call of %d bytes, over %d", len(b), maxRoomCallBytes)
	}
	return b, err
}

// decodeRoomCall reads a call as encodeRoomCall wrote it; ok is false for a malformed or
// oversized one, one without workers or (unless a loan call) a model, or one of replica's own.
func decodeRoomCall(replica string, payload string) (c RoomCall, ok bool) {
	if len(payload) > maxRoomCallBytes {
		return RoomCall{}, false
	}
	var m struct {
		From string `json:"r"`
		RoomCall
	}
	if json.Unmarshal([]byte(payload), &m) != nil || m.From == replica || m.Model == "" && !m.Lent ||
		len(m.Workers) == 0 || len(m.Workers) > MaxShareWorkers {
		return RoomCall{}, false
	}
	return m.RoomCall, true
}

// CallsForRoom reports whether this replica calls the fleet for room: with a ShareStore that
// carries calls (RoomCalls) and a fleet's reserve to lend to.
func (p *Pool) CallsForRoom() bool {
	return p.shares != nil && p.shares.calls != nil && p.reserveShare > 0
}

// CallForRoom calls the other replicas for room for an interactive request of model that
// found none here, none in the fleet's reserve (TakeReserve) and nothing of this replica's own
// to end for it, on the workers of short (Shortfalls) that the fleet keeps a reserve of (a
// loan is room in a reserve; a reserve of a tenth keeps one request of three two-slot workers,
// on one of them): a replica that can end a lower-class request of its own on one of them lends
// the reserve that room and tells of it (LoanMade). One PUBLISH. It calls nothing when a worker
// of short has room already, or none has a reserve. It reports whether the call went out.
func (p *Pool) CallForRoom(ctx context.Context, model string, short []Shortfall) bool {
	if !p.CallsForRoom() ||
		slices.ContainsFunc(short, func(s Shortfall) bool { return s.Requests <= 0 && s.Tokens <= 0 }) {
		return false
	}
	var ids []string
	for _, s := range short {
		if n, _ := s.Worker.reserveSize(); n > 0 {
			ids = append(ids, s.Worker.spec.ID)
		}
	}
	if len(ids) == 0 {
		return false
	}
	result := "made"
	if p.shares.calls.CallRoom(ctx, RoomCall{Model: model, Workers: ids}) != nil {
		result = "failed"
	}
	p.metrics.roomCalls.WithLabelValues(result).Inc()
	return result == "made"
}

// LoanMade returns a channel closed when a replica next tells of a loan to the fleet's reserve
// (see CallForRoom): an interactive request that waits for room may take it (TakeReserve).
// Call it before CallForRoom, and again after each close. Safe for concurrent use.
func (p *Pool) LoanMade() <-chan struct{} { return p.loans.Wait() }

// WatchRoomCalls hears the other replicas' calls until ctx ends: for each call for room, lend
// is called with the call's model and those of its workers this replica knows serving it and
// keeping a reserve of the fleet's, in the call's order (lend may then LendReserve and end a request of its own); each loan call
// closes LoanMade. lend runs on the watching goroutine, one call at a time. It returns at once
// when this replica does not call for room (CallsForRoom).
func (p *Pool) WatchRoomCalls(ctx context.Context, lend func(model string, workers []*Worker)) {
	if !p.CallsForRoom() {
		return
	}
	p.shares.calls.WatchRoomCalls(ctx, func(c RoomCall) {
		if c.Lent {
			p.loans.notify()
			return
		}
		ms := p.snap.Load().models[c.Model]
		if ms == nil {
			return
		}
		var ws []*Worker
		for _, id := range c.Workers {
			i := slices.IndexFunc(ms.workers, func(w *Worker) bool { return w.spec.ID == id })
			if i < 0 {
				continue
			}
			if n, _ := ms.workers[i].reserveSize(); n > 0 {
				ws = append(ws, ms.workers[i])
			}
		}
		if len(ws) > 0 {
			lend(c.Model, ws)
		}
	})
}

// announceLoan tells the other replicas that this one lent the fleet's reserve of w room
// (LendReserve), so that their waiting interactive requests take it; this replica's own too.
func (p *Pool) announceLoan(ctx context.Context, w *Worker) {
	p.loans.notify()
	if p.shares.calls != nil && p.shares.calls.CallRoom(ctx, RoomCall{Workers: []string{w.spec.ID}, Lent: true}) != nil {
		p.metrics.roomCalls.WithLabelValues("failed").Inc()
	}
}

var _ RoomCalls = (*RedisStore)(nil)

// CallRoom implements RoomCalls with one PUBLISH on RoomCallsChannel.
func (s *RedisStore) CallRoom(ctx context.Context, c RoomCall) error {
	b, err := encodeRoomCall(s.replica, c)
	if err != nil {
		return err
	}
	return s.tell(ctx, RoomCallsChannel, b)
}

// WatchRoomCalls implements RoomCalls with a subscription on a connection of its own, which
// go-redis re-establishes after a lost connection (calls made meanwhile are missed). The
// replica's own calls, and malformed or oversized ones, are not passed on.
func (s *RedisStore) WatchRoomCalls(ctx context.Context, called func(RoomCall)) {
	s.watch(ctx, RoomCallsChannel, func(payload string) {
		if c, ok := decodeRoomCall(s.replica, payload); ok {
			called(c)
		}
	})
}
