package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc64"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/migrations"
)

// Migration lock bounds: goose probes the advisory lock once a second.
const (
	migrateLockProbes   = 120 // seconds waiting for another migrator
	migrateUnlockProbes = 30
)

// Migrator applies the embedded migrations/ files with goose. The goose
// version table and the advisory lock are per schema (the connection's
// current_schema), so fleets sharing a server in separate schemas do not
// block each other.
type Migrator struct {
	db *sql.DB
	p  *goose.Provider
}

// Applied is one migration run.
type Applied struct {
	Version int64
	Name    string
	Up      bool
}

// Status is one migration's state.
type Status struct {
	Version int64
	Name    string
	Applied bool
}

// OpenMigrator connects with the storage.postgres section for the migrate
// command. Close releases the connections.
func OpenMigrator(ctx context.Context, c config.PG) (*Migrator, func(), error) {
	o := Options{}
	o.defaults()
	pc, err := poolConfig(c, o)
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, fmt.Errorf("open management store: %w", err)
	}
	m, err := NewMigrator(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return m, func() { _ = m.Close(); pool.Close() }, nil
}

// NewMigrator returns a migrator over pool; Close does not close pool.
func NewMigrator(ctx context.Context, pool *pgxpool.Pool) (*Migrator, error) {
	db := stdlib.OpenDBFromPool(pool)
	var schema string
	if err := db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		_ = db.Close()
		return nil, unavailable("open migrator", err)
	}
	// pg_advisory_lock takes a bigint; crc64 fits once reinterpreted.
	id := int64(crc64.Checksum([]byte("proxypool migrate "+schema), crc64.MakeTable(crc64.ECMA)))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(id),
		lock.WithLockTimeout(1, migrateLockProbes), lock.WithUnlockTimeout(1, migrateUnlockProbes))
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open migrator: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open migrator: %w", err)
	}
	return &Migrator{db: db, p: p}, nil
}

func wrapMigrate(what string, err error) error {
	var pe *goose.PartialError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return unavailable(what, err)
}

func applied(rs []*goose.MigrationResult) []Applied {
	out := make([]Applied, 0, len(rs))
	for _, r := range rs {
		out = append(out, Applied{Version: r.Source.Version, Name: baseName(r.Source.Path), Up: r.Direction == "up"})
	}
	return out
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// Up applies every pending migration.
func (m *Migrator) Up(ctx context.Context) ([]Applied, error) {
	rs, err := m.p.Up(ctx)
	if err != nil {
		return applied(rs), wrapMigrate("migrate up", err)
	}
	return applied(rs), nil
}

// Down rolls back the n newest applied migrations (n >= 1).
func (m *Migrator) Down(ctx context.Context, n int) ([]Applied, error) {
	if n < 1 {
		return nil, fmt.Errorf("migrate down: n must be at least 1, got %d", n)
	}
	var out []Applied
	for range n {
		r, err := m.p.Down(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			break
		}
		if err != nil {
			return out, wrapMigrate("migrate down", err)
		}
		out = append(out, applied([]*goose.MigrationResult{r})...)
	}
	return out, nil
}

// Status lists every known migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	ss, err := m.p.Status(ctx)
	if err != nil {
		return nil, unavailable("migration status", err)
	}
	out := make([]Status, 0, len(ss))
	for _, s := range ss {
		out = append(out, Status{Version: s.Source.Version, Name: baseName(s.Source.Path), Applied: s.State == goose.StateApplied})
	}
	return out, nil
}

// Version returns the schema's version and the newest this binary knows.
func (m *Migrator) Version(ctx context.Context) (current, latest int64, err error) {
	current, latest, err = m.p.GetVersions(ctx)
	if err != nil {
		return 0, 0, unavailable("read schema version", err)
	}
	return current, latest, nil
}

// Close releases the migrator's database handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }
