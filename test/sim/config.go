package sim

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Engine modes: how an engine holds its requests and their KV cache.
const (
	// ModeKV is vLLM's and SGLang's continuous batching bounded by the KV cache: up to
	// MaxNumSeqs sequences share each step, a waiting one is admitted while its KV blocks fit,
	// and when the blocks run out a running one is preempted and later recomputed. /metrics
	// carries vLLM's names; there is no /props.
	ModeKV = "kv"
	// ModeSlots is llama.cpp's llama-server: Slots fixed slots (llama-server --parallel), each
	// with its own context of KVCacheTokens/Slots tokens (llama-server -c divided by
	// --parallel). A request holds one slot from admission to its end and is never preempted;
	// the others wait in arrival order ("deferred"). The running slots still share each step
	// (llama-server batches every busy slot into one decode call), so MaxNumBatchedTokens is
	// llama-server's --batch-size. GET /props reports total_slots; /metrics carries llama.cpp's
	// names. MaxNumSeqs and the priority policy do not apply.
	ModeSlots = "slots"
)

// Engine roles in a disaggregated fleet (Config.Role); see the package doc, "Prefill and decode".
const (
	// RoleBoth is an engine with no KV connector: it prefills and decodes every request itself
	// and ignores the disaggregation fields (kv_transfer_params, bootstrap_*), as a vLLM started
	// without --kv-transfer-config and an SGLang without --disaggregation-mode do.
	RoleBoth = "both"
	// RolePrefill is a prefill worker: vLLM with a KV connector as kv_producer, or SGLang with
	// --disaggregation-mode prefill. A request asking for a remote decode is prefilled, answered
	// with one token, and its KV is held for a decode worker to pull.
	RolePrefill = "prefill"
	// RoleDecode is a decode worker: vLLM as kv_consumer, or SGLang with --disaggregation-mode
	// decode. A request naming a remote prefill pulls its KV from the prefill worker, waits the
	// transfer time, and is decoded without computing the transferred tokens.
	RoleDecode = "decode"
)

// Scheduling policies, as vLLM names them.
const (
	// PolicyFCFS admits waiting requests in arrival order.
	PolicyFCFS = "fcfs"
	// PolicyPriority admits the waiting request with the lowest "priority" value first (ties
	// in arrival order) and preempts the running one with the highest value first.
	PolicyPriority = "priority"
)

