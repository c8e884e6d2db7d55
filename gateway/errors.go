package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// APIError is an error as a client sees it: an HTTP status and OpenAI's error object. The data
// plane, the admin API and the console all answer through ErrorFor, so this file is the one
// place that decides statuses.
type APIError struct {
	Status  int
	Type    string // OpenAI error type: invalid_request_error, authentication_error, ...
	Code    string // machine-readable: model_not_found, queue_full, ...
	Param   string // the offending request field, when there is one
	Message string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds, rounded up).
	RetryAfter time.Duration
}

func (e *APIError) Error() string { return e.Message }

// BadRequest is a 400 invalid_request naming param (may be empty).
func BadRequest(param, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error",
		Code: "invalid_request", Param: param, Message: fmt.Sprintf(format, args...)}
}

// TooLarge is the 413 of a body over limit bytes.
func TooLarge(limit int64) *APIError {
	return &APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Code: "request_too_large", Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
}

// Errors of the data plane's own, mapped by the table like the domain packages' errors.
var (
	// errUnknownTarget: X-Usher-Target-Worker names no worker of the model (a bad header: 400).
	errUnknownTarget = errors.New("no worker of this model has that id")
	// errTargetNotAllowed: the tier may not choose a worker (403).
	errTargetNotAllowed = errors.New("your tier may not choose a worker with " + headerTarget)
	// errUpstream: no worker could answer after every attempt (502).
	errUpstream = errors.New("no worker could serve the request")
	// errUpstreamAnswer: the worker's answer could not be read or was too large (502).
	errUpstreamAnswer = errors.New("the worker's answer could not be relayed")
)

// Errors of the admin plane's access checks (package adminui), mapped by the table like the rest.
var (
	// ErrAdminCredential: an admin API call or console request without a valid admin, viewer or
	// tenant credential (401 invalid_admin_token).
	ErrAdminCredential = errors.New("missing or invalid admin credential")
	// ErrAdminRequired: a tenant's credential on the fleet's routes (403 admin_required).
	ErrAdminRequired = errors.New("admin rights required")
	// ErrReadOnlyActor: the viewer asked for a change (403 read_only).
	ErrReadOnlyActor = errors.New("the viewer may read but not change anything")
	// ErrTooManyAttempts: the client, or every client together, failed too many credential
	// checks of the admin plane lately (429 too_many_attempts; the admin plane sets Retry-After).
	ErrTooManyAttempts = errors.New("too many failed sign-in attempts; retry later")
)

// errorRule is one row of the error table: every error that errors.Is matches err gets status,
// type, code and param; retry, when positive, is its Retry-After unless the error carries its
// own. showCause says whether the wrapped error's message is shown after message (domain errors
// never carry a credential) or only message; a row with a message of its own leaves the
// sentinel's text off the end of the cause, since its message says that already
// ("authentication failed: unknown credential", not "...: unknown credential: unauthenticated").
type errorRule struct {
	err       error
	status    int
	typ, code string
	param     string
	message   string
	retry     time.Duration
	showCause bool
}

// modelNotFound is the message of a model that no worker serves or the caller's tier does not
// include: the same for both.
const modelNotFound = "model not found: it does not exist or you do not have access to it"

