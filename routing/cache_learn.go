package routing

import (
	"context"
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// outcomeLearner is implemented by policies that check each of their picks against what the engine then
// reports. Pool.Pick calls pickLearning in place of Pick and hands the prediction, with the
// request's Outcome, to learn when the lease is released. Both are safe for concurrent use.
type outcomeLearner interface {
	pickLearning(ctx context.Context, r choice, workers []*Worker) (*Worker, Route, prediction)
	learn(p prediction, o Outcome)
}

var _ outcomeLearner = (*CacheAware)(nil)

// prediction is what one Pick of CacheAware expected of the chosen worker's prefix cache.
type prediction struct {
	worker string // ID of the chosen worker; "" when nothing was predicted
	prompt int    // bytes of the prompt
	held   int    // leading prompt bytes the tree said the worker held
	last   int64  // the worker's last access of those bytes before the Pick; 0 when held is 0
}

// Tolerance of learn: a prediction within max(learnSlackBytes, prompt/learnSlackShare) bytes of
// what the engine reported is right. Engines cache whole blocks (vLLM: 16 tokens, about 64
// bytes) and never the prompt's last token, and the chat template's tokens are not in the
// prompt text, so a few tokens off is no evidence about the cache's size.
const (
	learnSlackBytes = 128
	learnSlackShare = 20
	// learnProbeShare: a right prediction of a held prefix raises the worker's limit by
	// prompt/learnProbeShare bytes, so a limit learned too small (after a burst that evicted more
	// than usual) grows back to the engine's size; the first prediction too large trims it again.
	learnProbeShare = 16
)

// learn compares p with the cached tokens the engine reported for the request (o.CachedTokens of
// o.PromptTokens, scaled to prompt bytes), records the error (a share of the prompt) in the
// policy's histogram, and corrects the tree:
//
//   - The engine held less than predicted: it dropped a prefix the tree still listed for it, so
//     its cache (least recently used out first, as in every engine) is smaller than what the
//     worker was sent since that prefix was last used, plus the prefix. The worker's limit
//     becomes the bytes of those other prompts (at least this prompt, which the engine holds
//     now), and from then on only its most recent entries within the limit count as held (its
//     horizon, moved at every insert). The older ones stay in the tree, up to
//     MaxBytesPerWorker, as where their prefixes used to live: a prefix nobody holds any more
//     goes back to its last holder (RouteCacheAffinity) rather than to a new worker, so a
//     group of prompts keeps meeting on one engine. This prompt itself needs no correction: the
//     engine has just prefilled all of it, as the tree says.
//   - The engine held more than predicted: the limit was too small (or another replica sent the
//     prefix there); it grows by the difference.
//   - Right about a held prefix: the limit grows a little (learnProbeShare).
//
// The limit never exceeds MaxBytesPerWorker. Without a reported cache count (o.CacheReported
// false: the engine says nothing about its cache) or with a failed request, nothing is learned.
// Costs a few operations, plus, when the limit moves, a walk of the worker's entries within it
// (and, when the engine held less, of those used since the lost prefix).
func (c *CacheAware) learn(p prediction, o Outcome) {
	if p.worker == "" || p.prompt == 0 || o.Failed || !o.CacheReported || o.PromptTokens <= 0 {
		return
	}
	cached := min(max(o.CachedTokens, 0), o.PromptTokens)
	observed := int(float64(p.prompt) * float64(cached) / float64(o.PromptTokens))
	miss := p.held - observed
	if c.predictionError != nil {
		c.predictionError.Observe(math.Abs(float64(miss)) / float64(p.prompt))
	}
	slack := max(learnSlackBytes, p.prompt/learnSlackShare)
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.tree.slots[p.worker]
	if !ok {
		return
	}
	w := c.tree.workers[s]
	limit := c.limitOf(w)
	switch {
	case miss > slack:
		// bytesSince counts this prompt too (the Pick touched it): the rest displaced the lost
		// prefix.
		others := c.tree.bytesSince(s, p.last) - int64(min(p.prompt, int(c.cfg.MaxBytesPerWorker)))
		limit = min(limit, max(others, int64(p.prompt)))
	case miss < -slack:
		limit += int64(-miss)
	case p.held > 0:
		limit += int64(p.prompt / learnProbeShare)
	default:
		return
	}
	limit = min(limit, c.cfg.MaxBytesPerWorker)
	if w.limit == 0 {
		if limit == c.cfg.MaxBytesPerWorker {
			return
		}
		c.tree.limited++
	}
	w.limit = limit
	w.horizon = c.tree.horizon(s, limit)
}

// Limit returns the bytes the tree may mirror for worker id: MaxBytesPerWorker until its engine
// reported holding less than the tree predicted, then what it was found to keep. 0 for a worker
// the tree does not know. Safe for concurrent use.
func (c *CacheAware) Limit(id string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.tree.slots[id]
	if !ok {
		return 0
	}
	return c.limitOf(c.tree.workers[s])
}

// Limits returns Limit for every worker the tree knows, by ID. Safe for concurrent use.
func (c *CacheAware) Limits() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.tree.slots))
	for id, s := range c.tree.slots {
		out[id] = c.limitOf(c.tree.workers[s])
	}
	return out
}

// newPredictionErrorHistogram is usher_routing_cache_prediction_error_ratio, by model.
func newPredictionErrorHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "usher_routing_cache_prediction_error_ratio",
		Help:    "Per request routed by cache_aware, |prefix the tree predicted the worker held - cached tokens the engine reported| as a share of the prompt, by model.",
		Buckets: []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1},
	}, []string{"model"})
}
