package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// Why a pull of held KV was refused; the pulling decode worker fails its request with it.
var (
	// errTransferUnknown: nothing is held under that name (never was, expired, or already
	// pulled).
	errTransferUnknown = errors.New("no KV held under that name: unknown, expired or already pulled")
	// errTransferMismatch: the hold exists but the pull names other blocks or another engine.
	errTransferMismatch = errors.New("the pull does not match the held KV (engine id or block ids differ)")
	// errTransferPrompt: the held KV is another prompt's.
	errTransferPrompt = errors.New("the held KV is for another prompt")
)

// kvTransferParams is vLLM's kv_transfer_params as a request carries it: toy_proxy_server.py
// sends {"do_remote_decode": true} (the other fields null) to the prefill worker, and the
// prefill's answer's params, as NixlConnector.request_finished builds them, to the decode
// worker.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
}

// kvTransferAnswer is the kv_transfer_params of a prefill worker's answer, NixlConnector's
// shape: remote_host and remote_port are where the decode worker pulls from (the sim's own
// HTTP address, where NIXL has its side channel).
type kvTransferAnswer struct {
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	TPSize          int    `json:"tp_size"`
}

// kvPullRequest is the body of POST /kv/pull, which a decode worker sends the prefill worker:
// vLLM's transfer by engine, request and block ids, or SGLang's by bootstrap room, waiting up
// to WaitMS for the room's prefill to finish. PromptTokens and Digest name the decode's
// prompt: a hold of another prompt is refused and kept, where a real engine would hand over
// KV that decodes garbage.
type kvPullRequest struct {
	EngineID     string  `json:"engine_id,omitempty"`
	RequestID    string  `json:"request_id,omitempty"`
	BlockIDs     []int   `json:"block_ids,omitempty"`
	Room         *uint64 `json:"room,omitempty"`
	WaitMS       int64   `json:"wait_ms,omitempty"`
	PromptTokens int     `json:"prompt_tokens"`
	Digest       string  `json:"digest"`
}

// kvPullAnswer is what a pull takes: the prompt's length and digest, so the decode worker
// decodes only a prompt whose KV it received.
type kvPullAnswer struct {
	PromptTokens int    `json:"prompt_tokens"`
	Digest       string `json:"digest"`
}

// Bounds on the disaggregation fields and the pull endpoint.
const (
	maxKVNameLen     = 256              // engine and request ids, hosts
	maxPullBody      = 1 << 20          // a pull's body: block ids of the longest request fit
	maxPullAnswer    = 64 << 10         // what a decode worker reads of a pull's answer
	maxPullWaiters   = 1024             // pulls waiting at once for a room
	vllmPullTimeout  = 30 * time.Second // a vLLM pull does not wait for anything
	maxBootstrapRoom = math.MaxInt64    // SGLang draws rooms in [0, 2^63-1]
)

// handoff is what the disaggregation fields of one request ask of this engine: hold its KV
// when it finishes (RolePrefill), or pull it first (RoleDecode). The zero value asks nothing.
type handoff struct {
	hold       string  // RolePrefill: the hold's key
	transferID string  // RolePrefill, vLLM: the remote_request_id to answer with; "" for a room
	pull       *kvPull // RoleDecode
}

// kvPull is one pull a decode worker makes.
type kvPull struct {
	addr string // host:port of the prefill worker
	req  kvPullRequest
	room bool // SGLang's flow: refusals take SGLang's shape
}

func vllmHoldKey(requestID string) string { return "vllm/" + requestID }
func roomHoldKey(room uint64) string      { return "room/" + strconv.FormatUint(room, 10) }

// newTransferID draws a transfer's name: unguessable, so nobody pulls (and so destroys) a
// transfer it was not given.
func newTransferID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// promptDigest names a sequence's prompt (and cache salt), so a decode worker can tell the KV
// it pulled is its own prompt's.
func promptDigest(q *sequence) uint64 { return blockHash(q.salt, q.tokens[:q.promptLen]) }

// digestOf is promptDigest of a prompt not yet submitted.
func (e *Engine) digestOf(prompt []uint64, salt string) uint64 {
	var parent uint64
	if salt != "" {
		parent = saltHash(salt)
	}
	return blockHash(parent, prompt)
}

