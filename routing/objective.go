package routing

import "time"

// The default interactive TTFT objective, which the gateway judges interactive requests against
// when their tier states none, and which the pool warns of when a worker's engine steps make it
// unreachable (see Pool.checkObjective): 1.5x what the worker's cost model predicts for the
// prompt on an idle worker, at least 50 ms (the reasons are the gateway's; see its objective.go).
const (
	InteractiveObjectiveFactor = 1.5
	MinTTFTObjective           = 50 * time.Millisecond
)

// InteractiveObjective is the default interactive TTFT objective for a prompt whose idle
// prediction is idle: InteractiveObjectiveFactor times it, at least MinTTFTObjective.
func InteractiveObjective(idle time.Duration) time.Duration {
	return max(time.Duration(float64(max(idle, 0))*InteractiveObjectiveFactor), MinTTFTObjective)
}
