package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/proxypool/proxypool/testenv"
)

func TestMigrateCommand(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA cmdtest"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	url := srv.URL()
	if strings.Contains(url, "?") {
		url += "&search_path=cmdtest"
	} else {
		url += "?search_path=cmdtest"
	}
	t.Setenv("TEST_FINGERPRINT_KEY", "k")
	cfg := filepath.Join(t.TempDir(), "proxypool.yaml")
	yaml := fmt.Sprintf(`listeners: {admin: "127.0.0.1:8082"}
storage:
  mode: cluster
  redis: {url: "redis://127.0.0.1:1/0"}
  postgres: {url: %q, fingerprintKey: "env:TEST_FINGERPRINT_KEY"}
`, url)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := runCLI(ctx, args, &out, &errb)
		return code, out.String(), errb.String()
	}
	steps := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"StatusFresh", []string{"migrate", "--config", cfg, "status"}, 0, []string{"00001 pending", "00002 pending"}},
		{"Up", []string{"migrate", "--config", cfg, "up"}, 0, []string{"applied 00001", "applied 00002", "schema version 2"}},
		{"UpAgain", []string{"migrate", "--config", cfg}, 0, []string{"nothing to do"}},
		{"Down1", []string{"migrate", "--config", cfg, "down", "1"}, 0, []string{"rolled back 00002", "schema version 1"}},
		{"Status", []string{"migrate", "--config", cfg, "status"}, 0, []string{"00001 applied", "00002 pending"}},
		{"BadDown", []string{"migrate", "--config", cfg, "down", "x"}, 2, nil},
		{"Unknown", []string{"serve"}, 2, nil},
		{"MissingConfig", []string{"migrate", "--config", filepath.Join(t.TempDir(), "none.yaml"), "up"}, 1, nil},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			code, out, errOut := cli(s.args...)
			if code != s.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, s.code, out, errOut)
			}
			for _, w := range s.want {
				if !strings.Contains(strings.Join(strings.Fields(out), " "), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
