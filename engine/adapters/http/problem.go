package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller"
	ctlextraction "github.com/proxypool/proxypool/engine/controller/extraction"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
)

// Media types.
const (
	contentJSON    = "application/json"
	contentProblem = "application/problem+json"
)

// problemTypeBase prefixes every problem type. A URN rather than a URL:
// RFC 9457 only needs a stable identifier, and a URL would invite clients
// to fetch it.
const problemTypeBase = "urn:proxypool:problem:"

// Problem types; the part after problemTypeBase.
const (
	ptBadRequest       = "bad-request"
	ptUnauthorized     = "unauthorized"
	ptForbidden        = "forbidden"
	ptNotFound         = "not-found"
	ptMethodNotAllowed = "method-not-allowed"
	ptInsufficient     = "insufficient-proxies"
	ptTooLarge         = "body-too-large"
	ptMediaType        = "unsupported-media-type"
	ptIdempotency      = "idempotency-conflict"
	ptRateLimited      = "rate-limited"
	ptInvalidConfig    = "invalid-configuration"
	ptUnavailable      = "unavailable"
	ptInternal         = "internal"
)

// problem is an RFC 9457 problem details object with this API's extension
// members.
type problem struct {
	Type      string       `json:"type"`
	Title     string       `json:"title"`
	Status    int          `json:"status"`
	Detail    string       `json:"detail,omitempty"`
	Requested *int         `json:"requested,omitempty"`
	Available *int         `json:"available,omitempty"`
	Errors    []fieldError `json:"errors,omitempty"`

	// retryAfter, when positive, is sent as the Retry-After header; it is
	// not a member of the body.
	retryAfter time.Duration
}

// fieldError is one config validation problem in a reload answer.
type fieldError struct {
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
}

func newProblem(status int, typ, detail string) *problem {
	return &problem{Type: problemTypeBase + typ, Title: http.StatusText(status), Status: status, Detail: detail}
}

func writeProblem(w http.ResponseWriter, p *problem) {
	h := w.Header()
	h.Set("Content-Type", contentProblem)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Del("Content-Length")
	b, err := json.Marshal(p)
	if err != nil {
		// A problem holds only strings and ints; this cannot fail.
		b = []byte(`{"type":"` + problemTypeBase + ptInternal + `","title":"Internal Server Error","status":500}`)
		p.Status = http.StatusInternalServerError
	}
	if p.retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(p.retryAfter), 10))
	}
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(b, '\n'))
}

// retryAfterSeconds renders d as Retry-After delta-seconds: whole seconds
// rounded up, since retrying before the limiter refills only earns
// another 429, and at least 1, since 0 would invite an immediate retry.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(s, 1)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, newProblem(http.StatusInternalServerError, ptInternal, "encoding response failed"))
		return
	}
	h := w.Header()
	h.Set("Content-Type", contentJSON)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// badRequest is a validation failure of the client's input; its message
// is safe to return.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func errBadRequest(msg string) error { return &badRequest{msg: msg} }

// problemFor maps an error from the controller to a problem. Messages of
// typed client errors are returned to the client (they name the upstream
// or routing the client sent); anything else is logged once here and
// answered with a generic detail, since it may describe internals.
func problemFor(log *slog.Logger, op string, err error) *problem {
	var (
		mbe *http.MaxBytesError
		br  *badRequest
		rl  *ctlextraction.RateLimitError
		ins *extraction.InsufficientError
		ce  config.Errors
	)
	switch {
	case errors.As(err, &mbe):
		return newProblem(http.StatusRequestEntityTooLarge, ptTooLarge, "request body larger than "+strconv.FormatInt(mbe.Limit, 10)+" bytes")
	case errors.As(err, &br):
		return newProblem(http.StatusBadRequest, ptBadRequest, br.msg)
	case errors.As(err, &ins):
		p := newProblem(http.StatusConflict, ptInsufficient, ins.Error())
		req, avail := ins.Requested, ins.Available
		p.Requested, p.Available = &req, &avail
		return p
	case errors.Is(err, extraction.ErrInsufficient):
		return newProblem(http.StatusConflict, ptInsufficient, err.Error())
	case errors.Is(err, controller.ErrRateLimited):
		// A bare sentinel carries no wait; one second still tells the
		// client to back off rather than retry at once.
		wait := time.Second
		if errors.As(err, &rl) && rl.RetryAfter > 0 {
			wait = rl.RetryAfter
		}
		p := newProblem(http.StatusTooManyRequests, ptRateLimited,
			"extraction rate limit (extraction.perClientPerMinute) exceeded; retry after "+strconv.FormatInt(retryAfterSeconds(wait), 10)+" s")
		p.retryAfter = wait
		return p
	case errors.Is(err, controller.ErrInvalidRequest):
		return newProblem(http.StatusBadRequest, ptBadRequest, err.Error())
	case errors.Is(err, extraction.ErrIdempotencyConflict):
		return newProblem(http.StatusUnprocessableEntity, ptIdempotency, extraction.ErrIdempotencyConflict.Error())
	case errors.As(err, &ce):
		p := newProblem(http.StatusUnprocessableEntity, ptInvalidConfig, "the new configuration was rejected; the previous one stays active")
		p.Errors = make([]fieldError, 0, len(ce))
		for _, e := range ce {
			p.Errors = append(p.Errors, fieldError{Path: e.Path, Message: e.Msg})
		}
		return p
	case errors.Is(err, controller.ErrUnknownUpstream), errors.Is(err, controller.ErrUnknownRouting):
		return newProblem(http.StatusNotFound, ptNotFound, err.Error())
	case errors.Is(err, controller.ErrInvalidSwitch):
		return newProblem(http.StatusBadRequest, ptBadRequest, err.Error())
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads this answer and nothing failed.
		log.Debug("request cancelled", "op", op)
		return newProblem(http.StatusServiceUnavailable, ptUnavailable, "request cancelled")
	case errors.Is(err, activitypool.ErrUnavailable), errors.Is(err, activitypool.ErrStateLost),
		errors.Is(err, management.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		log.Warn("request failed: dependency unavailable", "op", op, "err", err)
		return newProblem(http.StatusServiceUnavailable, ptUnavailable, unavailableDetail(err))
	default:
		log.Error("request failed", "op", op, "err", err)
		return newProblem(http.StatusInternalServerError, ptInternal, "internal error")
	}
}

// unavailableDetail names the store that failed, in fixed words: the
// error itself may carry addresses.
func unavailableDetail(err error) string {
	switch {
	case errors.Is(err, activitypool.ErrStateLost):
		return "the activity pool store lost its state and is being refilled; retry later"
	case errors.Is(err, activitypool.ErrUnavailable):
		return "the activity pool store is unavailable; retry later"
	case errors.Is(err, management.ErrUnavailable):
		return "the management store is unavailable; retry later"
	default:
		return "a backing store did not answer in time; retry later"
	}
}
