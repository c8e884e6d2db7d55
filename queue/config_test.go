package queue_test

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/usherllm/usher/queue"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     queue.Config
		wantErr string // substring; "" for valid
	}{
		{name: "zero value", cfg: queue.Config{}},
		{name: "explicit zeros", cfg: queue.Config{InteractiveReserve: new(0.0), StandardMinShare: new(0.0), BatchMinShare: new(0.0)}},
		{name: "fifo", cfg: queue.Config{FIFO: true}},
		{name: "reserve negative", cfg: queue.Config{InteractiveReserve: new(-0.1)}, wantErr: "queue.interactive_reserve: must be in [0, 1)"},
		{name: "reserve whole pool", cfg: queue.Config{InteractiveReserve: new(1.0)}, wantErr: "queue.interactive_reserve"},
		{name: "batch share too big", cfg: queue.Config{BatchMinShare: new(1.5)}, wantErr: "queue.batch_min_share: must be in [0, 1)"},
		{name: "shares sum to 1", cfg: queue.Config{StandardMinShare: new(0.5), BatchMinShare: new(0.5)}, wantErr: "queue.batch_min_share: standard_min_share + batch_min_share must be below 1"},
		{name: "negative tenant cap", cfg: queue.Config{MaxQueuedPerTenant: -1}, wantErr: "queue.max_queued_per_tenant"},
		{name: "negative class cap", cfg: queue.Config{MaxQueuedPerClass: -1}, wantErr: "queue.max_queued_per_class"},
		{name: "negative retry", cfg: queue.Config{MinRetryAfter: -time.Second}, wantErr: "queue.min_retry_after"},
		{name: "negative shutdown retry", cfg: queue.Config{ShutdownRetryAfter: -time.Second}, wantErr: "queue.shutdown_retry_after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate: got %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Validate: got %v, want an error containing %q", err, tt.wantErr)
			}
			if _, err := queue.New(tt.cfg, queue.Options{}); (err != nil) != (tt.wantErr != "") {
				t.Fatalf("New: got %v, want error %v", err, tt.wantErr != "")
			}
		})
	}
}

func TestConfigFromYAML(t *testing.T) {
	src := `
fifo: true
interactive_reserve: 0
batch_min_share: 0.1
max_queued_per_tenant: 50
max_queued_per_class: 500
min_retry_after: 2s
shutdown_retry_after: 10s
`
	var got queue.Config
	if err := yaml.Unmarshal([]byte(src), &got); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	if !got.FIFO || got.InteractiveReserve == nil || *got.InteractiveReserve != 0 || got.StandardMinShare != nil ||
		*got.BatchMinShare != 0.1 || got.MaxQueuedPerTenant != 50 || got.MaxQueuedPerClass != 500 ||
		got.MinRetryAfter != 2*time.Second || got.ShutdownRetryAfter != 10*time.Second {
		t.Fatalf("got %+v, want every field of the YAML", got)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestParseClass(t *testing.T) {
	tests := []struct {
		in      string
		want    queue.Class
		wantErr bool
	}{
		{in: "interactive", want: queue.Interactive},
		{in: "standard", want: queue.Standard},
		{in: "batch", want: queue.Batch},
		{in: "Batch", wantErr: true},
		{in: "", wantErr: true},
		{in: "flex", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := queue.ParseClass(tt.in)
			if (err != nil) != tt.wantErr || err == nil && got != tt.want {
				t.Fatalf("ParseClass(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
			if err == nil && got.String() != tt.in {
				t.Fatalf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
}

func FuzzParseClass(f *testing.F) {
	for _, s := range []string{"interactive", "standard", "batch", "", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := queue.ParseClass(s)
		if err != nil {
			return
		}
		text, err := c.MarshalText()
		if err != nil || string(text) != s {
			t.Fatalf("ParseClass(%q) = %v, which marshals to %q, %v", s, c, text, err)
		}
		var back queue.Class
		if err := back.UnmarshalText(text); err != nil || back != c {
			t.Fatalf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, c)
		}
	})
}
