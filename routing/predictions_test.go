package routing

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Predictions speaks for the workers that take requests and have learnt, and only them: a
// worker down, draining or still learning is left out, and a loaded worker predicts more than
// it would idle.
func TestPredictionsOfTheWorkersThatCanSay(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(4, "m")})
	ws := modelWorkers(t, p, "m")
	rng := rand.New(rand.NewPCG(3, 4))
	for _, w := range ws[:3] {
		for range 200 {
			pl := randomPlacement(rng)
			w.cost.observe(pl, pl.running, steps.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.02))
		}
	}
	// ws[3] has learnt nothing; ws[1] is down.
	markDown(ws[1])
	ws[2].inFlight.Store(6)

	var got []string
	for wp := range p.Predictions("m", 1000, 0) {
		got = append(got, wp.Worker)
		if wp.Idle.TTFT <= 0 || wp.Now.TTFT < wp.Idle.TTFT {
			t.Errorf("%s: got now %v, idle %v; want an idle prediction, and now no less", wp.Worker, wp.Now.TTFT, wp.Idle.TTFT)
		}
		if wp.Worker == "w2" && wp.Now.TTFT < wp.Idle.TTFT+steps.perRunning*5 {
			t.Errorf("w2 with 6 in flight: got now %v, idle %v; want the running requests counted", wp.Now.TTFT, wp.Idle.TTFT)
		}
	}
	if want := []string{"w0", "w2"}; !slices.Equal(got, want) {
		t.Errorf("got predictions of %v, want %v (w1 down, w3 still learning)", got, want)
	}
	for range p.Predictions("unknown", 10, 0) {
		t.Error("a model nobody serves: got a prediction")
	}
	// Stopping early stops.
	n := 0
	for range p.Predictions("m", 10, 0) {
		n++
		break
	}
	if n != 1 {
		t.Errorf("break after the first: got %d iterations", n)
	}
}

// The typical prediction is the median of each part on its own; TPOT's is over the workers that
// learnt their steps (a 0 is no time, and would halve the default TPOT objective of a two-worker
// model whose other worker has not learnt yet: on the simulators, 28 of 31 interactive answers
// missed a 10 ms objective in the first seconds of a run).
func TestTypicalPrediction(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tt := range []struct {
		name string
		ps   []Prediction
		want Prediction
	}{
		{"none", nil, Prediction{}},
		{"one", []Prediction{{ms(100), ms(12)}}, Prediction{ms(100), ms(12)}},
		{"odd", []Prediction{{ms(300), ms(10)}, {ms(100), ms(30)}, {ms(200), ms(20)}}, Prediction{ms(200), ms(20)}},
		{"even", []Prediction{{ms(100), ms(10)}, {ms(300), ms(30)}}, Prediction{ms(200), ms(20)}},
		{"one has not learnt its steps", []Prediction{{ms(100), 0}, {ms(300), ms(24)}}, Prediction{ms(200), ms(24)}},
		{"two of three have not", []Prediction{{ms(100), 0}, {ms(300), ms(24)}, {ms(200), 0}}, Prediction{ms(200), ms(24)}},
		{"none has", []Prediction{{ms(100), 0}, {ms(300), 0}}, Prediction{ms(200), 0}},
	} {
		if got := TypicalPrediction(tt.ps); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
