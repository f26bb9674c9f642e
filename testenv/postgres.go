package testenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresURLEnv names an external PostgreSQL to use instead of starting one.
const PostgresURLEnv = "PROXYPOOL_TEST_POSTGRES_URL"

// PostgresDatabase is the database StartPostgres creates for the tests.
const PostgresDatabase = "proxypool_test"

const (
	postgresReadyTimeout = 30 * time.Second
	postgresInitTimeout  = 2 * time.Minute
	postgresStopGrace    = 30 * time.Second
)

// postgresSearchGlob is where Debian-style installs keep the server binaries,
// which are usually not on PATH. A variable so tests can hide them.
var postgresSearchGlob = "/usr/lib/postgresql/*/bin"

// Postgres is a throw-away PostgreSQL cluster run as a child process (or an
// external server named by PostgresURLEnv). Its data directory survives
// Stop/Start, so restarts keep data.
type Postgres struct {
	t        testing.TB
	external bool
	url      string

	initdb   string
	postgres string
	as       *runAs // nil unless we are root
	base     string // removed on cleanup; holds data and sock
	data     string
	sock     string
	port     int

	mu   sync.Mutex
	proc *process
}

// StartPostgres initialises a cluster in a fresh directory, starts it on a
// free 127.0.0.1 port, creates PostgresDatabase and tears everything down when
// the test ends. Without the server binaries the test is skipped, or failed
// when CI=true. Because PostgreSQL refuses to run as root, a root test process
// runs it as the "postgres" system user.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	if u := os.Getenv(PostgresURLEnv); u != "" {
		return &Postgres{t: t, external: true, url: u}
	}
	initdb, postgres, err := findPostgresBinaries()
	if err != nil {
		missingBinary(t, fmt.Sprintf("testenv: %v; install PostgreSQL (apt-get install postgresql) or set %s", err, PostgresURLEnv))
		return nil
	}
	p := &Postgres{t: t, initdb: initdb, postgres: postgres}
	if os.Geteuid() == 0 {
		if p.as, err = lookupRunAs("postgres"); err != nil {
			t.Fatalf("testenv: PostgreSQL refuses to run as root and tests run as root, so a system user %q is needed (apt-get install postgresql creates it): %v", "postgres", err)
		}
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("testenv: stopping postgres: %v", err)
		}
		if p.base == "" {
			return
		}
		if err := os.RemoveAll(p.base); err != nil {
			t.Errorf("testenv: removing postgres dir: %v", err)
		}
	})
	if err := p.makeDirs(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := p.initCluster(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// Retry on a fresh port in case the free one was taken before we bound it.
	for attempt := 1; ; attempt++ {
		if p.port, err = FreePort(); err == nil {
			if err = p.start(); err == nil {
				break
			}
		}
		if attempt == 3 {
			t.Fatalf("testenv: starting postgres: %v", err)
		}
	}
	if err := p.createDatabase(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return p
}

// URL returns the connection URL of PostgresDatabase.
func (p *Postgres) URL() string {
	if p.external {
		return p.url
	}
	return p.urlFor(PostgresDatabase)
}

// Stop shuts the server down (fast shutdown) and waits for it to exit.
func (p *Postgres) Stop() {
	p.t.Helper()
	p.refuseExternal("Stop")
	if err := p.stop(); err != nil {
		p.t.Fatalf("testenv: stopping postgres: %v", err)
	}
}

// Start starts the server again on the same port with the same data.
func (p *Postgres) Start() {
	p.t.Helper()
	p.refuseExternal("Start")
	if err := p.start(); err != nil {
		p.t.Fatalf("testenv: starting postgres: %v", err)
	}
}

// Restart is Stop followed by Start.
func (p *Postgres) Restart() {
	p.t.Helper()
	p.Stop()
	p.Start()
}

func (p *Postgres) refuseExternal(op string) {
	p.t.Helper()
	if p.external {
		p.t.Skipf("testenv: postgres.%s: restart is unsupported for the external server set by %s", op, PostgresURLEnv)
	}
}

func (p *Postgres) urlFor(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// makeDirs creates our own directory under os.TempDir rather than using
// t.TempDir: the postgres user cannot traverse t.TempDir's parents.
func (p *Postgres) makeDirs() error {
	base, err := os.MkdirTemp("", "proxypool-pg-")
	if err != nil {
		return fmt.Errorf("creating postgres dir: %w", err)
	}
	p.base = base
	p.data = filepath.Join(base, "data")
	p.sock = filepath.Join(base, "sock")
	for _, dir := range []string{p.data, p.sock} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("creating postgres dir: %w", err)
		}
	}
	if p.as == nil {
		return nil
	}
	err = filepath.WalkDir(base, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(p.as.uid), int(p.as.gid))
	})
	if err != nil {
		return fmt.Errorf("handing postgres dir to the postgres user: %w", err)
	}
	return nil
}

