package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
)

// A client that would rather be told at once than served late says so with
// X-Usher-Objective-Miss: reject. Its call is then refused with 429 objective_unreachable and a
// Retry-After, before it queues, when no worker's cost model predicts a first token within the
// call's TTFT objective; and once queued, when it has waited so long that the best prediction no
// longer fits (its queue deadline is the objective's slack). The default, serve, serves every
// call and counts a late one as missed. Refusals are the client's choice, so they are not judged
// (see judge): attainment counts what was served.
const headerObjectiveMiss = "X-Usher-Objective-Miss"

// minObjectiveRetry is the least Retry-After of an objective_unreachable refusal: the
// prediction it rests on changes with the workers' load, which a second is enough to change.
const minObjectiveRetry = time.Second

// errObjectiveUnreachable: no worker is predicted to meet the call's TTFT objective (HTTP 429
// objective_unreachable).
var errObjectiveUnreachable = errors.New("objective unreachable")

// objectiveRefusal is an objective_unreachable refusal with what it rests on.
type objectiveRefusal struct {
	objective, predicted time.Duration // the best worker's: its objective and predicted TTFT
	retryAfter           time.Duration
}

func (e *objectiveRefusal) Error() string {
	if e.predicted == 0 {
		return fmt.Sprintf("%v: the queue's wait would pass the TTFT objective", errObjectiveUnreachable)
	}
	return fmt.Sprintf("%v: the best predicted time to first token is %v against an objective of %v",
		errObjectiveUnreachable, e.predicted.Round(time.Millisecond), e.objective.Round(time.Millisecond))
}

func (e *objectiveRefusal) Unwrap() error { return errObjectiveUnreachable }

// askedMissPolicy reads X-Usher-Objective-Miss: "reject" or "serve" (the default), any case.
func (cl *call) askedMissPolicy(h http.Header) error {
	switch v := headerValue(h, headerObjectiveMiss); {
	case v == "", strings.EqualFold(v, "serve"):
	case strings.EqualFold(v, "reject"):
		cl.rejectMiss = true
	default:
		return BadRequest("", "%s must be reject or serve", headerObjectiveMiss)
	}
	return nil
}

// objectiveSlack is how long the call may still wait in the queue and meet its TTFT objective on
// the worker predicted to serve it soonest: over the model's workers that can predict, the most
// of (the call's objective, the model's, less the time it has spent in usher already, less the
// worker's predicted TTFT for its prompt now). ok is false when it cannot be told (no TTFT
// objective, no worker that can predict yet): the call then queues as any other. A slack of zero
// or less refuses the call (see refuseIfUnreachable).
//
// The prediction assumes no cached prefix: usher cannot know before placement what an engine
// holds, and a default objective (relative to the idle prediction, made on the same assumption)
// is not moved by it. A tier's fixed objective is then judged a little pessimistically for a
// prompt whose prefix a worker holds.
func (s *Server) objectiveSlack(cl *call) (slack time.Duration, best *objectiveRefusal, ok bool) {
	slack, at, ok := s.slack(cl, nowPrediction)
	if !ok {
		return 0, nil, false
	}
	return slack, &at, true
}

// slack is objectiveSlack with the prediction of each worker that pred picks, and what it rests
// on as a value. The objective is the model's, relative to the typical idle prediction of the
// workers that can predict (routing.TypicalPrediction), as judge holds the call to. No
// allocation up to 16 workers: due runs it for every call.
func (s *Server) slack(cl *call, pred func(routing.WorkerPrediction) routing.Prediction) (slack time.Duration, best objectiveRefusal, ok bool) {
	if ttft, _ := cl.stated(); !ttft {
		return 0, best, false
	}
	var wbuf [16]routing.WorkerPrediction
	var ibuf [16]routing.Prediction
	wps, idle := wbuf[:0], ibuf[:0]
	for wp := range s.pool.Predictions(cl.model, cl.promptTokens, 0) {
		wps, idle = append(wps, wp), append(idle, wp.Idle)
	}
	o := cl.objectiveGiven(routing.TypicalPrediction(idle), len(idle) > 0).ttft
	if o == 0 {
		return 0, best, false
	}
	spent := max(s.now().Sub(cl.start), 0)
	for _, wp := range wps {
		if p := pred(wp).TTFT; !ok || o-spent-p > slack {
			slack, ok = o-spent-p, true
			best = objectiveRefusal{objective: o, predicted: p}
		}
	}
	return slack, best, ok
}

// nowPrediction and idlePrediction pick a worker's prediction for slack.
func nowPrediction(wp routing.WorkerPrediction) routing.Prediction  { return wp.Now }
func idlePrediction(wp routing.WorkerPrediction) routing.Prediction { return wp.Idle }

// due is the last moment the call, about to queue, can be sent and still meet its TTFT
// objective: now plus its slack on the worker that leaves the most, each worker's TTFT taken as
// on it idle (the least it can be once sent, so a call past its due can meet its objective
// nowhere); zero when that cannot be told (see objectiveSlack). The queue serves a tenant's calls
// past theirs after those that can still meet theirs (queue.Request.Due), so that a model
// overloaded serves most calls in time rather than every one late.
func (s *Server) due(cl *call) time.Time {
	slack, _, ok := s.slack(cl, idlePrediction)
	if !ok {
		return time.Time{}
	}
	return s.now().Add(slack)
}

// holdToObjective applies X-Usher-Objective-Miss: reject to a call about to queue: refused now
// when no worker is predicted to meet its TTFT objective, else its queue deadline tightened to
// the objective's slack, so that it leaves the queue refused (objectiveMissed) rather than be
// served late. Calls that did not ask are untouched.
func (s *Server) holdToObjective(cl *call) error {
	if !cl.rejectMiss {
		return nil
	}
	slack, best, ok := s.objectiveSlack(cl)
	switch {
	case !ok:
		return nil
	case slack <= 0:
		best.retryAfter = max(-slack, minObjectiveRetry)
		return best
	}
	if by := s.now().Add(slack); cl.deadline.IsZero() || by.Before(cl.deadline) {
		cl.deadline, cl.objectiveDeadline = by, true
	}
	return nil
}

// objectiveMissed turns the queue's refusal of a call whose deadline is its objective's slack
// (holdToObjective) into an objective_unreachable refusal; any other error is returned as it is.
func (cl *call) objectiveMissed(err error) error {
	if !cl.objectiveDeadline {
		return err
	}
	var rej *queue.Rejection
	switch {
	case errors.As(err, &rej) && rej.Reason == queue.DeadlineUnreachable:
		return &objectiveRefusal{retryAfter: max(rej.RetryAfter, minObjectiveRetry)}
	case errors.Is(err, queue.ErrDeadlineExceeded):
		return &objectiveRefusal{retryAfter: minObjectiveRetry}
	}
	return err
}