// Config is every parameter of a simulated engine. A zero field takes its value from
// DefaultConfig, except in Faults, where zero means "no fault". Durations are engine time:
// they are multiplied by TimeScale before the engine waits them out.
type Config struct {
	// Model is the one model name the engine serves; requests naming another get 404.
	Model string
	// APIKey, when set, is the key every /v1 request must carry as `Authorization: Bearer`, as
	// vLLM's and llama-server's --api-key ask; others get 401. /health and /metrics stay open,
	// as vLLM's do.
	APIKey string
	// Mode is ModeKV (vLLM, the default) or ModeSlots (llama.cpp).
	Mode string
	// MaxNumSeqs caps the sequences in the running batch (vLLM max_num_seqs); ModeKV only.
	MaxNumSeqs int
	// Slots is the number of fixed slots (llama-server --parallel); ModeSlots only.
	Slots int
	// MaxNumBatchedTokens caps the tokens computed in one step (vLLM max_num_batched_tokens,
	// llama-server --batch-size): each decoding sequence takes one, prefill takes the rest, so
	// long prompts are prefilled in chunks across steps. Zero means 8192 in ModeKV (vLLM's
	// default for online serving on an 80 GB GPU) and 2048 in ModeSlots (llama-server's).
	MaxNumBatchedTokens int
	// BlockSize is the number of tokens in one KV-cache block; only full blocks are cached.
	BlockSize int
	// KVCacheTokens is the KV-cache capacity in tokens, rounded down to whole blocks. In
	// ModeSlots it is llama-server's -c: each slot's context is KVCacheTokens/Slots, rounded
	// down to whole blocks.
	KVCacheTokens int
	// MaxModelLen caps prompt plus output tokens of one request; longer requests get 400.
	MaxModelLen int
	// DefaultMaxTokens is the output length of a request that names no max_tokens.
	DefaultMaxTokens int
	// PrefillPerToken is the compute time of one uncached prompt token; cached tokens are free.
	PrefillPerToken time.Duration
	// DecodeBase is the fixed cost of one engine step (reading the weights once).
	DecodeBase time.Duration
	// DecodePerSeq is the added cost of each sequence in a step (sampling, activations).
	DecodePerSeq time.Duration
	// DecodePerKVToken is the added cost, for each decoding sequence, of each token of its
	// context (reading its KV cache).
	DecodePerKVToken time.Duration
	// TimeScale multiplies every engine duration: 0.01 runs the engine 100 times faster.
	TimeScale float64
	// SchedulingPolicy is PolicyFCFS or PolicyPriority.
	SchedulingPolicy string
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	MaxBodyBytes int64
	// CloseAfterStream makes the engine close the connection after each complete streamed
	// answer, while the answer announced keep-alive, as llama-server does (issue 14): a client
	// that pools the connection finds it closed when it sends its next request on it. Off by
	// default in both modes, so a test opts in to the quirk it is about.
	CloseAfterStream bool
	// CancelPoll, when set, is how often the engine checks whether the client of a whole
	// (non-streamed) answer went away, as llama-server does once a second: until the check
	// after the client left, the sequence keeps its slot and is generated on. A stream's client
	// is noticed at once (llama-server notices it at its next token). Off by default in both
	// modes, like CloseAfterStream. Wall-clock time: TimeScale does not apply.
	CancelPoll time.Duration
	// KVEvents, when set, is the host:port where the engine publishes its KV-cache events as
	// vLLM does (ZeroMQ PUB, msgpack batches), with the replay socket on the next port; port 0
	// picks free ports (Engine.KVEventsAddrs tells them). ModeKV only.
	KVEvents string
	// Role is RoleBoth (the default), RolePrefill or RoleDecode; the last two need ModeKV.
	Role string
	// KVTransferPerBlock is the engine time a decode worker waits per KV block pulled from a
	// prefill worker (the RDMA read of one block), so a hand-off costs the prompt's blocks times
	// this.
	KVTransferPerBlock time.Duration
	// KVHoldTimeout is how long a prefill worker keeps a finished prefill's KV blocks for a
	// decode worker to pull; then they are freed and a pull of them is refused (vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by default). Wall-clock time, read from
	// Options.Now: TimeScale does not apply.
	KVHoldTimeout time.Duration
	// MaxHeldTransfers bounds the prefills whose KV a prefill worker holds at once; past it the
	// oldest hold is freed early, as if it had expired. Held blocks also count against the KV
	// cache, as they do in vLLM.
	MaxHeldTransfers int
	// KVWaitTimeout bounds how long a decode worker waits for an SGLang bootstrap room's KV to be
	// ready on the prefill worker before it fails the request (SGLang's
	// SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s by default). Wall-clock time.
	KVWaitTimeout time.Duration
	// Seed seeds the fault dice, so a run's injected faults are repeatable.
	Seed uint64
	// Faults are the faults injected from the start; Engine.SetFaults changes them later.
	Faults Faults
}

// Faults are injected misbehaviours. The zero value injects nothing.
type Faults struct {
	// ErrorRate is the fraction of requests answered 500 before any byte, in [0, 1].
	ErrorRate float64
	// HangRate is the fraction of requests never answered until the client goes away, in
	// [0, 1]. It is drawn after ErrorRate.
	HangRate float64
	// AddedLatency is waited, in wall-clock time (TimeScale does not apply: it stands for the
	// network or a stalled front end the caller's timeouts must see), before a request's
	// first byte.
	AddedLatency time.Duration
	// ExitAfter, when positive, makes the engine die once it has answered that many
	// well-formed completion requests (requests refused with 4xx do not count): requests in
	// flight and later ones, /health included, have their connections closed without an
	// answer, and Engine.Exited is closed (usher sim then exits the process).
	ExitAfter int
	// Unhealthy makes GET /health answer 503.
	Unhealthy bool
}

