package httpapi

import (
	"context"

	"github.com/proxypool/proxypool/engine/controller"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
)

// Extractor performs one exclusive extraction. The controller fills what
// the HTTP layer does not know (reserveForGateway, idempotency TTL, now).
// Errors: *extraction.InsufficientError / extraction.ErrInsufficient (409),
// extraction.ErrIdempotencyConflict (422), management.ErrUnavailable (503).
type Extractor interface {
	Extract(ctx context.Context, req extraction.Request) (extraction.Result, error)
}

// Admin is what the admin API reads and changes. actor is the
// authenticated principal, recorded in the audit log. Errors:
// controller.ErrUnknownUpstream / ErrUnknownRouting (404),
// controller.ErrInvalidSwitch (400), management.ErrUnavailable (503).
type Admin interface {
	Status(ctx context.Context) (controller.Status, error)
	Upstreams(ctx context.Context) ([]controller.UpstreamStatus, error)
	SetUpstreamEnabled(ctx context.Context, actor, name string, enabled bool) error
	Routings(ctx context.Context) ([]controller.RoutingStatus, error)
	SwitchRouting(ctx context.Context, actor, name string, index int) error
	Proxies(ctx context.Context, f activitypool.Filter) ([]controller.ProxyView, error)
	Audit(ctx context.Context, limit int) ([]management.AuditEntry, error)
}

// Reloader re-reads and applies the configuration. A validation failure is
// returned as config.Errors (possibly wrapped) and answered 422 with every
// error.
type Reloader interface {
	Reload(ctx context.Context, actor string) error
}

// Readiness reports whether the process should receive traffic.
type Readiness interface {
	Ready() bool
}
