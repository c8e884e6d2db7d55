package bench

import "testing"

func TestWorkerLoadRatioCountsIdleScrapedWorkers(t *testing.T) {
	results := []result{{worker: "a"}, {worker: "a"}, {worker: "a"}, {worker: "a"}}
	tests := []struct {
		name  string
		fleet int
		want  float64
	}{
		{"only the workers seen", 0, 1},
		{"four scraped workers, one used", 4, 4},
		{"fewer scraped than seen", 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, got := workerLoads(results, tt.fleet); got != tt.want {
				t.Fatalf("got ratio %v, want %v", got, tt.want)
			}
		})
	}
}