// DefaultConfig is shaped like a 7B model (Llama-2-7B: 32 layers, 4096 wide, 16-bit weights and
// KV cache) served by vLLM on one 80 GB A100; see the package doc for the reasoning.
func DefaultConfig() Config {
	return Config{
		Model:               "demo-7b",
		Mode:                ModeKV,
		MaxNumSeqs:          256,
		Slots:               4,
		MaxNumBatchedTokens: 8192,
		BlockSize:           16,
		KVCacheTokens:       100_000,
		MaxModelLen:         32_768,
		DefaultMaxTokens:    128,
		PrefillPerToken:     100 * time.Microsecond,
		DecodeBase:          12 * time.Millisecond,
		DecodePerSeq:        30 * time.Microsecond,
		DecodePerKVToken:    250 * time.Nanosecond,
		TimeScale:           1,
		SchedulingPolicy:    PolicyFCFS,
		MaxBodyBytes:        4 << 20,
		Role:                RoleBoth,
		KVTransferPerBlock:  350 * time.Microsecond,
		KVHoldTimeout:       480 * time.Second,
		MaxHeldTransfers:    1024,
		KVWaitTimeout:       300 * time.Second,
		Seed:                1,
	}
}

// slotsBatchSize is llama-server's default --batch-size, the step budget of ModeSlots.
const slotsBatchSize = 2048

// withDefaults returns c with every zero field outside Faults set from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.Mode == "" {
		c.Mode = d.Mode
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = d.MaxNumSeqs
	}
	if c.Slots == 0 {
		c.Slots = d.Slots
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = d.MaxNumBatchedTokens
		if c.Mode == ModeSlots {
			c.MaxNumBatchedTokens = slotsBatchSize
		}
	}
	if c.BlockSize == 0 {
		c.BlockSize = d.BlockSize
	}
	if c.KVCacheTokens == 0 {
		c.KVCacheTokens = d.KVCacheTokens
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = d.MaxModelLen
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = d.DefaultMaxTokens
	}
	if c.PrefillPerToken == 0 {
		c.PrefillPerToken = d.PrefillPerToken
	}
	if c.DecodeBase == 0 {
		c.DecodeBase = d.DecodeBase
	}
	if c.DecodePerSeq == 0 {
		c.DecodePerSeq = d.DecodePerSeq
	}
	if c.DecodePerKVToken == 0 {
		c.DecodePerKVToken = d.DecodePerKVToken
	}
	if c.TimeScale == 0 {
		c.TimeScale = d.TimeScale
	}
	if c.SchedulingPolicy == "" {
		c.SchedulingPolicy = d.SchedulingPolicy
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.Role == "" {
		c.Role = d.Role
	}
	if c.KVTransferPerBlock == 0 {
		c.KVTransferPerBlock = d.KVTransferPerBlock
	}
	if c.KVHoldTimeout == 0 {
		c.KVHoldTimeout = d.KVHoldTimeout
	}
	if c.MaxHeldTransfers == 0 {
		c.MaxHeldTransfers = d.MaxHeldTransfers
	}
	if c.KVWaitTimeout == 0 {
		c.KVWaitTimeout = d.KVWaitTimeout
	}
	if c.Seed == 0 {
		c.Seed = d.Seed
	}
	return c
}

