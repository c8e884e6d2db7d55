package sim

import (
	"encoding/json"
	"net/http"
)

// chatTemplate is renderChat's template in Jinja, as llama-server reports its model's.
const chatTemplate = "{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}<|assistant|>"

// props is the part of llama-server's GET /props answer that a router reads: total_slots is
// its --parallel and default_generation_settings.n_ctx one slot's context.
type props struct {
	DefaultGenerationSettings struct {
		NCtx   int `json:"n_ctx"`
		Params struct {
			NPredict    int     `json:"n_predict"`
			Temperature float64 `json:"temperature"`
			TopK        int     `json:"top_k"`
			TopP        float64 `json:"top_p"`
			MinP        float64 `json:"min_p"`
		} `json:"params"`
	} `json:"default_generation_settings"`
	TotalSlots      int             `json:"total_slots"`
	ModelAlias      string          `json:"model_alias"`
	ModelPath       string          `json:"model_path"`
	Modalities      map[string]bool `json:"modalities"`
	EndpointSlots   bool            `json:"endpoint_slots"`
	EndpointProps   bool            `json:"endpoint_props"`
	EndpointMetrics bool            `json:"endpoint_metrics"`
	ChatTemplate    string          `json:"chat_template"`
	BOSToken        string          `json:"bos_token"`
	EOSToken        string          `json:"eos_token"`
	BuildInfo       string          `json:"build_info"`
}

// serveProps answers GET /props as llama-server does (ModeSlots only; vLLM has no /props).
func (e *Engine) serveProps(w http.ResponseWriter) {
	var p props
	g := &p.DefaultGenerationSettings
	g.NCtx = e.cfg.slotTokens()
	g.Params.NPredict, g.Params.Temperature, g.Params.TopK, g.Params.TopP, g.Params.MinP = -1, 0.8, 40, 0.95, 0.05
	p.TotalSlots = e.cfg.Slots
	p.ModelAlias = e.cfg.Model
	p.ModelPath = "usher-sim/" + e.cfg.Model + ".gguf"
	p.Modalities = map[string]bool{"vision": false, "audio": false}
	p.EndpointProps, p.EndpointMetrics = false, true
	p.ChatTemplate = chatTemplate
	p.BOSToken, p.EOSToken = "<s>", "</s>"
	p.BuildInfo = "usher-sim"
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(p)
}

// slotState is one element of llama-server's GET /slots answer, the fields a router reads.
type slotState struct {
	ID           int   `json:"id"`
	IDTask       int64 `json:"id_task"` // -1 when idle
	NCtx         int   `json:"n_ctx"`
	IsProcessing bool  `json:"is_processing"`
	// NCached is how many tokens the slot keeps for the next request (its prompt cache).
	NCached int `json:"n_prompt_tokens_cache"`
}

// serveSlots answers GET /slots as llama-server does (ModeSlots only).
func (e *Engine) serveSlots(w http.ResponseWriter) {
	e.mu.Lock()
	states := make([]slotState, len(e.sched.slots.slots))
	for i, sl := range e.sched.slots.slots {
		states[i] = slotState{ID: i, IDTask: -1, NCtx: e.cfg.slotTokens(), IsProcessing: sl.busy, NCached: len(sl.tokens)}
		if sl.busy {
			states[i].IDTask = int64(sl.task)
		}
	}
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(states)
}
