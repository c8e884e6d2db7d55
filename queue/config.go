package queue

import (
	"errors"
	"fmt"
	"time"
)

// Config sets the policy of one model's queue. The zero value is valid and means the defaults
// below; pointer fields are pointers so that an explicit 0 can be told from "not set".
type Config struct {
	// FIFO turns the queue into one plain first-come-first-served line: no classes, reserve,
	// starvation guard or fair share; caps and deadlines still apply. It exists as the baseline
	// for benchmarks.
	FIFO bool `yaml:"fifo"`

	// InteractiveReserve is the share of capacity, in requests and in tokens, that Standard and
	// Batch leave free: they are dispatched only while at least this much stays free after them,
	// so an arriving interactive request finds room at once. A larger reserve lowers interactive
	// wait under a batch flood and costs batch throughput. In [0, 1); default 0.10.
	InteractiveReserve *float64 `yaml:"interactive_reserve"`

	// StandardMinShare and BatchMinShare are the starvation guard: while the class is
	// backlogged it gets at least this share of all dispatches, even under a flood of higher
	// classes. In [0, 1), together below 1; default 0.05 each; 0 turns the guard off.
	StandardMinShare *float64 `yaml:"standard_min_share"`
	BatchMinShare    *float64 `yaml:"batch_min_share"`

	// MaxQueuedPerTenant caps the requests one tenant may have waiting, over all classes.
	// Default 1000.
	MaxQueuedPerTenant int `yaml:"max_queued_per_tenant"`

	// MaxQueuedPerClass caps the requests waiting in one class (in FIFO mode, in each class
	// as requested). Default 10000. Memory of the queue is bounded by 3 x this cap.
	MaxQueuedPerClass int `yaml:"max_queued_per_class"`

	// MinRetryAfter is the least Retry-After handed out with a queue_full or
	// deadline_unreachable refusal. Default 1s.
	MinRetryAfter time.Duration `yaml:"min_retry_after"`

	// ShutdownRetryAfter is the Retry-After handed out to requests ended by Close. Default 5s.
	ShutdownRetryAfter time.Duration `yaml:"shutdown_retry_after"`
}

// Defaults of Config.
const (
	DefaultInteractiveReserve = 0.10
	DefaultMinShare           = 0.05
	DefaultMaxQueuedPerTenant = 1000
	DefaultMaxQueuedPerClass  = 10000
	DefaultMinRetryAfter      = time.Second
	DefaultShutdownRetryAfter = 5 * time.Second
)

// Validate reports the first invalid field, named as in the config file under "queue.".
// Unset fields are valid: they take their defaults.
func (c Config) Validate() error {
	share := func(name string, p *float64) error {
		if p != nil && (*p < 0 || *p >= 1) {
			return fmt.Errorf("queue.%s: must be in [0, 1), got %v", name, *p)
		}
		return nil
	}
	if err := errors.Join(
		share("interactive_reserve", c.InteractiveReserve),
		share("standard_min_share", c.StandardMinShare),
		share("batch_min_share", c.BatchMinShare),
	); err != nil {
		return err
	}
	d := c.withDefaults()
	if *d.StandardMinShare+*d.BatchMinShare >= 1 {
		return fmt.Errorf("queue.batch_min_share: standard_min_share + batch_min_share must be below 1, got %v",
			*d.StandardMinShare+*d.BatchMinShare)
	}
	switch {
	case c.MaxQueuedPerTenant < 0:
		return fmt.Errorf("queue.max_queued_per_tenant: must not be negative, got %d", c.MaxQueuedPerTenant)
	case c.MaxQueuedPerClass < 0:
		return fmt.Errorf("queue.max_queued_per_class: must not be negative, got %d", c.MaxQueuedPerClass)
	case c.MinRetryAfter < 0:
		return fmt.Errorf("queue.min_retry_after: must not be negative, got %v", c.MinRetryAfter)
	case c.ShutdownRetryAfter < 0:
		return fmt.Errorf("queue.shutdown_retry_after: must not be negative, got %v", c.ShutdownRetryAfter)
	}
	return nil
}

// ReserveShare is the share of capacity held for interactive requests as the queue applies it:
// InteractiveReserve, or its default when unset; 0 in FIFO mode. A gateway fleet keeps the same
// share of each worker out of its replicas' shares (routing.Options.InteractiveReserve).
func (c Config) ReserveShare() float64 {
	if c.FIFO {
		return 0
	}
	return *c.withDefaults().InteractiveReserve
}

// withDefaults returns c with every unset field set to its default; c is not modified.
func (c Config) withDefaults() Config {
	orDefault := func(p *float64, d float64) *float64 {
		if p == nil {
			return &d
		}
		return p
	}
	c.InteractiveReserve = orDefault(c.InteractiveReserve, DefaultInteractiveReserve)
	c.StandardMinShare = orDefault(c.StandardMinShare, DefaultMinShare)
	c.BatchMinShare = orDefault(c.BatchMinShare, DefaultMinShare)
	if c.MaxQueuedPerTenant == 0 {
		c.MaxQueuedPerTenant = DefaultMaxQueuedPerTenant
	}
	if c.MaxQueuedPerClass == 0 {
		c.MaxQueuedPerClass = DefaultMaxQueuedPerClass
	}
	if c.MinRetryAfter == 0 {
		c.MinRetryAfter = DefaultMinRetryAfter
	}
	if c.ShutdownRetryAfter == 0 {
		c.ShutdownRetryAfter = DefaultShutdownRetryAfter
	}
	return c
}
