package pgstore

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/routing"
)

// Bounds and defaults.
const (
	DefaultMaxConns          = 8
	DefaultConnectTimeout    = 3 * time.Second
	DefaultOpTimeout         = 5 * time.Second
	DefaultAuditRetention    = 100_000
	DefaultRevisionRetention = 1_000
	// MaxOutboxBatch bounds one ReadOutbox.
	MaxOutboxBatch = 1_000
	// OutboxChannel is the LISTEN/NOTIFY channel announcing new outbox
	// rows; the payload is the row id.
	OutboxChannel = "proxypool_outbox"
	maxNameLen    = 1024
)

// Outbox topics.
const (
	TopicUpstreamAdmin  = "upstream.admin"
	TopicRoutingCursor  = "routing.cursor"
	TopicConfigRevision = "config.revision"
)

// Options tune a Store; zero values take the defaults.
type Options struct {
	MaxConns          int32
	ConnectTimeout    time.Duration
	OpTimeout         time.Duration
	AuditRetention    int
	RevisionRetention int
	// MigrateOnStart applies pending migrations in Open; otherwise a schema
	// behind the binary is an error.
	MigrateOnStart bool
	// FingerprintKey keys Fingerprint; empty leaves Fingerprint unusable.
	FingerprintKey []byte
	Logger         *slog.Logger
	// Now stamps entries that arrive without a time.
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = DefaultOpTimeout
	}
	if o.AuditRetention <= 0 {
		o.AuditRetention = DefaultAuditRetention
	}
	if o.RevisionRetention <= 0 {
		o.RevisionRetention = DefaultRevisionRetention
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Store is the PostgreSQL management store. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	opts   Options
	closed atomic.Bool
}

// Open connects with the storage.postgres section of a validated config
// (its secrets resolved), checks the schema and, with migrateOnStart,
// migrates it.
func Open(ctx context.Context, c config.PG) (*Store, error) {
	return OpenWith(ctx, c, Options{
		MigrateOnStart: c.MigrateOnStart,
		FingerprintKey: []byte(c.FingerprintKey.Value()),
	})
}

// OpenWith is Open with explicit options; o.MigrateOnStart and
// o.FingerprintKey are taken as given, not from c.
func OpenWith(ctx context.Context, c config.PG, o Options) (*Store, error) {
	o.defaults()
	pc, err := poolConfig(c, o)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open management store: %w", err)
	}
	s := &Store{pool: pool, opts: o}
	if err := s.prepare(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// poolConfig builds the pgx pool configuration: the URL, the password
// secret (which wins over one in the URL), TLS and the bounds.
func poolConfig(c config.PG, o Options) (*pgxpool.Config, error) {
	if c.URL == "" {
		return nil, errors.New("open management store: storage.postgres.url is empty")
	}
	pc, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		// The parse error may echo the URL, password included.
		return nil, errors.New("open management store: storage.postgres.url is not a valid PostgreSQL URL")
	}
	if v := c.Password.Value(); v != "" {
		pc.ConnConfig.Password = v
	}
	if c.TLS.Enabled {
		tc, err := c.TLS.ClientConfig(pc.ConnConfig.Host)
		if err != nil {
			return nil, fmt.Errorf("open management store: %w", err)
		}
		pc.ConnConfig.TLSConfig = tc
		pc.ConnConfig.Fallbacks = nil // never fall back to plaintext
	}
	pc.MaxConns = o.MaxConns
	pc.ConnConfig.ConnectTimeout = o.ConnectTimeout
	return pc, nil
}

