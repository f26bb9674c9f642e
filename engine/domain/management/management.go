// Package management is the contract of the store for management state:
// upstream admin state, routing cursors, the admin audit log and config
// revisions (seed 000 §12.1). It never holds proxy addresses, credentials
// or extraction records. The embedded store keeps it in a local file; the
// PostgreSQL adapter keeps it for a fleet.
package management

import (
	"context"
	"errors"
	"time"

	"github.com/proxypool/proxypool/engine/domain/routing"
)

// ErrUnavailable wraps failures of the backing store so the admin API can
// answer 503 rather than 500.
var ErrUnavailable = errors.New("management store unavailable")

// AuditEntry records one admin write.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string
	Action string // e.g. "upstream.disable"
	Target string
	Result string // "ok" or the error text
}

// Revision is one accepted configuration.
type Revision struct {
	ID          int64
	At          time.Time
	Fingerprint string
	Source      string
}

// Store is the management store.
type Store interface {
	// UpstreamEnabled returns the admin override for an upstream; set is
	// false when the admin never touched it (the config decides).
	UpstreamEnabled(ctx context.Context, name string) (enabled, set bool, err error)
	SetUpstreamEnabled(ctx context.Context, name string, enabled bool) error
	// Cursor returns a sequential routing's cursor (zero value if none).
	Cursor(ctx context.Context, routing string) (routing.Cursor, error)
	// CompareAndSetCursor writes next only if the stored cursor's
	// generation equals old.Generation; ok reports whether it won.
	CompareAndSetCursor(ctx context.Context, routing string, old, next routing.Cursor) (ok bool, err error)
	AppendAudit(ctx context.Context, e AuditEntry) error
	ListAudit(ctx context.Context, limit int) ([]AuditEntry, error)
	RecordRevision(ctx context.Context, r Revision) error
	Close() error
}
