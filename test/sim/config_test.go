package sim

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"zero is valid", Config{}, ""},
		{"defaults are valid", DefaultConfig(), ""},
		{"negative seqs", Config{MaxNumSeqs: -1}, "sim.max_num_seqs: must not be negative"},
		{"negative block", Config{BlockSize: -16}, "sim.block_size: must not be negative"},
		{"negative duration", Config{DecodeBase: -time.Millisecond}, "sim.decode_base: must not be negative"},
		{"negative time scale", Config{TimeScale: -1}, "sim.time_scale: must not be negative"},
		{"cache below a block", Config{KVCacheTokens: 8}, "sim.kv_cache_tokens: must hold at least one block of 16 tokens"},
		{"default output beyond context", Config{MaxModelLen: 64, DefaultMaxTokens: 100}, "sim.default_max_tokens: must not exceed max_model_len (64)"},
		{"unknown policy", Config{SchedulingPolicy: "lifo"}, `sim.scheduling_policy: must be "fcfs" or "priority", got "lifo"`},
		{"unknown mode", Config{Mode: "paged"}, `sim.mode: must be "kv" or "slots", got "paged"`},
		{"slots mode is valid", Config{Mode: ModeSlots, Slots: 2}, ""},
		{"negative slots", Config{Mode: ModeSlots, Slots: -2}, "sim.slots: must not be negative"},
		{"slot below a block", Config{Mode: ModeSlots, Slots: 8, KVCacheTokens: 64}, "sim.kv_cache_tokens: must give each of the 8 slots at least one block of 16 tokens"},
		{"slots with priority", Config{Mode: ModeSlots, SchedulingPolicy: PolicyPriority}, "sim.scheduling_policy: llama-server serves its slots in arrival order"},
		{"prefill role is valid", Config{Role: RolePrefill}, ""},
		{"unknown role", Config{Role: "router"}, `sim.role: must be "both", "prefill" or "decode", got "router"`},
		{"decode role in slots mode", Config{Mode: ModeSlots, Role: RoleDecode}, "sim.role: needs mode kv"},
		{"negative transfer cost", Config{KVTransferPerBlock: -1}, "sim.kv_transfer_per_block: must not be negative"},
		{"negative hold count", Config{MaxHeldTransfers: -1}, "sim.max_held_transfers: must not be negative"},
		{"error rate above one", Config{Faults: Faults{ErrorRate: 1.5}}, "sim.faults.error_rate: must be in [0, 1], got 1.5"},
		{"negative hang rate", Config{Faults: Faults{HangRate: -0.1}}, "sim.faults.hang_rate: must be in [0, 1], got -0.1"},
		{"negative latency", Config{Faults: Faults{AddedLatency: -time.Second}}, "sim.faults.added_latency: must not be negative"},
		{"negative exit after", Config{Faults: Faults{ExitAfter: -1}}, "sim.faults.exit_after: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("got %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigValidateReportsEveryField(t *testing.T) {
	err := Config{MaxNumSeqs: -1, BlockSize: -1, Faults: Faults{ErrorRate: 2}}.Validate()
	for _, field := range []string{"sim.max_num_seqs", "sim.block_size", "sim.faults.error_rate"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("got %v, want it to name %s", err, field)
		}
	}
}

func TestZeroConfigTakesDefaults(t *testing.T) {
	if got, want := (Config{}).withDefaults(), DefaultConfig(); got != want {
		t.Errorf("zero config with defaults:\ngot  %+v\nwant %+v", got, want)
	}
}

func TestRegisterFlags(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(c Config) bool
	}{
		{"no flags give the defaults", nil, func(c Config) bool { return c.withDefaults() == DefaultConfig() }},
		{"slots mode takes llama-server's batch size", []string{"--mode=slots", "--slots=3"},
			func(c Config) bool {
				d := c.withDefaults()
				return d.Mode == ModeSlots && d.Slots == 3 && d.MaxNumBatchedTokens == 2048
			}},
		{"kv mode takes vLLM's batch size", []string{"--mode=kv"}, func(c Config) bool { return c.withDefaults().MaxNumBatchedTokens == 8192 }},
		{"a batch size given is kept", []string{"--mode=slots", "--max-num-batched-tokens=512"},
			func(c Config) bool { return c.withDefaults().MaxNumBatchedTokens == 512 }},
		{"engine shape", []string{"--max-num-seqs=2", "--block-size=32", "--kv-cache-tokens=4096", "--scheduling-policy=priority"},
			func(c Config) bool {
				return c.MaxNumSeqs == 2 && c.BlockSize == 32 && c.KVCacheTokens == 4096 && c.SchedulingPolicy == PolicyPriority
			}},
		{"timing", []string{"--decode-base=5ms", "--prefill-per-token=1us", "--time-scale=0.01"},
			func(c Config) bool {
				return c.DecodeBase == 5*time.Millisecond && c.PrefillPerToken == time.Microsecond && c.TimeScale == 0.01
			}},
		{"faults", []string{"--error-rate=0.1", "--hang-rate=0.2", "--added-latency=1s", "--exit-after=3", "--unhealthy"},
			func(c Config) bool {
				return c.Faults == Faults{ErrorRate: 0.1, HangRate: 0.2, AddedLatency: time.Second, ExitAfter: 3, Unhealthy: true}
			}},
		{"model", []string{"--model=llama-70b"}, func(c Config) bool { return c.Model == "llama-70b" }},
		{"api key", []string{"--api-key=s3cret"}, func(c Config) bool { return c.APIKey == "s3cret" }},
		{"llama-server's connection quirk", []string{"--close-after-stream"}, func(c Config) bool { return c.CloseAfterStream }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("sim", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c.RegisterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatalf("parse %v: %v", tt.args, err)
			}
			if !tt.check(c) {
				t.Errorf("after %v: got %+v", tt.args, c)
			}
		})
	}
}
