package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgstore "github.com/proxypool/proxypool/engine/adapters/postgres"
	"github.com/proxypool/proxypool/engine/adapters/storetest"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/testenv"
)

var schemaSeq atomic.Int64

// newSchema creates a fresh schema on srv and returns a URL whose
// connections use it, so every test has its own tables.
func newSchema(t *testing.T, srv *testenv.Postgres) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t_%d_%d", time.Now().UnixNano()%1e9, schemaSeq.Add(1))
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(srv.URL(), "?") {
		sep = "&"
	}
	return srv.URL() + sep + "search_path=" + name
}

func open(t *testing.T, url string, o pgstore.Options) *pgstore.Store {
	t.Helper()
	s, err := pgstore.OpenWith(context.Background(), config.PG{URL: url}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestStore(t *testing.T) {
	srv := testenv.StartPostgres(t)

	t.Run("Contract", func(t *testing.T) {
		storetest.RunManagementContract(t, func(t *testing.T) management.Store {
			return open(t, newSchema(t, srv), pgstore.Options{MigrateOnStart: true})
		})
	})
	t.Run("Persistence", func(t *testing.T) {
		url := newSchema(t, srv)
		storetest.RunManagementPersistence(t, func(t *testing.T, _ string) management.Store {
			return open(t, url, pgstore.Options{MigrateOnStart: true})
		})
	})
	t.Run("SchemaHoldsNoProxyData", func(t *testing.T) { testSchemaHoldsNoProxyData(t, newSchema(t, srv)) })
	t.Run("Migrations", func(t *testing.T) { testMigrations(t, newSchema(t, srv)) })
	t.Run("SchemaBehindRefused", func(t *testing.T) { testSchemaBehind(t, newSchema(t, srv)) })
	t.Run("Outbox", func(t *testing.T) { testOutbox(t, newSchema(t, srv)) })
	t.Run("Retention", func(t *testing.T) { testRetention(t, newSchema(t, srv)) })
	t.Run("Fingerprint", func(t *testing.T) { testFingerprint(t, newSchema(t, srv)) })
}

// forbidden are column names that would mean proxy data reached
// PostgreSQL (seed 000 §10.2, §12.1).
var forbidden = regexp.MustCompile(`(?i)(host|port|addr|ip|username|user_name|password|passwd|credential|secret|proxy|extract|owner|lifecycle|expires|usable|ttl|state)`)

func testSchemaHoldsNoProxyData(t *testing.T, url string) {
	s := open(t, url, pgstore.Options{MigrateOnStart: true})
	rows, err := s.Pool().Query(context.Background(),
		`SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Table, Column string }])
	if err != nil {
		t.Fatal(err)
	}
	if len(cols) < 10 {
		t.Fatalf("schema has %d columns; migrations not applied?", len(cols))
	}
	for _, c := range cols {
		if c.Table == "goose_db_version" {
			continue
		}
		if forbidden.MatchString(c.Column) || forbidden.MatchString(c.Table) {
			t.Errorf("column %s.%s looks like proxy data, which must never be written to PostgreSQL", c.Table, c.Column)
		}
	}
}

func testMigrations(t *testing.T, url string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	m, err := pgstore.NewMigrator(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	version := func() int64 {
		t.Helper()
		cur, latest, err := m.Version(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if latest < 2 {
			t.Fatalf("binary knows %d migrations, want at least 2", latest)
		}
		return cur
	}
	tables := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables
			WHERE table_schema = current_schema() AND table_name <> 'goose_db_version'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if v := version(); v != 0 {
		t.Fatalf("fresh schema at version %d", v)
	}
	up, err := m.Up(ctx)
	if err != nil || len(up) < 2 || !up[0].Up || up[0].Version != 1 {
		t.Fatalf("up: %+v, %v", up, err)
	}
	_, latest, _ := m.Version(ctx)
	if v := version(); v != latest || tables() != 5 {
		t.Fatalf("after up: version %d tables %d", v, tables())
	}
	if again, err := m.Up(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second up applied %+v, %v", again, err)
	}
	st, err := m.Status(ctx)
	if err != nil || len(st) != int(latest) || !st[0].Applied || !strings.HasSuffix(st[0].Name, ".sql") {
		t.Fatalf("status %+v, %v", st, err)
	}
	down, err := m.Down(ctx, 1)
	if err != nil || len(down) != 1 || down[0].Up || down[0].Version != latest {
		t.Fatalf("down 1: %+v, %v", down, err)
	}
	if v := version(); v != latest-1 {
		t.Fatalf("after down 1: version %d", v)
	}
	// Down past the first migration stops at zero.
	if _, err := m.Down(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if v, n := version(), tables(); v != 0 || n != 0 {
		t.Fatalf("after down all: version %d, %d tables left", v, n)
	}
	if _, err := m.Down(ctx, 0); err == nil {
		t.Error("down 0 accepted")
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	s := open(t, url, pgstore.Options{})
	if err := s.SetUpstreamEnabled(ctx, "a", true); err != nil {
		t.Fatalf("store on a re-migrated schema: %v", err)
	}
}

func testSchemaBehind(t *testing.T, url string) {
	_, err := pgstore.OpenWith(context.Background(), config.PG{URL: url}, pgstore.Options{})
	var se *pgstore.SchemaError
	if !errors.As(err, &se) || se.Current != 0 || se.Latest < 1 {
		t.Fatalf("open on an empty schema without migrateOnStart: %v, want *SchemaError", err)
	}
	if !strings.Contains(err.Error(), "proxy-controller migrate up") {
		t.Errorf("error does not tell the operator what to do: %v", err)
	}
}

func testOutbox(t *testing.T, url string) {
	ctx := context.Background()
	s := open(t, url, pgstore.Options{MigrateOnStart: true})

	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+pgstore.OutboxChannel); err != nil {
		t.Fatal(err)
	}

	if err := s.SetUpstreamEnabled(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.CompareAndSetCursor(ctx, "seq", routing.Cursor{}, routing.Cursor{Index: 1, Generation: 1}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// A lost compare-and-set is no management change: no event.
	if ok, err := s.CompareAndSetCursor(ctx, "seq", routing.Cursor{}, routing.Cursor{Index: 2, Generation: 1}); ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := s.RecordRevision(ctx, management.Revision{Fingerprint: "fp", Source: "file"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendAudit(ctx, management.AuditEntry{Action: "upstream.disable"}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.ReadOutbox(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for _, e := range evs {
		topics = append(topics, e.Topic+":"+e.Subject)
	}
	want := []string{pgstore.TopicUpstreamAdmin + ":a", pgstore.TopicRoutingCursor + ":seq", pgstore.TopicConfigRevision + ":1"}
	if strings.Join(topics, ",") != strings.Join(want, ",") {
		t.Fatalf("outbox %v, want %v", topics, want)
	}
	if !strings.Contains(string(evs[1].Payload), `"generation": 1`) && !strings.Contains(string(evs[1].Payload), `"generation":1`) {
		t.Errorf("cursor event payload %s", evs[1].Payload)
	}
	// Every committed change notified.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i := range evs {
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("notification %d: %v", i, err)
		}
		if n.Payload != fmt.Sprint(evs[i].ID) {
			t.Errorf("notification %d payload %q, want %d", i, n.Payload, evs[i].ID)
		}
	}
	if err := s.MarkPublished(ctx, evs[1].ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	evs, err = s.ReadOutbox(ctx, 0, 10)
	if err != nil || len(evs) != 3 || !evs[0].Published || !evs[1].Published || evs[2].Published {
		t.Fatalf("after mark published %+v, %v", evs, err)
	}
	if err := s.MarkPublished(ctx, evs[2].ID, -time.Hour); err != nil {
		t.Fatal(err)
	}
	if evs, err := s.ReadOutbox(ctx, 0, 10); err != nil || len(evs) != 0 {
		t.Fatalf("published events past keep not deleted: %+v, %v", evs, err)
	}
}

func testRetention(t *testing.T, url string) {
	ctx := context.Background()
	s := open(t, url, pgstore.Options{MigrateOnStart: true, AuditRetention: 3, RevisionRetention: 2})
	for i := range 5 {
		if err := s.AppendAudit(ctx, management.AuditEntry{Action: fmt.Sprintf("a%d", i)}); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordRevision(ctx, management.Revision{Fingerprint: fmt.Sprintf("f%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM admin_audit`).Scan(&n); err != nil || n != 3 {
		t.Errorf("audit rows %d, %v; want 3", n, err)
	}
	revs, err := s.ListRevisions(ctx, 0)
	if err != nil || len(revs) != 2 || revs[0].Fingerprint != "f4" {
		t.Errorf("revisions %+v, %v", revs, err)
	}
	if r, ok, err := s.LatestRevision(ctx); err != nil || !ok || r.Fingerprint != "f4" {
		t.Errorf("latest %+v %v %v", r, ok, err)
	}
}

func testFingerprint(t *testing.T, url string) {
	cfg := &config.Config{Digest: "0123abcd"}
	a := pgstore.Fingerprint([]byte("k1"), cfg.Digest)
	if a != pgstore.Fingerprint([]byte("k1"), cfg.Digest) || !strings.HasPrefix(a, "hmac-sha256:") || len(a) != len("hmac-sha256:")+64 {
		t.Fatalf("fingerprint %q", a)
	}
	if a == pgstore.Fingerprint([]byte("k2"), cfg.Digest) || a == pgstore.Fingerprint([]byte("k1"), "0123abce") {
		t.Fatal("fingerprint ignores the key or the config")
	}
	s := open(t, url, pgstore.Options{MigrateOnStart: true, FingerprintKey: []byte("k1")})
	if got, err := s.Fingerprint(cfg); err != nil || got != a {
		t.Fatalf("store fingerprint %q, %v", got, err)
	}
	keyless := open(t, url, pgstore.Options{})
	if _, err := keyless.Fingerprint(cfg); !errors.Is(err, pgstore.ErrNoFingerprintKey) {
		t.Fatalf("keyless fingerprint: %v", err)
	}
}

// TestUnavailable stops the server under an open store: writes and reads
// fail promptly with management.ErrUnavailable, and work again once the
// server is back, with no reopen.
func TestUnavailable(t *testing.T) {
	srv := testenv.StartPostgres(t)
	url := newSchema(t, srv)
	ctx := context.Background()
	s := open(t, url, pgstore.Options{MigrateOnStart: true, OpTimeout: 2 * time.Second, ConnectTimeout: time.Second})
	if err := s.SetUpstreamEnabled(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	calls := map[string]func() error{
		"SetUpstreamEnabled": func() error { return s.SetUpstreamEnabled(ctx, "a", false) },
		"CompareAndSetCursor": func() error {
			_, err := s.CompareAndSetCursor(ctx, "r", routing.Cursor{}, routing.Cursor{Generation: 1})
			return err
		},
		"AppendAudit":     func() error { return s.AppendAudit(ctx, management.AuditEntry{Action: "x"}) },
		"RecordRevision":  func() error { return s.RecordRevision(ctx, management.Revision{Fingerprint: "x"}) },
		"UpstreamEnabled": func() error { _, _, err := s.UpstreamEnabled(ctx, "a"); return err },
	}
	for name, call := range calls {
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			if !errors.Is(err, management.ErrUnavailable) {
				t.Errorf("%s with the server down: %v, want ErrUnavailable", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s hangs with the server down", name)
		}
	}
	// Open itself reports the outage as ErrUnavailable.
	if _, err := pgstore.OpenWith(ctx, config.PG{URL: url}, pgstore.Options{ConnectTimeout: time.Second}); !errors.Is(err, management.ErrUnavailable) {
		t.Errorf("open with the server down: %v, want ErrUnavailable", err)
	}
	srv.Start()
	// The pool reconnects on its own; poll until the first write lands.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		err := s.SetUpstreamEnabled(ctx, "a", false)
		if err == nil {
			break
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("store did not recover after restart: %v", err)
		}
	}
	if enabled, set, err := s.UpstreamEnabled(ctx, "a"); err != nil || !set || enabled {
		t.Fatalf("after recovery: enabled=%v set=%v err=%v", enabled, set, err)
	}
}
