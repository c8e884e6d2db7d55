// Package routing owns the worker pool of the gateway: which inference workers serve which
// models, whether they are healthy, how loaded they are, and the policies that pick one of them
// for each request.
//
// The gateway builds one Pool from Config, runs its background work with Run, and for each
// request calls Prepare (the policy's I/O, before the request waits in its queue), Pick (pure:
// no I/O, only what Prepare found, the Request never modified), sends the request to
// Lease.Worker and calls Lease.Release with the outcome. Policies see each model's workers as a
// shared immutable snapshot that the pool replaces (copy on write) when membership changes, so
// the pick path takes no lock and copies nothing.
//
// Files by concern:
//
//   - config.go: Config and its defaults and validation; each policy's parameters live beside it.
//   - pool.go, worker.go: the pool, its snapshot, Pick and Lease; the worker's counters and states.
//   - lifecycle.go: Add, Remove, Replace, Retire, Drain, Undrain and worker status for the admin
//     API and config reloads.
//   - discovery.go: workers found by DNS (a headless Service), added and retired as their
//     addresses come and go.
//   - health.go, breaker.go, load.go: active health checks, the circuit breaker, and the load the
//     workers report on /metrics (vLLM, SGLang, llama.cpp names), including the load other
//     gateway replicas put on them.
//   - share.go, share_redis.go: with several gateway replicas, each worker's concurrency limit
//     split among them by demand (interactive first, weighted by the backlogged tenants as the
//     fair share weighs them) through Redis, so that together they never send a worker more
//     than its limit; when Redis is cut, each keeps within its last grant and 1/n of it.
//   - share_reserve.go: the fleet's interactive reserve, the part of each worker the split
//     leaves out, which a replica takes room of for one interactive request that finds none.
//   - policy.go: the Policy interface, Request.Eligible and the registry of policies by name.
//   - prepare.go: Prepare and Prepared, the I/O a policy needs done before it picks.
//   - choice.go: one pick as a policy sees it, the request and the protections in force, whose
//     Eligible every policy filters with. Each protection of interactive requests is a filter in
//     its own file: prefill_budget.go (the lower classes' prefill budget), prefill_pieces.go
//     (long lower-class prompts in pieces, each yielding to interactive prompts),
//     interactive_spread.go (interactive prompts spread over the workers).
//   - round_robin.go, random.go, least_request.go, power_of_two.go: load-only policies.
//   - ring.go, consistent_hash.go, prefix_hash.go: hash rings with bounded load.
//   - bucket.go: prompt-length ranges re-cut to equal load.
//   - pins.go, pins_redis.go, sticky.go: pins of sessions and routing keys (sticky_session,
//     manual) in memory or Redis.
//   - cache_aware.go, radix.go, cache_learn.go: the cache_aware policy, its prefix tree, and how
//     it learns each engine's real cache from the cached tokens the engine reports.
//   - metrics.go: the pool's Prometheus metrics (names prefixed usher_routing_).
//
// Each Lease carries a Route, the value of the X-Usher-Route response header, saying why its
// worker was picked: the policy's name for the load-only policies, "cache_hit", "cache_miss",
// "cache_rebalance", "cache_affinity" or "predicted_ttft" for cache_aware, "hash" or "spill" for the
// rings, "bucket" or "load_fallback", "sticky", "pinned", "assigned", "repinned", and "target"
// for a request that named its worker.
package routing
