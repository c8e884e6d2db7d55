package routing

import "testing"

// The prefill budget's filter: without a budget every worker; a worker prefilling no lower-class
// prompt takes any; else the tokens in prefill, the request's included (one piece of a prompt in
// pieces, on a worker that schedules by priority too), must stay within it.
func TestWithinPrefillBudget(t *testing.T) {
	specs := testWorkers(2, "m")
	specs[1].PriorityHandoff = true
	p, _ := newTestPool(t, Config{Workers: specs})
	ws := modelWorkers(t, p, "m")
	for _, tt := range []struct {
		name     string
		budget   int64
		lower    int64 // lower-class prompt tokens in prefill on the worker
		prompt   int
		piece    int
		handoff  bool // on the worker that schedules by priority
		admitted bool
	}{
		{"no budget", 0, 5000, 1000, 0, false, true},
		{"nothing in prefill: a prompt over the budget", 512, 0, 4000, 0, false, true},
		{"within", 512, 300, 200, 0, false, true},
		{"up to the budget", 512, 312, 200, 0, false, true},
		{"over", 512, 313, 200, 0, false, false},
		{"one piece counts", 512, 400, 2000, 100, false, true},
		{"a piece over", 512, 450, 2000, 100, false, false},
		{"one piece on a worker that schedules by priority", 512, 400, 2000, 100, true, true},
		{"an empty prompt counts one token", 512, 512, 0, 0, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := ws[0]
			if tt.handoff {
				w = ws[1]
			}
			w.prefill.tokens.Store(tt.lower)
			defer w.prefill.tokens.Store(0)
			c := choice{Request: &Request{Model: "m", PromptTokens: tt.prompt}, prefillBudget: tt.budget, piece: tt.piece}
			if got := c.withinPrefillBudget(w); got != tt.admitted {
				t.Errorf("admitted %v, want %v", got, tt.admitted)
			}
		})
	}
}