// planHandoff reads the request's disaggregation fields for this engine's role. RoleBoth
// ignores them all, as an engine without a KV connector does; each role reads only its own
// side's fields. It answers 400 itself, and returns false, when they are malformed.
func (e *Engine) planHandoff(w http.ResponseWriter, req *completionRequest, maxTokens *int) (handoff, bool) {
	var h handoff
	if e.cfg.Role == RoleBoth {
		return h, true
	}
	sglang := req.BootstrapHost != nil || req.BootstrapPort != nil || req.BootstrapRoom != nil
	if sglang {
		return e.planRoom(w, req, maxTokens)
	}
	p := req.KVTransferParams
	if p == nil {
		return h, true
	}
	switch {
	case e.cfg.Role == RolePrefill && p.DoRemoteDecode:
		h.transferID = newTransferID()
		h.hold = vllmHoldKey(h.transferID)
	case e.cfg.Role == RoleDecode && p.DoRemotePrefill:
		pull, msg := e.vllmPull(p)
		if msg != "" {
			e.stats.badRequests.Add(1)
			writeEngineError(w, http.StatusBadRequest, "BadRequestError", "invalid kv_transfer_params: "+msg, false)
			return h, false
		}
		h.pull = pull
	}
	return h, true
}

// vllmPull checks a decode request's kv_transfer_params. Incomplete params (a field missing,
// no block ids) mean no transfer, and the request is prefilled here, as NixlConnector's
// update_state_after_alloc does ("Got invalid KVTransferParams ... will not utilize
// KVTransfer"); malformed values get a message.
func (e *Engine) vllmPull(p *kvTransferParams) (*kvPull, string) {
	maxBlocks := e.cfg.MaxModelLen/e.cfg.BlockSize + 1
	if len(p.RemoteBlockIDs) > maxBlocks {
		return nil, fmt.Sprintf("remote_block_ids has %d ids, more than the %d blocks of the longest request", len(p.RemoteBlockIDs), maxBlocks)
	}
	for _, id := range p.RemoteBlockIDs {
		if id < 0 || id > math.MaxInt32 {
			return nil, fmt.Sprintf("remote_block_ids holds %d, not a block id", id)
		}
	}
	for name, s := range map[string]*string{"remote_engine_id": p.RemoteEngineID, "remote_request_id": p.RemoteRequestID, "remote_host": p.RemoteHost} {
		if s != nil && (*s == "" || len(*s) > maxKVNameLen) {
			return nil, fmt.Sprintf("%s must be 1 to %d characters", name, maxKVNameLen)
		}
	}
	if p.RemoteHost != nil && !validHost(*p.RemoteHost) {
		return nil, "remote_host must be a host name or an IP address"
	}
	if p.RemotePort != nil && (*p.RemotePort < 1 || *p.RemotePort > 65535) {
		return nil, fmt.Sprintf("remote_port must be in 1..65535, got %d", *p.RemotePort)
	}
	if len(p.RemoteBlockIDs) == 0 || p.RemoteEngineID == nil || p.RemoteRequestID == nil || p.RemoteHost == nil || p.RemotePort == nil {
		e.log.Warn("sim: incomplete kv_transfer_params: the request is prefilled here")
		return nil, ""
	}
	return &kvPull{
		addr: net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort)),
		req:  kvPullRequest{EngineID: *p.RemoteEngineID, RequestID: *p.RemoteRequestID, BlockIDs: p.RemoteBlockIDs},
	}, ""
}

// planRoom reads SGLang's bootstrap fields: both workers get the same bootstrap_host,
// bootstrap_port (the prefill worker's) and bootstrap_room. A prefill worker computes only the
// first token and holds the room's KV; a decode worker pulls it, waiting for it up to
// KVWaitTimeout. A disaggregated request without a room gets SGLang's 400.
func (e *Engine) planRoom(w http.ResponseWriter, req *completionRequest, maxTokens *int) (handoff, bool) {
	var h handoff
	refuse := func(msg string) (handoff, bool) {
		e.stats.badRequests.Add(1)
		writeEngineError(w, http.StatusBadRequest, "BadRequestError", msg, true)
		return h, false
	}
	if req.BootstrapRoom == nil {
		return refuse("Disaggregated request received without bootstrap room id")
	}
	room := *req.BootstrapRoom
	if room > maxBootstrapRoom {
		return refuse(fmt.Sprintf("bootstrap_room must be in [0, 2^63-1], got %d", room))
	}
	if e.cfg.Role == RolePrefill {
		e.mu.Lock()
		busy := e.sched.holds.has(roomHoldKey(room))
		e.mu.Unlock()
		if busy {
			return refuse(fmt.Sprintf("bootstrap_room %d is already held", room))
		}
		h.hold = roomHoldKey(room)
		*maxTokens = 1
		return h, true
	}
	switch {
	case req.BootstrapHost == nil || !validHost(*req.BootstrapHost):
		return refuse("bootstrap_host must be the prefill worker's host name or IP address")
	case req.BootstrapPort == nil || *req.BootstrapPort < 1 || *req.BootstrapPort > 65535:
		return refuse("bootstrap_port must be the prefill worker's bootstrap port, in 1..65535")
	}
	h.pull = &kvPull{
		addr: net.JoinHostPort(*req.BootstrapHost, strconv.Itoa(*req.BootstrapPort)),
		req:  kvPullRequest{Room: &room, WaitMS: e.cfg.KVWaitTimeout.Milliseconds()},
		room: true,
	}
	return h, true
}

