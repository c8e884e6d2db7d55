// Package queue admits, orders and releases the requests of one model: the token-weighted
// priority and deadline queues at the heart of usher. It knows nothing of HTTP or workers; the
// gateway keeps one Queue per model, feeds it the pool's Capacity, and gives each request a
// Placer that binds it to a worker at the moment the queue would release it (late binding): a
// request leaves the queue with its worker, so the queue's order is the order of service, and
// there is no other wait.
//
// # The way of a request
//
// Enqueue admits a Request or refuses it at once with a *Rejection (queue full, deadline
// unreachable, too large, shut down). Ticket.Wait blocks until the request is released with a
// Grant, its deadline passes (ErrDeadlineExceeded), the queue closes, or the caller's context
// ends (the request is removed at once). Grant.Done frees the capacity and reports real usage.
//
// # Capacity
//
// A request holds one request slot and cost = prompt + max output tokens while in flight. It is
// released only when both fit in Capacity now.
//
// The interactive reserve is ceil(InteractiveReserve x capacity) in each dimension (at most all
// but one request slot). A Standard or Batch request is released only if at least the reserve
// stays free after it, so an arriving interactive request finds room at once instead of
// waiting for a long batch request to end; Interactive may use everything. (The one exception,
// a dispatch the starvation guard owes, may use room interactive leaves free, but Standard and
// Batch together still never hold more than capacity minus the reserve.)
//
// # Order
//
// Each time capacity frees or something arrives, the queue releases requests for as long as the
// next one in this order fits:
//
//  1. Classes the starvation guard owes a dispatch, highest first. A class with MinShare s gains
//     s credit on every dispatch (of any class) while it is backlogged, spends 1 on each of its
//     own dispatches, and loses its credit when it drains; at credit 1 it is owed. So while a
//     class stays backlogged it receives at least about s of all dispatches, whatever floods
//     above it.
//  2. Then strict priority: Interactive, Standard, Batch.
//
// Within a class the next request is that of the tenant with the least virtual token counter
// (the Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language Models", OSDI
// 2024): a dispatch charges the tenant (prompt + 2 x max output) / weight, and Done corrects the
// charge to (prompt + 2 x completion) / weight of the real usage. A tenant that comes back from
// idle starts at the least counter of the backlogged tenants (or of the last served one), so
// idling earns no credit. Within one tenant and class, the earliest deadline goes first (then
// arrival), except that a request found past its due (Request.Due: the last moment its dispatch
// meets its latency objective) goes after those not past theirs: late last. Under overload, an
// order by arrival makes every request late (each waits for all the late ones before it); late
// last serves most in time, and the late ones once none of the others waits, or their deadline
// ends them (adaptive LIFO, Maurer, "Fail at Scale", 2015). Without dues, or with none past, the
// order is by deadline and arrival alone.
//
// The next request is head of line: when it does not fit, nothing behind it in this order is
// released, except that when a Standard or Batch request is held back only by the reserve,
// Interactive may still go (lower classes may not). This keeps priority and fair share exact and the work conserving:
// capacity stays idle only while the request entitled to it waits for room.
//
// # Placement
//
// A request that fits is released only once its Placer places it (Request.Placer; without one,
// Capacity alone decides). When the Placer finds no room for it (the workers it may use are
// full, though the pool has room), it is passed over for the round and the next request in the
// same order is tried, so a request pinned to a full worker does not hold back the ones that
// can go elsewhere; it keeps its place and is tried first again at the next round. A round
// passes over at most maxPassedOver requests, and at most maxRefusedPerFlow of one tenant's in a
// class one by one: at the next refusal the rest of that tenant's requests in the class wait for
// the next round, so one tenant's unplaceable requests never hold back another tenant's. Rounds run at each Enqueue, Done, Requeue,
// SetCapacity and deadline, and at Retry: the gateway calls it when a worker frees a slot.
//
// # Fleet
//
// Replicas of a gateway behind one load balancer each keep a queue per model; with
// Options.FairShare they order their tenants by one fleet-wide counter per tenant and class.
// Each charge is made to the local counter at once and noted as unsent; SyncFairShare, called
// by the gateway every few tens of milliseconds off the admission path, sends the unsent
// charges (and the lifts of returning flows) in one batch and takes the fleet's counters and
// floors back; the counters then are the fleet's plus what was charged here since. A flow that
// comes back from idle starts at the least counter backlogged in the fleet (each replica sends
// its own least with each exchange; the least backlogged here, when lower; without either, the
// counter served last here), so a tenant new to one replica has no surplus over the tenants the
// others serve. When an exchange fails the queue
// keeps its counters, which carry what it last read of the fleet, and sends the charges with the
// next exchange: the fleet's order degrades to each replica's own, never to a halt.
//
// # Deadlines
//
// One timer, on the injected Clock, is set for the earliest queued deadline; expired requests
// end with ErrDeadlineExceeded, and a request whose deadline has passed is never released. At
// arrival the queue estimates the wait: the requests and tokens ahead (all of higher classes;
// in its class its own tenant's queue but the late requests, which go after it, plus at most as
// much again from each other backlogged tenant, as the fair share interleaves them) over the
// pool's drain rate (capacity over the moving average of service time, dispatch to Done). If the
// deadline falls before it, the request is refused with DeadlineUnreachable and RetryAfter =
// estimate - time budget. Before any measurement everything is admitted.
//
// # FIFO mode
//
// Config.FIFO makes a plain first-come-first-served queue over all classes and tenants, with
// the same capacity, caps and deadlines but no reserve, guard or fair share: the benchmark
// baseline.
//
// # Cost
//
// Every operation is O(log n) in the queued requests: per class a heap of backlogged tenants
// by counter, per tenant and class a heap of requests by deadline, one heap of the tenants'
// earliest deadlines (for the timer), and per class an arrival list; every element records its heap positions, so cancellation
// removes it directly. Releasing a request does not allocate; Enqueue allocates its Ticket
// and channel. One mutex guards all of it and is never held while blocking. Memory is bounded
// by the caps, plus a small record (the counter) per tenant and class ever seen.
package queue
