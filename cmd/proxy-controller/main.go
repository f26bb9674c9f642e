// Command proxy-controller is the fleet's control plane (SPEC §3). For now
// it carries only the schema migration of the PostgreSQL management store:
//
//	proxy-controller migrate --config FILE [up | down N | status]
//
// up (the default) applies every pending migration, down N rolls back the
// N newest, status lists them. The migrations are embedded in the binary
// (migrations/); concurrent runs against one schema are serialised by an
// advisory lock.
//
// This package is wiring only: flags, config, construction, Run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	pgstore "github.com/proxypool/proxypool/engine/adapters/postgres"
	"github.com/proxypool/proxypool/engine/config"
)

const defaultConfigPath = "/etc/proxypool/proxypool.yaml"

// migrateTimeout bounds one migrate command, lock wait included.
const migrateTimeout = 10 * time.Minute

const usage = `usage:
  proxy-controller migrate [--config FILE] [up | down N | status]
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(runCLI(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func runCLI(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "migrate" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", defaultConfigPath, "configuration file")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	op, n, err := parseOp(fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "proxy-controller migrate: %v\n%s", err, usage)
		return 2
	}
	if err := migrate(ctx, *path, op, n, stdout); err != nil {
		fmt.Fprintln(stderr, "proxy-controller migrate:", err)
		return 1
	}
	return 0
}

func parseOp(args []string) (op string, n int, err error) {
	switch {
	case len(args) == 0:
		return "up", 0, nil
	case len(args) == 1 && (args[0] == "up" || args[0] == "status"):
		return args[0], 0, nil
	case len(args) == 2 && args[0] == "down":
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 {
			return "", 0, fmt.Errorf("down needs a count of at least 1, got %q", args[1])
		}
		return "down", n, nil
	}
	return "", 0, fmt.Errorf("unknown arguments %q", args)
}

func migrate(ctx context.Context, path, op string, n int, out io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	if cfg.Storage.Postgres.URL == "" {
		return fmt.Errorf("%s: storage.postgres.url is not set (migrations are for storage.mode cluster)", path)
	}
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	m, closeFn, err := pgstore.OpenMigrator(ctx, cfg.Storage.Postgres)
	if err != nil {
		return err
	}
	defer closeFn()
	switch op {
	case "up", "down":
		var res []pgstore.Applied
		if op == "up" {
			res, err = m.Up(ctx)
		} else {
			res, err = m.Down(ctx, n)
		}
		for _, r := range res {
			verb := "applied"
			if !r.Up {
				verb = "rolled back"
			}
			fmt.Fprintf(out, "%s %05d %s\n", verb, r.Version, r.Name)
		}
		if err != nil {
			return err
		}
		if len(res) == 0 {
			fmt.Fprintln(out, "nothing to do")
		}
		cur, latest, err := m.Version(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "schema version %d (this binary knows %d)\n", cur, latest)
	case "status":
		st, err := m.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			state := "pending"
			if s.Applied {
				state = "applied"
			}
			fmt.Fprintf(out, "%05d %-8s %s\n", s.Version, state, s.Name)
		}
	}
	return nil
}
