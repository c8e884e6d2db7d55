package routing

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PrefixFeed carries the prompts cache_aware routes among gateway replicas, so that each
// replica's tree mirrors what every replica sent to the workers, not only its own 1/N of it.
// RedisStore implements it over Redis Pub/Sub. Both methods are safe for concurrent use.
type PrefixFeed interface {
	// PublishPrefixes sends one encoded batch to every replica subscribed for model.
	PublishPrefixes(ctx context.Context, model string, batch []byte) error
	// SubscribePrefixes calls fn with each batch published for model (its own replica's
	// included) until ctx ends, and returns then; batches published while it was not connected
	// are lost. It returns early only when it cannot subscribe at all.
	SubscribePrefixes(ctx context.Context, model string, fn func(batch []byte)) error
}

// Bounds of what one replica holds for its next batch, per model: inserts beyond them are dropped
// (and counted), so a Redis that is slow or away costs memory for one batch at most.
const (
	shareMaxInserts = 1024
	shareMaxBytes   = 4 << 20
	// shareMaxBatch bounds a batch read from the feed; a larger one is dropped whole.
	shareMaxBatch = shareMaxBytes + 64<<10
)

// sharedInsert is one prompt routed to one worker, as published, with the namespace of its cache
// scope (see CacheScope.namespace; absent for the global scope), so every replica keeps it within
// that scope.
type sharedInsert struct {
	Worker string `json:"w"`
	Scope  string `json:"s,omitempty"`
	Prompt string `json:"p"`
}

// shareBatch is what one replica publishes each ShareInterval.
type shareBatch struct {
	Replica string         `json:"r"`
	Inserts []sharedInsert `json:"i"`
}

// share is CacheAware's side of a PrefixFeed: inserts waiting for the next batch, and the
// replica's identity that makes it skip its own batches.
type share struct {
	feed    PrefixFeed
	model   string
	replica string // random, per policy instance
	logger  *slog.Logger
	// sent, received and dropped count inserts published, applied from other replicas, and
	// lost to the bounds or to a failed publish.
	sent, received, dropped prometheus.Counter

	// Guarded by CacheAware.mu: the inserts of the next batch and their prompt bytes.
	pending      []sharedInsert
	pendingBytes int
}

func newShare(feed PrefixFeed, env policyEnv) *share {
	var id [8]byte
	_, _ = rand.Read(id[:])
	sh := &share{feed: feed, model: env.model, replica: hex.EncodeToString(id[:]), logger: env.logger}
	if sh.logger == nil {
		sh.logger = slog.New(slog.DiscardHandler)
	}
	sh.sent = env.metrics.cacheShared.WithLabelValues(env.model, "sent")
	sh.received = env.metrics.cacheShared.WithLabelValues(env.model, "received")
	sh.dropped = env.metrics.cacheShared.WithLabelValues(env.model, "dropped")
	return sh
}

// add queues an insert for the next batch, or drops it when the batch is full. CacheAware.mu must
// be held. Costs an append; the prompt string is shared, not copied.
func (sh *share) add(worker, namespace, prompt string) {
	if len(sh.pending) >= shareMaxInserts || sh.pendingBytes+len(prompt) > shareMaxBytes {
		sh.dropped.Inc()
		return
	}
	sh.pending = append(sh.pending, sharedInsert{Worker: worker, Scope: namespace, Prompt: prompt})
	sh.pendingBytes += len(prompt)
}

// runShare publishes the pending inserts every ShareInterval and applies the other replicas'
// batches as they come, until ctx ends. CacheAware.Run runs it.
func (c *CacheAware) runShare(ctx context.Context) {
	sh := c.share
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			err := sh.feed.SubscribePrefixes(ctx, sh.model, c.applyBatch)
			if ctx.Err() != nil {
				return
			}
			sh.logger.Warn("cache_aware: cannot subscribe to the other replicas' prefixes", "model", sh.model, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(c.cfg.ShareInterval * 20):
			}
		}
	}()
	t := time.NewTicker(c.cfg.ShareInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case <-t.C:
			c.publish(ctx)
		}
	}
}

// publish sends the pending inserts as one batch.
func (c *CacheAware) publish(ctx context.Context) {
	sh := c.share
	c.mu.Lock()
	batch := shareBatch{Replica: sh.replica, Inserts: sh.pending}
	sh.pending, sh.pendingBytes = nil, 0
	c.mu.Unlock()
	if len(batch.Inserts) == 0 {
		return
	}
	b, err := json.Marshal(batch)
	if err == nil {
		err = sh.feed.PublishPrefixes(ctx, sh.model, b)
	}
	if err != nil {
		sh.dropped.Add(float64(len(batch.Inserts)))
		if ctx.Err() == nil {
			sh.logger.Warn("cache_aware: cannot publish prefixes to the other replicas", "model", sh.model, "inserts", len(batch.Inserts), "err", err)
		}
		return
	}
	sh.sent.Add(float64(len(batch.Inserts)))
}

// applyBatch inserts another replica's routed prompts into the tree, as if this replica had
// routed them now, each within the cache scope it was routed in: only for workers of the
// model's current snapshot, each prompt cut to
// MaxBytesPerWorker. A malformed or oversized batch is dropped whole. Each insert costs what a
// Pick's insert costs, under the same mutex.
func (c *CacheAware) applyBatch(b []byte) {
	sh := c.share
	if len(b) > shareMaxBatch {
		return
	}
	var batch shareBatch
	if err := json.Unmarshal(b, &batch); err != nil || batch.Replica == sh.replica {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now().UnixNano()
	applied := 0
	for _, in := range batch.Inserts {
		p := in.Prompt
		if p == "" || !c.members[in.Worker] {
			continue
		}
		if int64(len(p)) > c.cfg.MaxBytesPerWorker {
			p = p[:c.cfg.MaxBytesPerWorker]
		}
		slot, known := c.tree.slots[in.Worker]
		if !known {
			slot = c.tree.slot(in.Worker)
			c.view.workers = nil // the next Pick rebuilds its slot map with the new slot
		}
		c.tree.insert(p, c.tree.descend(c.tree.scopeRoot(in.Scope, true), p), slot, now)
		c.capNow(slot)
		applied++
	}
	sh.received.Add(float64(applied))
}