// prepare checks the server is reachable and the schema current,
// migrating it when asked to.
func (s *Store) prepare(ctx context.Context) error {
	m, err := NewMigrator(ctx, s.pool)
	if err != nil {
		return err
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(ctx, max(s.opts.OpTimeout, time.Minute))
	defer cancel()
	if s.opts.MigrateOnStart {
		res, err := m.Up(ctx)
		if err != nil {
			return err
		}
		for _, r := range res {
			s.opts.Logger.Info("applied migration", "version", r.Version, "name", r.Name)
		}
		return nil
	}
	cur, latest, err := m.Version(ctx)
	if err != nil {
		return err
	}
	if cur < latest {
		return fmt.Errorf("open management store: %w", &SchemaError{Current: cur, Latest: latest})
	}
	if cur > latest {
		s.opts.Logger.Warn("schema is newer than this binary", "schema_version", cur, "binary_version", latest)
	}
	return nil
}

// SchemaError reports a schema behind the binary.
type SchemaError struct{ Current, Latest int64 }

func (e *SchemaError) Error() string {
	return fmt.Sprintf("schema at version %d, this binary needs %d: run `proxy-controller migrate up` or set storage.postgres.migrateOnStart", e.Current, e.Latest)
}

// Pool exposes the connection pool to callers that need it (the migrate
// command, LISTEN on OutboxChannel).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Fingerprint is the HMAC-SHA-256 fingerprint of a configuration, keyed with
// the fleet's shared secret (seed 000 §14). digest is config.Config.Digest,
// the SHA-256 of the whole file, so the fingerprint covers the full
// configuration while the key keeps it from being recomputed — or a file
// guessed from it — by anyone reading the database.
func Fingerprint(key []byte, digest string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("proxypool config v1\x00"))
	m.Write([]byte(digest))
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil))
}

// ErrNoFingerprintKey is returned by Store.Fingerprint without a key.
var ErrNoFingerprintKey = errors.New("no config fingerprint key configured (storage.postgres.fingerprintKey)")

// Fingerprint keys c's digest with the store's key.
func (s *Store) Fingerprint(c *config.Config) (string, error) {
	if len(s.opts.FingerprintKey) == 0 {
		return "", ErrNoFingerprintKey
	}
	if c.Digest == "" {
		return "", errors.New("config has no digest (not loaded from a file)")
	}
	return Fingerprint(s.opts.FingerprintKey, c.Digest), nil
}

// begin starts an operation: the context check, the closed check and the
// operation timeout.
func (s *Store) begin(ctx context.Context, what string) (context.Context, context.CancelFunc, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if s.closed.Load() {
		return nil, nil, fmt.Errorf("%s: store closed: %w", what, management.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.OpTimeout)
	return ctx, cancel, nil
}

// unavailable wraps a server failure; the admin API answers 503.
func unavailable(what string, err error) error {
	return fmt.Errorf("%s: %w: %w", what, management.ErrUnavailable, err)
}

func checkName(kind, name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("invalid %s name of %d bytes", kind, len(name))
	}
	return nil
}

// inTx runs fn in one transaction.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// outbox appends one event in tx and notifies listeners at commit.
func outbox(ctx context.Context, tx pgx.Tx, at time.Time, topic, subject string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("encode outbox payload: %w", err)
	}
	var id int64
	if err := tx.QueryRow(ctx,
		`INSERT INTO management_outbox (at, topic, subject, payload) VALUES ($1, $2, $3, $4) RETURNING id`,
		at, topic, subject, b).Scan(&id); err != nil {
		return fmt.Errorf("write outbox: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, OutboxChannel, fmt.Sprint(id)); err != nil {
		return fmt.Errorf("notify outbox: %w", err)
	}
	return nil
}

// UpstreamEnabled implements management.Store.
func (s *Store) UpstreamEnabled(ctx context.Context, name string) (enabled, set bool, err error) {
	what := fmt.Sprintf("read upstream %q admin state", name)
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return false, false, err
	}
	defer cancel()
	err = s.pool.QueryRow(ctx, `SELECT enabled FROM upstream_admin WHERE name = $1`, name).Scan(&enabled)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, false, nil
	case err != nil:
		return false, false, unavailable(what, err)
	}
	return enabled, true, nil
}

