package queue

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors, for errors.Is. A *Rejection unwraps to the one of its Reason.
var (
	// ErrQueueFull: a per-tenant or per-class cap was reached (HTTP 429 queue_full).
	ErrQueueFull = errors.New("queue full")
	// ErrDeadlineUnreachable: the deadline cannot be met given the work ahead (HTTP 429
	// deadline_unreachable).
	ErrDeadlineUnreachable = errors.New("deadline unreachable")
	// ErrTooLarge: the request's tokens exceed what its class may ever hold under the current
	// capacity (HTTP 400 request_too_large).
	ErrTooLarge = errors.New("request larger than the token capacity")
	// ErrShutdown: the queue was closed (HTTP 503).
	ErrShutdown = errors.New("queue shut down")
	// ErrDeadlineExceeded: the deadline passed while the request waited (HTTP 504
	// deadline_exceeded). Returned bare by Ticket.Wait, never inside a Rejection.
	ErrDeadlineExceeded = errors.New("deadline exceeded in queue")
)

// Reason says why a request was refused.
type Reason uint8

// The reasons of a Rejection.
const (
	// QueueFull: a cap was reached; retry after RetryAfter.
	QueueFull Reason = iota + 1
	// DeadlineUnreachable: the deadline cannot be met; retrying after RetryAfter with the same
	// time budget may succeed.
	DeadlineUnreachable
	// TooLarge: the request can never be dispatched under the current capacity; retrying the
	// same request is pointless.
	TooLarge
	// Shutdown: the queue is closed; retry (elsewhere) after RetryAfter.
	Shutdown
)

var reasonNames = [...]string{"", "queue_full", "deadline_unreachable", "request_too_large", "shutdown"}

// String returns the reason as the error code the gateway puts in its response.
func (r Reason) String() string {
	if int(r) < len(reasonNames) && r != 0 {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

func (r Reason) sentinel() error {
	switch r {
	case QueueFull:
		return ErrQueueFull
	case DeadlineUnreachable:
		return ErrDeadlineUnreachable
	case TooLarge:
		return ErrTooLarge
	default:
		return ErrShutdown
	}
}

// Rejection is a refusal: returned by Enqueue at once, and by Ticket.Wait when Close ended a
// queued request. RetryAfter is how long the client should wait before trying again (at least
// Config.MinRetryAfter; 0 for TooLarge); the gateway rounds it up to whole seconds.
type Rejection struct {
	Reason     Reason
	RetryAfter time.Duration
}

func (r *Rejection) Error() string {
	if r.RetryAfter > 0 {
		return fmt.Sprintf("queue: rejected: %v (retry after %v)", r.Reason, r.RetryAfter)
	}
	return fmt.Sprintf("queue: rejected: %v", r.Reason)
}

// Unwrap returns the sentinel of the reason, so errors.Is(err, ErrQueueFull) works.
func (r *Rejection) Unwrap() error { return r.Reason.sentinel() }

var _ error = (*Rejection)(nil)