func (p *Postgres) initCluster() error {
	ctx, cancel := context.WithTimeout(context.Background(), postgresInitTimeout)
	defer cancel()
	// --no-locale keeps initdb independent of which locales the machine has.
	cmd := exec.CommandContext(ctx, p.initdb, "-D", p.data,
		"-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--no-locale")
	cmd.Dir = p.base // the postgres user may not be able to read our cwd
	proc, err := startProcess(cmd, p.as)
	if err != nil {
		return fmt.Errorf("running initdb: %w", err)
	}
	<-proc.done
	if proc.err != nil {
		return fmt.Errorf("running initdb: %w\n%s", proc.err, proc.logs)
	}
	return nil
}

func (p *Postgres) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		return nil
	}
	cmd := exec.Command(p.postgres, "-D", p.data, "-p", strconv.Itoa(p.port), "-k", p.sock,
		"-c", "listen_addresses=127.0.0.1",
		// Durability is pointless for throw-away data and costs seconds.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	cmd.Dir = p.base
	proc, err := startProcess(cmd, p.as)
	if err != nil {
		return err
	}
	// Probe the always-present "postgres" database: ours may not exist yet.
	probe := p.urlFor("postgres")
	err = proc.waitReady(postgresReadyTimeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, probe)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
	if err != nil {
		_ = proc.stop(os.Kill, 0)
		return fmt.Errorf("waiting for postgres on port %d: %w\n%s", p.port, err, proc.logs)
	}
	p.proc = proc
	return nil
}

func (p *Postgres) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return nil
	}
	// SIGINT is PostgreSQL's "fast shutdown": abort sessions, checkpoint, exit.
	if err := p.proc.stop(os.Interrupt, postgresStopGrace); err != nil {
		return err
	}
	p.proc = nil
	return waitPortFree(p.port, 5*time.Second)
}

func (p *Postgres) createDatabase() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.urlFor("postgres"))
	if err != nil {
		return fmt.Errorf("connecting to create %s: %w", PostgresDatabase, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+PostgresDatabase); err != nil {
		return fmt.Errorf("creating database %s: %w", PostgresDatabase, err)
	}
	return nil
}

// findPostgresBinaries prefers PATH, then the newest version-specific
// directory matching postgresSearchGlob. Both binaries come from one place so
// initdb and the server never disagree about the data format.
func findPostgresBinaries() (initdb, postgres string, err error) {
	if i, err := exec.LookPath("initdb"); err == nil {
		if s, err := exec.LookPath("postgres"); err == nil {
			return i, s, nil
		}
	}
	dirs, _ := filepath.Glob(postgresSearchGlob)
	sort.Slice(dirs, func(a, b int) bool {
		return versionLess(filepath.Base(filepath.Dir(dirs[b])), filepath.Base(filepath.Dir(dirs[a])))
	})
	for _, dir := range dirs {
		i, s := filepath.Join(dir, "initdb"), filepath.Join(dir, "postgres")
		if isExecutable(i) && isExecutable(s) {
			return i, s, nil
		}
	}
	return "", "", errors.New("initdb and postgres not found on PATH or under " + postgresSearchGlob)
}

// versionLess compares dotted numeric versions ("9.6" < "15").
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

func lookupRunAs(name string) (*runAs, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("looking up user %q: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing uid of %q: %w", name, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing gid of %q: %w", name, err)
	}
	return &runAs{uid: uint32(uid), gid: uint32(gid)}, nil
}
