package routing

import "testing"

// The steering filter keeps an interactive request that avoids whole prompts off a worker
// prefilling one, and filters nothing otherwise.
func TestClearOfWholePrefill(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(2, "m")})
	ws := modelWorkers(t, p, "m")
	ws[0].wholePrefills.Store(1)
	r := &Request{Model: "m", Interactive: true}
	for _, tt := range []struct {
		name       string
		avoidWhole bool
		w          *Worker
		want       bool
	}{
		{"not steered: a worker prefilling a whole prompt", false, ws[0], true},
		{"steered: a worker prefilling a whole prompt", true, ws[0], false},
		{"steered: a worker clear of them", true, ws[1], true},
	} {
		c := choice{Request: r, avoidWhole: tt.avoidWhole}
		if got := c.clearOfWholePrefill(tt.w); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A long lower-class prompt goes whole to a worker only while another worker that takes
// requests has no whole one in prefill, and the worker itself prefills nothing of the lower
// classes; the one it lets go whole is counted.
func TestTakeWhole(t *testing.T) {
	for _, tt := range []struct {
		name    string
		workers int
		setup   func(ws []*Worker)
		want    bool
	}{
		{"one worker never", 1, func([]*Worker) {}, false},
		{"another worker clear of whole prompts", 2, func([]*Worker) {}, true},
		{"the other prefills a whole prompt", 2, func(ws []*Worker) { ws[1].wholePrefills.Store(1) }, false},
		{"the other is down", 2, func(ws []*Worker) { markDown(ws[1]) }, false},
		{"the worker prefills a lower-class piece", 2, func(ws []*Worker) { ws[0].prefill.tokens.Store(64) }, false},
		{"the worker prefills a whole prompt already", 3, func(ws []*Worker) { ws[0].wholePrefills.Store(1) }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newTestPool(t, Config{Workers: testWorkers(tt.workers, "m")})
			ws := modelWorkers(t, p, "m")
			tt.setup(ws)
			before := ws[0].wholePrefills.Load()
			if got := p.takeWhole(ws, ws[0]); got != tt.want {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			if counted := ws[0].wholePrefills.Load() - before; counted != map[bool]int64{true: 1}[tt.want] {
				t.Errorf("counted %d whole prompts on the worker, want %d", counted, map[bool]int64{true: 1}[tt.want])
			}
		})
	}
}
