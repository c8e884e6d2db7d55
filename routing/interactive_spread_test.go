package routing

import "testing"

// The spreading filter keeps an interactive request that spreads off a worker with an
// interactive prompt in prefill, and filters nothing otherwise.
func TestClearOfInteractivePrefill(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(2, "m")})
	ws := modelWorkers(t, p, "m")
	ws[0].interactivePrefills.Store(1)
	r := &Request{Model: "m", Interactive: true}
	for _, tt := range []struct {
		name   string
		spread bool
		w      *Worker
		want   bool
	}{
		{"not spreading: a worker prefilling an interactive prompt", false, ws[0], true},
		{"spreading: a worker prefilling an interactive prompt", true, ws[0], false},
		{"spreading: a worker with none", true, ws[1], true},
	} {
		c := choice{Request: r, spread: tt.spread}
		if got := c.clearOfInteractivePrefill(tt.w); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}
