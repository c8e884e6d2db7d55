package queue_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/usherllm/usher/queue"
)

// status is how the gateway answers each way a request can leave the queue without a Grant.
func status(err error) (code int, errCode string, retryAfter int) {
	var rej *queue.Rejection
	switch {
	case errors.As(err, &rej) && rej.Reason == queue.TooLarge:
		return 400, rej.Reason.String(), 0
	case errors.As(err, &rej) && rej.Reason == queue.Shutdown:
		return 503, rej.Reason.String(), int(math.Ceil(rej.RetryAfter.Seconds()))
	case errors.As(err, &rej): // QueueFull, DeadlineUnreachable
		return 429, rej.Reason.String(), int(math.Ceil(rej.RetryAfter.Seconds()))
	case errors.Is(err, queue.ErrDeadlineExceeded):
		return 504, "deadline_exceeded", 0
	default: // the client went away: nothing to answer
		return 499, "client_closed_request", 0
	}
}

// The gateway's side of one request: enqueue, wait, pick a worker, proxy, report usage.
func Example() {
	q, err := queue.New(queue.Config{MaxQueuedPerTenant: 1}, queue.Options{Model: "llama"})
	if err != nil {
		panic(err)
	}
	defer q.Close()
	q.SetCapacity(queue.Capacity{Requests: 1, Tokens: 4096}) // from the healthy workers

	serve := func(ctx context.Context, r queue.Request) {
		t, err := q.Enqueue(r)
		if err != nil {
			fmt.Println(status(err))
			return
		}
		g, err := t.Wait(ctx) // ctx: the client's request context
		if err != nil {
			fmt.Println(status(err))
			return
		}
		// Pick a worker now (late binding), send with X-Usher-Class: g.Class, then:
		fmt.Println("dispatched", g.Class)
		g.Done(queue.Usage{PromptTokens: 120, CompletionTokens: 80})
	}

	ctx := context.Background()
	serve(ctx, queue.Request{Tenant: "acme", Class: queue.Interactive, Weight: 1, PromptTokens: 120, MaxTokens: 256,
		Deadline: time.Now().Add(30 * time.Second)})
	serve(ctx, queue.Request{Tenant: "acme", Class: queue.Batch, PromptTokens: 5000})
	// Output:
	// dispatched interactive
	// 400 request_too_large 0
}
