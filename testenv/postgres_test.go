package testenv

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func pgConnect(t *testing.T, url string) (*pgx.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		t.Cleanup(func() { conn.Close(context.Background()) })
	}
	return conn, err
}

func TestPostgresDataSurvivesRestart(t *testing.T) {
	pg := StartPostgres(t)
	if !strings.HasSuffix(pg.URL(), "/proxypool_test?sslmode=disable") {
		t.Fatalf("URL = %s", pg.URL())
	}
	ctx := context.Background()
	conn, err := pgConnect(t, pg.URL())
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kv (k text PRIMARY KEY, v text)"); err != nil {
		t.Fatalf("creating table: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO kv VALUES ('a', 'b')"); err != nil {
		t.Fatalf("inserting: %v", err)
	}

	pg.Stop()
	if _, err := pgConnect(t, pg.URL()); err == nil {
		t.Fatal("connected while stopped")
	}
	pg.Start()
	pg.Restart()

	conn, err = pgConnect(t, pg.URL())
	if err != nil {
		t.Fatalf("connecting after restart: %v", err)
	}
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM kv WHERE k = 'a'").Scan(&v); err != nil || v != "b" {
		t.Fatalf("reading after restart: v=%q err=%v", v, err)
	}
}

func TestPostgresMissingBinary(t *testing.T) {
	t.Setenv(PostgresURLEnv, "")
	t.Setenv("PATH", t.TempDir())
	old := postgresSearchGlob
	postgresSearchGlob = filepath.Join(t.TempDir(), "*", "bin")
	t.Cleanup(func() { postgresSearchGlob = old })
	for ci, want := range map[string]string{"true": "fatal", "": "skip"} {
		t.Setenv("CI", ci)
		f := runFake(t, func(tb testing.TB) { StartPostgres(tb) })
		if f.outcome != want || !strings.Contains(f.msg, "initdb") || !strings.Contains(f.msg, "apt-get install postgresql") {
			t.Errorf("CI=%q: got %s %q, want %s naming the binaries and how to install them", ci, f.outcome, f.msg, want)
		}
	}
}

func TestPostgresExternalRefusesRestart(t *testing.T) {
	const url = "postgres://x@127.0.0.1:1/db?sslmode=disable"
	t.Setenv(PostgresURLEnv, url)
	var pg *Postgres
	f := runFake(t, func(tb testing.TB) {
		pg = StartPostgres(tb)
		pg.Stop()
	})
	if pg == nil || pg.URL() != url {
		t.Fatalf("external postgres not used: %+v", pg)
	}
	if f.outcome != "skip" || !strings.Contains(f.msg, "unsupported") {
		t.Fatalf("got %s %q, want skip saying restart is unsupported", f.outcome, f.msg)
	}
}

func TestVersionLess(t *testing.T) {
	if !versionLess("9.6", "15") || versionLess("15", "9.6") || !versionLess("15", "16") {
		t.Fatal("versionLess orders versions wrongly")
	}
}