// RegisterFlags registers one flag per parameter on fs, writing into c. A flag's default is
// c's field, or DefaultConfig's where c's field is zero; --max-num-batched-tokens keeps a zero
// field zero, since its default depends on --mode.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := c.withDefaults()
	fs.StringVar(&c.Model, "model", d.Model, "the one model name served")
	fs.StringVar(&c.APIKey, "api-key", d.APIKey, "the key every /v1 request must carry as 'Authorization: Bearer KEY' (empty: none)")
	fs.StringVar(&c.Mode, "mode", d.Mode, "kv: continuous batching bounded by the KV cache, as vLLM and SGLang; slots: fixed slots, as llama.cpp's llama-server")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", d.MaxNumSeqs, "kv mode: maximum sequences in the running batch")
	fs.IntVar(&c.Slots, "slots", d.Slots, "slots mode: number of slots (llama-server --parallel)")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "maximum tokens computed in one step, prefill chunked to fit (0: 8192 in kv mode, 2048 in slots mode)")
	fs.IntVar(&c.BlockSize, "block-size", d.BlockSize, "tokens per KV-cache block")
	fs.IntVar(&c.KVCacheTokens, "kv-cache-tokens", d.KVCacheTokens, "KV-cache capacity in tokens (slots mode: the total context, shared equally by the slots)")
	fs.IntVar(&c.MaxModelLen, "max-model-len", d.MaxModelLen, "maximum prompt plus output tokens of a request")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", d.DefaultMaxTokens, "output tokens of a request without max_tokens")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", d.PrefillPerToken, "compute time per uncached prompt token")
	fs.DurationVar(&c.DecodeBase, "decode-base", d.DecodeBase, "fixed time of one engine step")
	fs.DurationVar(&c.DecodePerSeq, "decode-per-seq", d.DecodePerSeq, "added step time per sequence in the batch")
	fs.DurationVar(&c.DecodePerKVToken, "decode-per-kv-token", d.DecodePerKVToken, "added step time per context token of each decoding sequence")
	fs.Float64Var(&c.TimeScale, "time-scale", d.TimeScale, "multiplier on every engine duration (0.01 runs 100x faster)")
	fs.StringVar(&c.SchedulingPolicy, "scheduling-policy", d.SchedulingPolicy, "fcfs or priority (lower request priority value first)")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", d.MaxBodyBytes, "maximum request body size")
	fs.BoolVar(&c.CloseAfterStream, "close-after-stream", d.CloseAfterStream, "close the connection after each streamed answer although it announced keep-alive, as llama-server does")
	fs.DurationVar(&c.CancelPoll, "cancel-poll", d.CancelPoll, "check for the client of a whole answer having left only this often (llama-server: 1s); 0: at once")
	fs.StringVar(&c.Role, "role", d.Role, "both: prefill and decode every request; prefill: hold the KV of requests asking for a remote decode (vLLM kv_transfer_params, SGLang bootstrap_room) for a decode worker to pull; decode: pull a remote prefill's KV instead of computing it (kv mode only)")
	fs.DurationVar(&c.KVTransferPerBlock, "kv-transfer-per-block", d.KVTransferPerBlock, "decode role: time to pull one KV block from the prefill worker")
	fs.DurationVar(&c.KVHoldTimeout, "kv-hold-timeout", d.KVHoldTimeout, "prefill role: how long a prefill's KV is held for a decode worker to pull (wall clock)")
	fs.IntVar(&c.MaxHeldTransfers, "max-held-transfers", d.MaxHeldTransfers, "prefill role: most prefills held at once; the oldest is freed past it")
	fs.DurationVar(&c.KVWaitTimeout, "kv-wait-timeout", d.KVWaitTimeout, "decode role: how long to wait for an SGLang bootstrap room's KV before failing the request (wall clock)")
	fs.Uint64Var(&c.Seed, "seed", d.Seed, "seed of the fault dice")
	fs.Float64Var(&c.Faults.ErrorRate, "error-rate", d.Faults.ErrorRate, "fault: fraction of requests answered 500")
	fs.Float64Var(&c.Faults.HangRate, "hang-rate", d.Faults.HangRate, "fault: fraction of requests never answered")
	fs.DurationVar(&c.Faults.AddedLatency, "added-latency", d.Faults.AddedLatency, "fault: wall-clock delay before the first byte")
	fs.IntVar(&c.Faults.ExitAfter, "exit-after", d.Faults.ExitAfter, "fault: die after serving this many requests (0: never)")
	fs.BoolVar(&c.Faults.Unhealthy, "unhealthy", d.Faults.Unhealthy, "fault: /health answers 503")
}