// SetUpstreamEnabled implements management.Store.
func (s *Store) SetUpstreamEnabled(ctx context.Context, name string, enabled bool) error {
	what := fmt.Sprintf("write upstream %q admin state", name)
	if err := checkName("upstream", name); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return err
	}
	defer cancel()
	now := s.opts.Now()
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO upstream_admin (name, enabled, updated_at) VALUES ($1, $2, $3)
			ON CONFLICT (name) DO UPDATE SET enabled = EXCLUDED.enabled, updated_at = EXCLUDED.updated_at`,
			name, enabled, now); err != nil {
			return err
		}
		return outbox(ctx, tx, now, TopicUpstreamAdmin, name, map[string]any{"enabled": enabled})
	})
	if err != nil {
		return unavailable(what, err)
	}
	return nil
}

// Cursor implements management.Store.
func (s *Store) Cursor(ctx context.Context, name string) (routing.Cursor, error) {
	what := fmt.Sprintf("read routing %q cursor", name)
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return routing.Cursor{}, err
	}
	defer cancel()
	var c routing.Cursor
	err = s.pool.QueryRow(ctx, `SELECT idx, generation, exhausted FROM routing_cursors WHERE name = $1`, name).
		Scan(&c.Index, &c.Generation, &c.Exhausted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return routing.Cursor{}, nil
	case err != nil:
		return routing.Cursor{}, unavailable(what, err)
	}
	return c, nil
}

// CompareAndSetCursor implements management.Store. An absent cursor is
// generation 0. The write is one conditional statement: under READ
// COMMITTED a concurrent writer of the same row waits for the first one's
// commit and then re-evaluates the generation condition against the new
// row, so of concurrent switchers holding the same old generation exactly
// one wins. The outbox row is written in the same transaction.
func (s *Store) CompareAndSetCursor(ctx context.Context, name string, old, next routing.Cursor) (bool, error) {
	what := fmt.Sprintf("switch routing %q cursor", name)
	if err := checkName("routing", name); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if next.Generation <= old.Generation {
		return false, fmt.Errorf("%s: next generation %d must exceed %d", what, next.Generation, old.Generation)
	}
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return false, err
	}
	defer cancel()
	now := s.opts.Now()
	won := false
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var tag interface{ RowsAffected() int64 }
		var err error
		if old.Generation == 0 {
			tag, err = tx.Exec(ctx, `INSERT INTO routing_cursors (name, idx, generation, exhausted, updated_at)
				VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (name) DO UPDATE SET idx = EXCLUDED.idx, generation = EXCLUDED.generation,
					exhausted = EXCLUDED.exhausted, updated_at = EXCLUDED.updated_at
				WHERE routing_cursors.generation = 0`,
				name, next.Index, next.Generation, next.Exhausted, now)
		} else {
			tag, err = tx.Exec(ctx, `UPDATE routing_cursors SET idx = $2, generation = $3, exhausted = $4, updated_at = $5
				WHERE name = $1 AND generation = $6`,
				name, next.Index, next.Generation, next.Exhausted, now, old.Generation)
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return nil
		}
		won = true
		return outbox(ctx, tx, now, TopicRoutingCursor, name, map[string]any{
			"index": next.Index, "generation": next.Generation, "exhausted": next.Exhausted,
			"previousGeneration": old.Generation,
		})
	})
	if err != nil {
		return false, unavailable(what, err)
	}
	return won, nil
}

// AppendAudit implements management.Store. The store assigns e.ID; a zero
// At is stamped with the store clock. Retention trims the oldest entries in
// the same transaction.
func (s *Store) AppendAudit(ctx context.Context, e management.AuditEntry) error {
	const what = "append audit entry"
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return err
	}
	defer cancel()
	if e.At.IsZero() {
		e.At = s.opts.Now()
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO admin_audit (at, actor, action, target, result)
			VALUES ($1, $2, $3, $4, $5) RETURNING id`, e.At, e.Actor, e.Action, e.Target, e.Result).Scan(&id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM admin_audit WHERE id <= $1`, id-int64(s.opts.AuditRetention))
		return err
	})
	if err != nil {
		return unavailable(what, err)
	}
	return nil
}

func clampLimit(limit, retention int) int {
	if limit <= 0 || limit > retention {
		return retention
	}
	return limit
}

// ListAudit implements management.Store: newest first; limit <= 0 or
// beyond the retention returns the whole retained log.
func (s *Store) ListAudit(ctx context.Context, limit int) ([]management.AuditEntry, error) {
	const what = "list audit entries"
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return nil, err
	}
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT id, at, actor, action, target, result FROM admin_audit
		ORDER BY id DESC LIMIT $1`, clampLimit(limit, s.opts.AuditRetention))
	if err != nil {
		return nil, unavailable(what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (management.AuditEntry, error) {
		var e management.AuditEntry
		err := r.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Target, &e.Result)
		return e, err
	})
	if err != nil {
		return nil, unavailable(what, err)
	}
	if out == nil {
		out = []management.AuditEntry{}
	}
	return out, nil
}

