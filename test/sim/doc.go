// Package sim is a simulated LLM inference engine with a real engine's outside behaviour: the
// OpenAI API, the engine's own /metrics, continuous batching, a block prefix cache and realistic
// timing, without a GPU. Tests embed an Engine behind an httptest server; `usher sim` serves one
// on a port for the demo and the load generator.
//
// # Two modes
//
// Config.Mode picks the engine the sim stands for (`usher sim --mode`):
//
//   - ModeKV ("kv", the default) is vLLM or SGLang: continuous batching of up to MaxNumSeqs
//     (256) sequences, admission bounded by free KV-cache blocks, preemption and recompute when
//     blocks run out, chunked prefill under MaxNumBatchedTokens per step. /metrics has vLLM's
//     names, vllm:cache_config_info (block_size, num_gpu_blocks) among them; there is no /props.
//     With a large MaxNumSeqs the KV cache, not the batch size, is what bounds concurrency, so
//     a gateway must read vllm:num_requests_waiting and vllm:kv_cache_usage_perc to find it.
//   - ModeSlots ("slots") is llama.cpp's llama-server: Slots fixed slots (--parallel), each
//     with KVCacheTokens/Slots tokens of its own context. A request holds a slot from admission
//     to its end; the rest wait in arrival order (llama-server's deferred tasks); nothing is
//     preempted, and a request is refused when its prompt fills the slot's context, with
//     llama-server's message. The busy slots still share each step (llama-server decodes every
//     busy slot in one call) under a budget of MaxNumBatchedTokens, llama-server's --batch-size
//     (2048 by default). GET /props answers total_slots and default_generation_settings.n_ctx
//     as llama-server does, GET /slots each slot's id, id_task, n_ctx and is_processing,
//     /health answers {"status":"ok"}, and /metrics has llama-server's
//     names: llamacpp:requests_processing, llamacpp:requests_deferred,
//     llamacpp:prompt_tokens_total (computed, cache hits excluded),
//     llamacpp:prompt_tokens_cached_total, llamacpp:tokens_predicted_total,
//     llamacpp:n_decode_total and llamacpp:n_busy_slots_per_decode; no vLLM name, so a router
//     that sums every engine's names counts each request once. The prompt cache is
//     llama-server's: each slot keeps what its last request computed, a request takes the idle
//     slot sharing the longest prefix with it if that is more than half the slot's tokens
//     (--slot-prompt-similarity 0.5), else the least recently used idle slot, and reuses the
//     shared prefix token for token. Where the sim differs: a request whose max_tokens does not
//     fit the slot is refused (llama-server would stop generating when the slot is full).
//     Config.CloseAfterStream (--close-after-stream, off by default) adds llama-server's
//     connection quirk: the connection is closed after each complete streamed answer although
//     the answer announced keep-alive. Config.CancelPoll (--cancel-poll 1s, off by default)
//     adds its cancel check: the client of a whole answer that went away is noticed only at
//     the next check, and its slot is generated on until then.
//
// The scheduler, the cost of a step and the HTTP surface below are common to both modes.
//
// # The model
//
// Tokens are whitespace-separated words. A chat prompt is its messages rendered as
// "<|role|> content" each, joined by spaces, then "<|assistant|>"; so the next turn of a
// conversation (earlier messages, the reply, a new question) begins with every token of the
// previous turn's prompt and reply, as with a real chat template. The output is max_tokens
// filler words drawn from a generator seeded by the prompt: the same prompt always gets the
// same answer, and finish_reason is "length".
//
// The engine follows vLLM's V1 scheduler (ModeSlots is the same loop with a fixed batch of slots,
// FCFS, and a KV cache sized so the slots never run out). A request becomes a sequence whose tokens
// are the prompt and what it has generated; each engine step computes some tokens of some sequences
// and every sequence whose tokens are then all computed samples one more. Each step takes the
// running sequences first, one token each when decoding or a chunk when prefilling, within a budget
// of MaxNumBatchedTokens tokens, then admits waiting sequences in queue order while the batch has
// fewer than MaxNumSeqs, budget is left and their KV blocks fit; a sequence that does not fit
// waits, and so do those behind it. The queue is FCFS, or by vLLM's request field "priority" (lower
// first) under the priority policy. When a running sequence needs a block and none is free, the
// last admitted (or the lowest-priority) running sequence is preempted: its blocks are freed and it
// waits to be recomputed. Under the priority policy a waiting sequence of higher priority also
// takes the batch slot of the lowest-priority running one when the batch is full, as vLLM's
// priority scheduling preempts.
//
// In ModeKV the KV cache is a pool of BlockSize-token blocks. A full block is identified by a
// chained hash over its parent block's hash and its own tokens, so equal hashes mean equal
// prefixes; a request's cache_salt stands for the first block's parent, as vLLM mixes it into
// that block's hash, so prompts of different salts share no block. On admission the longest run of the prompt's leading blocks found in the cache is
// reused (at most all but the prompt's last token, which must be computed to sample from, as in
// vLLM); those are the request's cached_tokens and the prefix-cache hits. Blocks nobody holds stay
// cached until reused: the free queue evicts least recently freed first, and a finished sequence
// frees its blocks last block first, so a prefix's tail goes before its head.
//
// A step costs
//
//	DecodeBase + Σ over its sequences of DecodePerSeq + (prefill chunk × PrefillPerToken,
//	or for a decoding sequence its context length × DecodePerKVToken)
//
// so cached prompt tokens cost nothing, and decode slows as the batch and its contexts grow.
// Every duration is multiplied by TimeScale; a test at TimeScale 0.001 runs a 12 ms step in
// 12 µs. The loop paces steps against a running deadline, so when a step is shorter than the
// timer's resolution the steps that overshoot are caught up: throughput stays right and only
// the tokens' arrival gets burstier. A stream's headers go out as soon as the request is
// accepted, before it is admitted (as vLLM's do); then it gets one chunk per step, flushed at
// once.
//
// # The defaults
//
// DefaultConfig models Llama-2-7B (32 layers, hidden 4096, 16-bit weights and KV) under vLLM on
// one 80 GB A100 (2.0 TB/s, 312 TFLOP/s dense bf16):
//
//   - KVCacheTokens 100,000: vLLM takes 90% of 80 GB; minus 13.5 GB of weights and a few GB of
//     activations leaves about 54 GB, and one token of KV is 2 × 32 × 4096 × 2 bytes = 512 KiB,
//     so about 105,000 tokens; rounded to 6,250 blocks of 16.
//   - PrefillPerToken 100 µs: a token costs 2 × 7e9 = 14 GFLOP; at about 45% of peak that is
//     ~140 TFLOP/s, 10,000 prompt tokens a second.
//   - DecodeBase 12 ms: a decode step reads every weight once, 13.5 GB at 2 TB/s is 6.7 ms, and
//     kernel launches, sampling and the scheduler bring measured 7B inter-token latency at
//     small batch to 11-13 ms.
//   - DecodePerKVToken 250 ns: a decoding sequence reads its KV, 512 KiB per context token at
//     2 TB/s; a full cache read adds 25 ms to a step.
//   - DecodePerSeq 30 µs: per-sequence compute and sampling; with 256 sequences of 400 tokens a
//     step takes 12 + 7.7 + 25.6 ≈ 45 ms, in line with vLLM on this hardware.
//   - MaxNumSeqs 256, MaxNumBatchedTokens 8192, BlockSize 16: vLLM's defaults for online
//     serving. MaxModelLen 32,768, DefaultMaxTokens 128.
//   - ModeSlots: Slots 4 (llama-server's --parallel when left to choose), MaxNumBatchedTokens
//     2048 (its --batch-size), each slot 25,000 tokens of the same 100,000-token cache.
//
// # HTTP surface
//
// POST /v1/chat/completions and /v1/completions (stream, stream_options.include_usage,
// max_tokens or max_completion_tokens, vLLM's priority; usage always carries
// prompt_tokens_details.cached_tokens; the disaggregation fields below), GET /v1/models (the
// one model), GET /health, POST /kv/pull (the KV hand-off, below), and GET /metrics with
// vLLM's names, labelled model_name: vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc (and V0's vllm:gpu_cache_usage_perc),
// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total (tokens),
// vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total,
// vllm:num_preemptions_total and the histograms vllm:request_queue_time_seconds,
// vllm:time_to_first_token_seconds and vllm:e2e_request_latency_seconds (ModeSlots: see
// above). Errors have OpenAI's shape {"error":{"message","type","code"}}: 400 bad input, 404
// another model, 413 a body over MaxBodyBytes, 500 an injected fault, 503 a closed engine (the
// hand-off's refusals take the shape of the engine whose protocol the request speaks).
//
// Every number a client sends is bounded before any arithmetic: max_tokens (or
// max_completion_tokens) below 1, beyond what the context leaves after the prompt (2^63-1
// included), or not an integer that fits an int gets a 400, and a prompt is bounded by
// MaxBodyBytes, so no sum of client numbers can wrap.
//
// # Prefill and decode
//
// Config.Role (`usher sim --role`) makes a ModeKV engine one side of a disaggregated fleet,
// speaking the two protocols the engines speak, as read from their sources:
//
// vLLM's KV connector, in vllm-project/vllm: the proxy that drives it,
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, and the connector,
// vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py. The proxy sends the prefill worker the client's request with stream false,
// max_tokens 1 (and max_completion_tokens 1 when set), no stream_options, and
// kv_transfer_params {"do_remote_decode": true, "do_remote_prefill": false, the rest null}. The
// prefill worker prefills, samples one token and, since the request finished on its length,
// keeps its blocks (NixlConnectorScheduler.request_finished delays their free) for
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s, vllm/envs.py), answering with kv_transfer_params
// {"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [...],
// "remote_engine_id", "remote_request_id", "remote_host", "remote_port" (its side channel),
// "tp_size"}. The proxy copies those params into the client's request and sends it to the
// decode worker, which counts the prompt as external tokens (get_num_new_matched_tokens), pulls
// the blocks from remote_host:remote_port while the request waits (WAITING_FOR_REMOTE_KVS), and
// decodes; params missing a field are ignored with a warning and the request is prefilled there
// (update_state_after_alloc). A load that fails ends the request under the default
// kv_load_failure_policy "fail" (vllm/config/kv_transfer.py) with finish reason "error", which
// the OpenAI server answers 500 {"error": {"message": "Internal server error", "type":
// "InternalServerError", "code": 500}} (vLLM's tests of OpenAIServing._raise_if_error and
// _convert_generation_error_to_response).
//
// SGLang's bootstrap flow (sgl-project/sglang: python/sglang/srt/disaggregation/mini_lb.py is
// its load balancer; decode.py, prefill.py and mooncake/conn.py the engine sides). The balancer
// adds bootstrap_host (the prefill worker's host), bootstrap_port (its bootstrap server's port)
// and bootstrap_room (random in [0, 2^63-1]) to the client's request and sends the same request
// to the prefill and the decode worker at once; the client gets the decode worker's answer. The
// decode worker asks the prefill's bootstrap server for the room, the prefill worker prefills
// and sends the room's KV, and the decode worker decodes. A decode worker that gets no KV within
// SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s) aborts the request with 500 "Decode transfer
// failed for request ... bootstrap_room=N with exception KVTransferError(bootstrap_room=N): ..."
// in SGLang's error shape {"object": "error", "message", "type", "param", "code"}; a
// disaggregated worker given a request without a room answers 400 "Disaggregated request
// received without bootstrap room id" (SGLang's disaggregation tests assert it).
//
// The sim models both over its own HTTP listener, which is its side channel and its bootstrap
// server (the answer's remote_host and remote_port are the address the request came in on):
//
//   - RolePrefill: a request with kv_transfer_params.do_remote_decode, or with a bootstrap_room
//     (SGLang's prefill generates one token whatever max_tokens says), is run as usual and, when
//     it finishes, its blocks stay held, counted in the KV cache, under an unguessable
//     remote_request_id or under the room, for KVHoldTimeout (wall clock) and at most
//     MaxHeldTransfers holds (past that the oldest is freed early). A room already held is
//     refused.
//   - RoleDecode: a request naming a remote prefill (complete vLLM params, or SGLang's three
//     fields) pulls the KV with POST /kv/pull on the prefill worker, which frees it; an SGLang
//     pull waits up to KVWaitTimeout for the room's prefill. The request counts as waiting
//     meanwhile (vllm:num_requests_waiting), then waits the transfer, the prompt's blocks times
//     KVTransferPerBlock, and is admitted with every prompt token but the last computed (as vLLM
//     recomputes the last one to sample from): no prefill charge for them, reported as
//     cached_tokens. A pull refused (unknown, expired, already pulled, other blocks, another
//     engine or another prompt) or unreachable fails the request as the engine does: vLLM's
//     500 or SGLang's 500, an error event if the stream had begun.
//   - Each role reads only its side's fields; a request without them, on any role, is served
//     as today (vLLM's decode worker prefills a plain request itself). RoleBoth, the default,
//     ignores them all, as an engine without a KV connector does.
//
// Where the sim differs: the decode worker reserves no KV during the transfer (vLLM allocates
// first); the SGLang prefill does not wait for the decode's handshake before prefilling; a pull
// of another prompt's KV is refused where an engine would decode garbage; the vLLM refusal's
// message says why. The engines trust these fields and dial the hosts they name: a gateway must
// never forward a client's kv_transfer_params or bootstrap_* fields.
//
// DefaultConfig's KVTransferPerBlock, 350 µs, is one 16-token block of Llama-2-7B's KV (8 MiB)
// over a 200 Gb/s RDMA link: about 22 µs a token, a fifth of prefilling it.
//
// # Faults
//
// Faults make the engine misbehave on purpose: answer 500 (ErrorRate), wait before the first
// byte (AddedLatency), never answer (HangRate), die after some requests (ExitAfter: the
// connections close and `usher sim` exits), or fail its health check (Unhealthy).
// Engine.SetFaults changes them while the engine runs, so a test can break a worker and mend
// it.
//
// # Goroutines
//
// New starts one goroutine, the scheduler loop; Close stops it and ends every request in
// flight. Each HTTP request runs on its server's goroutine and never blocks the loop: output
// reaches it through a per-request outbox, and a client that goes away removes its sequence,
// freeing its batch slot and blocks, at once.
package sim