// validHost accepts a host name or an IP address (IPv6 without brackets), nothing that could
// change the URL built from it.
func validHost(s string) bool {
	if s == "" || len(s) > maxKVNameLen {
		return false
	}
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == ':' || c == '_'
		if !ok {
			return false
		}
	}
	return true
}

// writeEngineError answers in the shape of the engine whose flow the request follows: vLLM's
// ErrorResponse {"error": {"message", "type", "param", "code": status}}, or SGLang's
// {"object": "error", "message", "type", "param", "code": status}.
func writeEngineError(w http.ResponseWriter, status int, typ, msg string, sglang bool) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(engineErrorJSON(status, typ, msg, sglang))
}

func engineErrorJSON(status int, typ, msg string, sglang bool) []byte {
	type detail struct {
		Object  string  `json:"object,omitempty"`
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}
	d := detail{Message: msg, Type: typ, Code: status}
	var data []byte
	if sglang {
		d.Object = "error"
		data, _ = json.Marshal(d)
	} else {
		data, _ = json.Marshal(struct {
			Error detail `json:"error"`
		}{d})
	}
	return data
}

// receive pulls the KV of prompt from the prefill worker and waits out its transfer, the
// prompt's blocks times KVTransferPerBlock; it returns how many prompt tokens need no prefill
// (all but the last, which is recomputed to sample from, as vLLM's scheduler does when every
// prompt token was loaded). The request counts as waiting meanwhile, as vLLM's
// WAITING_FOR_REMOTE_KVS requests do.
func (e *Engine) receive(ctx context.Context, p *kvPull, prompt []uint64, salt string) (int, error) {
	e.stats.receiving.Add(1)
	defer e.stats.receiving.Add(-1)
	p.req.PromptTokens, p.req.Digest = len(prompt), strconv.FormatUint(e.digestOf(prompt, salt), 16)
	ans, err := e.pull(ctx, p)
	if err != nil {
		return 0, err
	}
	if ans.PromptTokens != p.req.PromptTokens || ans.Digest != p.req.Digest {
		return 0, errTransferPrompt
	}
	blocks := (len(prompt) + e.cfg.BlockSize - 1) / e.cfg.BlockSize
	t := time.NewTimer(time.Duration(float64(blocks) * float64(e.cfg.KVTransferPerBlock) * e.cfg.TimeScale))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-e.stop:
		return 0, errClosed
	}
	return len(prompt) - 1, nil
}

