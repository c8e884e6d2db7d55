package gateway

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// apiError is an error as the client sees it: an HTTP status and OpenAI's error object. It is
// the only error type handlers return; toAPIError maps every other error to one, so this file is
// the one place that decides statuses.
type apiError struct {
	Status  int
	Type    string // OpenAI error type: invalid_request_error, authentication_error, ...
	Code    string // machine-readable: model_not_found, queue_full, ...
	Param   string // the offending request field, when there is one
	Message string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds, rounded up).
	RetryAfter time.Duration
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error",
		Code: "invalid_request", Param: param, Message: fmt.Sprintf(format, args...)}
}

// toAPIError maps an error from any layer to what the client is told. Messages of wrapped
// domain errors are safe to show: no layer puts a credential into an error.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return fromEchoError(he)
	}
	if qe, ok := queueError(err); ok {
		return qe
	}
	if le, ok := limitsError(err); ok {
		return le
	}
	switch {
	case errors.Is(err, tenants.ErrUnauthenticated):
		return &apiError{Status: http.StatusUnauthorized, Type: "authentication_error",
			Code: "invalid_api_key", Message: "invalid or missing credential: " + err.Error()}
	case errors.Is(err, routing.ErrUnknownModel):
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Code: "model_not_found", Param: "model", Message: err.Error()}
	case errors.Is(err, routing.ErrUnknownWorker):
		return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error",
			Code: "worker_not_found", Message: err.Error()}
	case errors.Is(err, routing.ErrNoWorker):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error",
			Code: "no_worker_available", Message: err.Error(), RetryAfter: time.Second}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error",
		Code: "internal_error", Message: "internal error"}
}

func fromEchoError(he *echo.HTTPError) *apiError {
	msg := http.StatusText(he.Code)
	if s, ok := he.Message.(string); ok {
		msg = s
	}
	ae := &apiError{Status: he.Code, Type: "invalid_request_error", Message: msg}
	switch he.Code {
	case http.StatusNotFound:
		ae.Code = "not_found"
	case http.StatusMethodNotAllowed:
		ae.Code = "method_not_allowed"
	case http.StatusRequestEntityTooLarge:
		ae.Code = "request_too_large"
	default:
		if he.Code >= 500 {
			ae.Type, ae.Code = "server_error", "internal_error"
		}
	}
	return ae
}

// errorBody is OpenAI's error envelope.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// writeError sends err to the client in OpenAI's shape, unless the response has begun.
func writeError(c echo.Context, err error) error {
	if c.Response().Committed {
		return nil
	}
	ae := toAPIError(err)
	if ae.RetryAfter > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(ae.RetryAfter.Seconds()))))
	}
	body := errorBody{Error: errorObject{Message: ae.Message, Type: ae.Type, Code: ae.Code}}
	if ae.Param != "" {
		body.Error.Param = &ae.Param
	}
	return c.JSON(ae.Status, body)
}

// httpErrorHandler is Echo's error handler: everything Echo itself refuses (unknown route, wrong
// method) also leaves in OpenAI's shape.
func httpErrorHandler(err error, c echo.Context) {
	_ = writeError(c, err)
}