// errorTable maps every domain error to what a client is told, most specific first. Adding a
// sentinel anywhere that reaches a client means adding its row here.
var errorTable = []errorRule{
	// Who is calling.
	{err: tenants.ErrUnauthenticated, status: http.StatusUnauthorized, typ: "authentication_error",
		code: "invalid_api_key", message: "authentication failed: ", showCause: true},
	{err: tenants.ErrForbidden, status: http.StatusForbidden, typ: "permission_error", code: "forbidden", showCause: true},
	// Limits.
	// A model the caller's tier does not include is answered as one that does not exist (OpenAI's
	// 404 model_not_found), word for word, so a tier cannot learn of the models it may not use.
	{err: tenants.ErrModelNotAllowed, status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found",
		param: "model", message: modelNotFound},
	{err: tenants.ErrPromptTooLong, status: http.StatusBadRequest, typ: "invalid_request_error",
		code: "context_length_exceeded", param: "messages", message: "the prompt is longer than your tier allows"},
	{err: tenants.ErrBudgetExceeded, status: http.StatusTooManyRequests, typ: "insufficient_quota", code: "budget_exceeded",
		showCause: true},
	{err: errTargetNotAllowed, status: http.StatusForbidden, typ: "permission_error", code: "target_worker_not_allowed", showCause: true},
	{err: errTenantBodyBytes, status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "body_bytes_exceeded",
		retry: time.Second, showCause: true},
	{err: errBodyBytes, status: http.StatusServiceUnavailable, typ: "server_error", code: "server_busy",
		retry: time.Second, showCause: true},
	// The queue.
	{err: queue.ErrQueueFull, status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full",
		message: "the queue for this tenant or class is full; retry later"},
	{err: queue.ErrDeadlineUnreachable, status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "deadline_unreachable",
		message: "the request cannot be served within its deadline given the work queued ahead"},
	{err: errObjectiveUnreachable, status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "objective_unreachable",
		showCause: true},
	{err: queue.ErrDeadlineExceeded, status: http.StatusGatewayTimeout, typ: "timeout_error", code: "deadline_exceeded",
		message: "the request's deadline passed while it waited in the queue"},
	{err: queue.ErrTooLarge, status: http.StatusBadRequest, typ: "invalid_request_error", code: "request_too_large",
		message: "the request needs more tokens in flight than the model's workers can hold"},
	{err: queue.ErrShutdown, status: http.StatusServiceUnavailable, typ: "server_error", code: "shutting_down",
		message: "the gateway is shutting down; retry", retry: time.Second},
	// Workers.
	{err: routing.ErrUnknownModel, status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found",
		param: "model", message: modelNotFound},
	{err: errUnknownTarget, status: http.StatusBadRequest, typ: "invalid_request_error", code: "worker_not_found", showCause: true},
	{err: routing.ErrUnknownWorker, status: http.StatusNotFound, typ: "invalid_request_error", code: "worker_not_found", showCause: true},
	{err: routing.ErrWorkerExists, status: http.StatusConflict, typ: "invalid_request_error", code: "worker_exists", showCause: true},
	{err: routing.ErrReadOnlyWorker, status: http.StatusConflict, typ: "invalid_request_error", code: "read_only", showCause: true},
	{err: routing.ErrWorkerDraining, status: http.StatusConflict, typ: "invalid_request_error", code: "worker_draining", showCause: true},
	{err: routing.ErrPinsIgnored, status: http.StatusConflict, typ: "invalid_request_error", code: "pins_ignored", showCause: true},
	{err: routing.ErrNoWorker, status: http.StatusServiceUnavailable, typ: "server_error", code: "no_worker_available",
		retry: time.Second, showCause: true},
	{err: errUpstream, status: http.StatusBadGateway, typ: "server_error", code: "upstream_error", showCause: true},
	{err: errUpstreamAnswer, status: http.StatusBadGateway, typ: "server_error", code: "upstream_error", showCause: true},
	// The admin plane's access checks.
	{err: ErrAdminCredential, status: http.StatusUnauthorized, typ: "authentication_error", code: "invalid_admin_token", showCause: true},
	{err: ErrAdminRequired, status: http.StatusForbidden, typ: "permission_error", code: "admin_required", showCause: true},
	{err: ErrReadOnlyActor, status: http.StatusForbidden, typ: "permission_error", code: "read_only", showCause: true},
	{err: ErrTooManyAttempts, status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "too_many_attempts", showCause: true},
	// The tenant store (admin API).
	{err: tenants.ErrStorage, status: http.StatusServiceUnavailable, typ: "server_error", code: "storage_unavailable",
		message: "the tenant store cannot be read or written now; retry", retry: time.Second},
	{err: tenants.ErrNotFound, status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found", showCause: true},
	{err: tenants.ErrConflict, status: http.StatusConflict, typ: "invalid_request_error", code: "conflict", showCause: true},
	{err: tenants.ErrInvalid, status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_request", showCause: true},
}

// ErrorFor maps an error from any layer to what the client is told: an *APIError as it is, an
// Echo error by its status, a domain error by the first row of errorTable it matches (a
// *tenants.LimitError as 429 rate_limit_exceeded). Anything else is a 500 whose message is not
// shown.
func ErrorFor(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return fromEchoError(he)
	}
	var le *tenants.LimitError
	if errors.As(err, &le) {
		return &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
			Message: "rate limit reached for " + string(le.Limit) + "; retry later", RetryAfter: le.RetryAfter}
	}
	for _, r := range errorTable {
		if !errors.Is(err, r.err) {
			continue
		}
		out := &APIError{Status: r.status, Type: r.typ, Code: r.code, Param: r.param, Message: r.message, RetryAfter: r.retry}
		if r.showCause {
			cause := err.Error()
			if r.message != "" {
				cause = strings.TrimSuffix(cause, ": "+r.err.Error())
			}
			out.Message += cause
		}
		var rej *queue.Rejection
		if errors.As(err, &rej) && rej.RetryAfter > 0 {
			out.RetryAfter = rej.RetryAfter
		}
		var spent *tenants.BudgetError
		if errors.As(err, &spent) && spent.RetryAfter > 0 {
			out.RetryAfter = spent.RetryAfter
		}
		var unreachable *objectiveRefusal
		if errors.As(err, &unreachable) {
			out.RetryAfter = unreachable.retryAfter
		}
		return out
	}
	return &APIError{Status: http.StatusInternalServerError, Type: "server_error",
		Code: "internal_error", Message: "internal error"}
}