// pull asks the prefill worker at p.addr for the KV (POST /kv/pull), as NIXL reads it from the
// remote engine: an answer other than 200 is a refusal, its message kept.
func (e *Engine) pull(ctx context.Context, p *kvPull) (kvPullAnswer, error) {
	var ans kvPullAnswer
	timeout := vllmPullTimeout
	if p.room {
		timeout += e.cfg.KVWaitTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, _ := json.Marshal(p.req)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.addr+"/kv/pull", bytes.NewReader(body))
	if err != nil {
		return ans, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.peers.Do(req)
	if err != nil {
		return ans, fmt.Errorf("pulling from %s: %w", p.addr, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxPullAnswer))
	if err != nil {
		return ans, fmt.Errorf("pulling from %s: %w", p.addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		var refusal errorBody
		_ = json.Unmarshal(data, &refusal)
		return ans, fmt.Errorf("%s refused the pull (%d): %s", p.addr, resp.StatusCode, refusal.Error.Message)
	}
	if err := json.Unmarshal(data, &ans); err != nil {
		return ans, fmt.Errorf("pulling from %s: %w", p.addr, err)
	}
	return ans, nil
}

// refuseTransfer fails a decode request whose KV could not be had, as the engines do: vLLM's
// default kv_load_failure_policy "fail" ends it with finish reason "error", which its OpenAI
// server answers 500 "Internal server error" (an error event on a stream already started);
// SGLang's decode aborts it with 500 "Decode transfer failed for request ...".
func (rs *responseStream) refuseTransfer(p *kvPull, err error) {
	rs.e.log.Warn("sim: KV transfer failed", "from", p.addr, "err", err)
	var body []byte
	if p.room {
		msg := fmt.Sprintf("Decode transfer failed for request bootstrap_room=%d with exception KVTransferError(bootstrap_room=%d): %v", *p.req.Room, *p.req.Room, err)
		body = engineErrorJSON(http.StatusInternalServerError, "InternalServerError", msg, true)
	} else {
		msg := fmt.Sprintf("Internal server error: KV transfer of request %s from engine %s failed: %v", p.req.RequestID, p.req.EngineID, err)
		body = engineErrorJSON(http.StatusInternalServerError, "InternalServerError", msg, false)
	}
	rs.e.stats.transferFailed.Add(1)
	if !rs.started {
		rs.w.Header().Set("Content-Type", "application/json")
		rs.w.WriteHeader(http.StatusInternalServerError)
		_, _ = rs.w.Write(body)
		return
	}
	rs.line = append(append(append(rs.line[:0], "data: "...), body...), "\n\n"...)
	_, _ = rs.w.Write(rs.line)
	_, _ = io.WriteString(rs.w, "data: [DONE]\n\n")
	_ = http.NewResponseController(rs.w).Flush()
}

// serveKVPull answers POST /kv/pull: a decode worker takes a held prefill's KV, which frees it
// here. 404 when nothing is held under the name (unknown, expired, already pulled; a room not
// prefilled within the wait), 409 when the pull names other blocks, another engine or another
// prompt (the hold is kept), 503 when
// too many pulls wait already. Only a RolePrefill engine holds anything.
func (e *Engine) serveKVPull(w http.ResponseWriter, r *http.Request) {
	var req kvPullRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPullBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "the pull is not valid JSON: "+err.Error())
		return
	}
	var key string
	match := func(h *heldKV) error {
		if req.PromptTokens != h.promptLen || req.Digest != strconv.FormatUint(h.digest, 16) {
			return errTransferPrompt
		}
		return nil
	}
	switch {
	case req.RequestID != "":
		key = vllmHoldKey(req.RequestID)
		samePrompt := match
		match = func(h *heldKV) error {
			if req.EngineID != e.engineID || !slices.Equal(req.BlockIDs, h.ids) {
				return errTransferMismatch
			}
			return samePrompt(h)
		}
	case req.Room != nil:
		key = roomHoldKey(*req.Room)
	default:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_name", "a pull names a request_id or a room")
		return
	}
	wait := min(time.Duration(max(req.WaitMS, 0))*time.Millisecond, e.cfg.KVWaitTimeout)
	if req.Room == nil {
		wait = 0
	}
	held, err := e.takeHeld(r.Context(), key, wait, match)
	switch {
	case errors.Is(err, errTransferMismatch), errors.Is(err, errTransferPrompt):
		writeError(w, http.StatusConflict, "invalid_request_error", "transfer_mismatch", err.Error())
		return
	case errors.Is(err, errTooManyPulls):
		writeError(w, http.StatusServiceUnavailable, "server_error", "too_many_pulls", err.Error())
		return
	case err != nil:
		writeError(w, http.StatusNotFound, "invalid_request_error", "transfer_not_found", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(kvPullAnswer{PromptTokens: held.promptLen, Digest: strconv.FormatUint(held.digest, 16)})
}

var errTooManyPulls = errors.New("too many pulls are waiting for their room")

// takeHeld takes the hold under key, waiting up to wait for it to appear (an SGLang decode
// worker asks for its room as soon as it gets the request, before the prefill is done).
func (e *Engine) takeHeld(ctx context.Context, key string, wait time.Duration, match func(*heldKV) error) (*heldKV, error) {
	if wait > 0 {
		if e.pullWaiters.Add(1) > maxPullWaiters {
			e.pullWaiters.Add(-1)
			return nil, errTooManyPulls
		}
		defer e.pullWaiters.Add(-1)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		e.mu.Lock()
		held, err := e.sched.holds.take(key, e.now(), match)
		changed := e.sched.holds.changed
		e.sched.publish() // take may have freed expired holds as well as this one
		e.mu.Unlock()
		if held != nil {
			e.poke() // blocks were freed: a waiting request may fit now
			return held, nil
		}
		if !errors.Is(err, errTransferUnknown) || wait == 0 {
			return nil, err
		}
		select {
		case <-changed:
		case <-t.C:
			return nil, fmt.Errorf("nothing held for it after %v: %w", wait, err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.stop:
			return nil, errClosed
		}
	}
}