// Validate reports every invalid field, each error naming it. Zero fields are valid: they mean
// the default.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, msg string) { errs = append(errs, fmt.Errorf("sim.%s: %s", field, msg)) }
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"max_num_seqs", int64(c.MaxNumSeqs)},
		{"slots", int64(c.Slots)},
		{"max_num_batched_tokens", int64(c.MaxNumBatchedTokens)},
		{"block_size", int64(c.BlockSize)},
		{"kv_cache_tokens", int64(c.KVCacheTokens)},
		{"max_model_len", int64(c.MaxModelLen)},
		{"default_max_tokens", int64(c.DefaultMaxTokens)},
		{"prefill_per_token", int64(c.PrefillPerToken)},
		{"decode_base", int64(c.DecodeBase)},
		{"decode_per_seq", int64(c.DecodePerSeq)},
		{"decode_per_kv_token", int64(c.DecodePerKVToken)},
		{"max_body_bytes", c.MaxBodyBytes},
		{"kv_transfer_per_block", int64(c.KVTransferPerBlock)},
		{"kv_hold_timeout", int64(c.KVHoldTimeout)},
		{"max_held_transfers", int64(c.MaxHeldTransfers)},
		{"kv_wait_timeout", int64(c.KVWaitTimeout)},
	} {
		if f.v < 0 {
			bad(f.name, "must not be negative")
		}
	}
	if c.TimeScale < 0 {
		bad("time_scale", "must not be negative")
	}
	d := c.withDefaults()
	if d.KVEvents != "" && d.Mode != ModeKV {
		bad("kv_events", "needs mode "+ModeKV+" (llama-server publishes no KV events)")
	}
	if d.Mode != ModeKV && d.Mode != ModeSlots {
		bad("mode", fmt.Sprintf("must be %q or %q, got %q", ModeKV, ModeSlots, d.Mode))
	}
	switch d.Role {
	case RoleBoth:
	case RolePrefill, RoleDecode:
		if d.Mode != ModeKV {
			bad("role", "needs mode "+ModeKV+" (llama-server has no disaggregated serving)")
		}
	default:
		bad("role", fmt.Sprintf("must be %q, %q or %q, got %q", RoleBoth, RolePrefill, RoleDecode, d.Role))
	}
	if d.KVCacheTokens < d.BlockSize {
		bad("kv_cache_tokens", fmt.Sprintf("must hold at least one block of %d tokens", d.BlockSize))
	}
	if d.Mode == ModeSlots {
		if d.Slots > 0 && d.KVCacheTokens/d.Slots < d.BlockSize {
			bad("kv_cache_tokens", fmt.Sprintf("must give each of the %d slots at least one block of %d tokens", d.Slots, d.BlockSize))
		}
		if d.SchedulingPolicy == PolicyPriority {
			bad("scheduling_policy", "llama-server serves its slots in arrival order: slots mode takes fcfs only")
		}
	}
	if d.DefaultMaxTokens > d.MaxModelLen {
		bad("default_max_tokens", fmt.Sprintf("must not exceed max_model_len (%d)", d.MaxModelLen))
	}
	if d.SchedulingPolicy != PolicyFCFS && d.SchedulingPolicy != PolicyPriority {
		bad("scheduling_policy", fmt.Sprintf("must be %q or %q, got %q", PolicyFCFS, PolicyPriority, d.SchedulingPolicy))
	}
	if err := c.Faults.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Validate reports every invalid fault field, each error naming it.
func (f Faults) Validate() error {
	var errs []error
	if f.ErrorRate < 0 || f.ErrorRate > 1 {
		errs = append(errs, fmt.Errorf("sim.faults.error_rate: must be in [0, 1], got %g", f.ErrorRate))
	}
	if f.HangRate < 0 || f.HangRate > 1 {
		errs = append(errs, fmt.Errorf("sim.faults.hang_rate: must be in [0, 1], got %g", f.HangRate))
	}
	if f.AddedLatency < 0 {
		errs = append(errs, errors.New("sim.faults.added_latency: must not be negative"))
	}
	if f.ExitAfter < 0 {
		errs = append(errs, errors.New("sim.faults.exit_after: must not be negative"))
	}
	return errors.Join(errs...)
}

// batchSeqs is how many sequences may run at once: MaxNumSeqs, or in ModeSlots the slots.
// c has its defaults.
func (c Config) batchSeqs() int {
	if c.Mode == ModeSlots {
		return c.Slots
	}
	return c.MaxNumSeqs
}

// slotTokens is one slot's context in ModeSlots (llama-server's n_ctx per slot), in whole
// blocks. c has its defaults.
func (c Config) slotTokens() int {
	return c.KVCacheTokens / c.Slots / c.BlockSize * c.BlockSize
}

// numBlocks is the KV cache's size in blocks. In ModeSlots it is every slot's context, so the
// slots together can never run out of blocks and nobody is preempted. c has its defaults.
func (c Config) numBlocks() int {
	if c.Mode == ModeSlots {
		return c.Slots * (c.slotTokens() / c.BlockSize)
	}
	return c.KVCacheTokens / c.BlockSize
}

// requestTokens bounds the prompt plus output tokens of one request: the model's context and
// what the KV cache (in ModeSlots, one slot) can hold. c has its defaults.
func (c Config) requestTokens() int {
	if c.Mode == ModeSlots {
		return min(c.MaxModelLen, c.slotTokens())
	}
	return min(c.MaxModelLen, c.KVCacheTokens/c.BlockSize*c.BlockSize)
}