// Invalid is ErrorFor for a caller whose unmatched errors are the caller's fault: the admin API,
// where the domain packages' validation errors name the field and the problem. A 500 of
// ErrorFor becomes a 400 showing err's message.
func Invalid(err error) *APIError {
	ae := ErrorFor(err)
	if ae.Status == http.StatusInternalServerError {
		return BadRequest("", "%v", err)
	}
	return ae
}

func fromEchoError(he *echo.HTTPError) *APIError {
	msg := http.StatusText(he.Code)
	if s, ok := he.Message.(string); ok {
		msg = s
	}
	ae := &APIError{Status: he.Code, Type: "invalid_request_error", Message: msg}
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

// WriteError sends err, mapped by ErrorFor, to the client in OpenAI's shape with its
// Retry-After, unless the response has begun.
func WriteError(c echo.Context, err error) error {
	if c.Response().Committed {
		return nil
	}
	ae := ErrorFor(err)
	if ae.RetryAfter > 0 {
		c.Response().Header().Set("Retry-After", ae.retryAfter())
	}
	return c.JSON(ae.Status, ae.body())
}

// body is e in OpenAI's error envelope.
func (e *APIError) body() errorBody {
	b := errorBody{Error: errorObject{Message: e.Message, Type: e.Type, Code: e.Code}}
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	return b
}

// retryAfter is e.RetryAfter as a Retry-After value: whole seconds, rounded up.
func (e *APIError) retryAfter() string {
	return strconv.Itoa(int(math.Ceil(e.RetryAfter.Seconds())))
}

// The answers of the connection bounds (conns.go), written at accept to a connection the HTTP
// server never sees, before any of its request is read.
var (
	errClientConnections = &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error",
		Code: "too_many_connections", RetryAfter: time.Second,
		Message: "this client address already holds the most connections server.max_connections_per_client allows; reuse a connection (keep-alive) or wait for one to close"}
	errAllConnections = &APIError{Status: http.StatusServiceUnavailable, Type: "server_error",
		Code: "too_many_connections", RetryAfter: time.Second,
		Message: "the gateway holds the most client connections server.max_connections allows; retry shortly"}
)

// rawAnswer is ae as a whole HTTP/1.1 answer in OpenAI's shape that closes its connection.
func rawAnswer(ae *APIError) []byte {
	body, _ := json.Marshal(ae.body())
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"+
		"Retry-After: %s\r\nConnection: close\r\n\r\n%s",
		ae.Status, http.StatusText(ae.Status), len(body), ae.retryAfter(), body)
}

// httpErrorHandler is Echo's error handler: everything Echo itself refuses (unknown route, wrong
// method) also leaves in OpenAI's shape.
func httpErrorHandler(err error, c echo.Context) {
	_ = WriteError(c, err)
}
