package gateway

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// OpenAI's model objects: GET /v1/models lists, and GET /v1/models/{id} retrieves, the models
// the pool serves that the caller's tier may use. A model the tier may not use does not exist for
// the caller: its retrieval is the same 404 as an unknown model's, as OpenAI answers, so the
// fleet's other models are not disclosed.

// model is OpenAI's model object.
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func newModel(id string) model { return model{ID: id, Object: "model", OwnedBy: "usher"} }

// callerTier is the tier of the authenticated caller.
func callerTier(p tenants.Principal) *tenants.Tier {
	if t := p.TierSpec; t != nil {
		return t
	}
	return fallbackTier
}

// listModels lists the models the pool serves and the caller's tier may use, in OpenAI's list
// shape.
func (s *Server) listModels(c echo.Context, p tenants.Principal) error {
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	tier := callerTier(p)
	for _, name := range s.pool.Models() {
		if tier.AllowsModel(name) {
			list.Data = append(list.Data, newModel(name))
		}
	}
	return c.JSON(http.StatusOK, list)
}

// retrieveModel answers GET /v1/models/{id}. A model id may hold slashes
// ("meta-llama/Llama-3-8B"), sent as they are or escaped (%2F).
func (s *Server) retrieveModel(c echo.Context, p tenants.Principal) error {
	id := c.Param("*")
	if c.Request().URL.RawPath != "" {
		unescaped, err := url.PathUnescape(id)
		if err != nil {
			return WriteError(c, BadRequest("model", "the model id in the path is not validly escaped"))
		}
		id = unescaped
	}
	if !s.pool.Serves(id) || !callerTier(p).AllowsModel(id) {
		return WriteError(c, fmt.Errorf("the model %q does not exist or you do not have access to it: %w", id, routing.ErrUnknownModel))
	}
	return c.JSON(http.StatusOK, newModel(id))
}