// RecordRevision implements management.Store. The store assigns r.ID; the
// outbox announces the revision to the other controllers.
func (s *Store) RecordRevision(ctx context.Context, r management.Revision) error {
	const what = "record config revision"
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return err
	}
	defer cancel()
	if r.At.IsZero() {
		r.At = s.opts.Now()
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO config_revisions (at, fingerprint, source)
			VALUES ($1, $2, $3) RETURNING id`, r.At, r.Fingerprint, r.Source).Scan(&id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM config_revisions WHERE id <= $1`, id-int64(s.opts.RevisionRetention)); err != nil {
			return err
		}
		return outbox(ctx, tx, r.At, TopicConfigRevision, fmt.Sprint(id), map[string]any{
			"revision": id, "fingerprint": r.Fingerprint, "source": r.Source,
		})
	})
	if err != nil {
		return unavailable(what, err)
	}
	return nil
}

// ListRevisions returns the newest revisions first (storetest.RevisionLister).
func (s *Store) ListRevisions(ctx context.Context, limit int) ([]management.Revision, error) {
	const what = "list config revisions"
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return nil, err
	}
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT id, at, fingerprint, source FROM config_revisions
		ORDER BY id DESC LIMIT $1`, clampLimit(limit, s.opts.RevisionRetention))
	if err != nil {
		return nil, unavailable(what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (management.Revision, error) {
		var v management.Revision
		err := r.Scan(&v.ID, &v.At, &v.Fingerprint, &v.Source)
		return v, err
	})
	if err != nil {
		return nil, unavailable(what, err)
	}
	if out == nil {
		out = []management.Revision{}
	}
	return out, nil
}

// LatestRevision returns the newest revision; ok is false when none was
// recorded. Controllers compare its fingerprint with their own to detect a
// revision another replica published (seed 000 §14).
func (s *Store) LatestRevision(ctx context.Context) (r management.Revision, ok bool, err error) {
	revs, err := s.ListRevisions(ctx, 1)
	if err != nil || len(revs) == 0 {
		return management.Revision{}, false, err
	}
	return revs[0], true, nil
}

// OutboxEvent is one management change as written to the outbox.
type OutboxEvent struct {
	ID        int64
	At        time.Time
	Topic     string
	Subject   string
	Payload   json.RawMessage
	Published bool
}

// ReadOutbox returns up to limit events with id > after, oldest first
// (limit is clamped to MaxOutboxBatch).
func (s *Store) ReadOutbox(ctx context.Context, after int64, limit int) ([]OutboxEvent, error) {
	const what = "read management outbox"
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return nil, err
	}
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT id, at, topic, subject, payload, published_at IS NOT NULL
		FROM management_outbox WHERE id > $1 ORDER BY id LIMIT $2`, after, clampLimit(limit, MaxOutboxBatch))
	if err != nil {
		return nil, unavailable(what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxEvent, error) {
		var e OutboxEvent
		err := r.Scan(&e.ID, &e.At, &e.Topic, &e.Subject, &e.Payload, &e.Published)
		return e, err
	})
	if err != nil {
		return nil, unavailable(what, err)
	}
	return out, nil
}

// MarkPublished marks every event up to and including id as published and
// deletes published events older than keep.
func (s *Store) MarkPublished(ctx context.Context, upTo int64, keep time.Duration) error {
	const what = "mark management outbox published"
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return err
	}
	defer cancel()
	now := s.opts.Now()
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE management_outbox SET published_at = $2
			WHERE id <= $1 AND published_at IS NULL`, upTo, now); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM management_outbox WHERE published_at < $1`, now.Add(-keep))
		return err
	})
	if err != nil {
		return unavailable(what, err)
	}
	return nil
}

// Ping checks the server answers.
func (s *Store) Ping(ctx context.Context) error {
	const what = "ping management store"
	ctx, cancel, err := s.begin(ctx, what)
	if err != nil {
		return err
	}
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		return unavailable(what, err)
	}
	return nil
}

// Close implements management.Store; later calls return
// management.ErrUnavailable and Close itself is idempotent.
func (s *Store) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		s.pool.Close()
	}
	return nil
}

var _ management.Store = (*Store)(nil)
