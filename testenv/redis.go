package testenv

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// RedisURLEnv names an external Redis to use instead of starting one.
const RedisURLEnv = "PROXYPOOL_TEST_REDIS_URL"

const redisReadyTimeout = 10 * time.Second

// Redis is a throw-away redis-server child process (or an external server
// named by RedisURLEnv). It keeps no data on disk, so a restart empties it.
type Redis struct {
	t        testing.TB
	external bool
	url      string
	addr     string

	bin  string
	dir  string
	port int

	mu   sync.Mutex
	proc *process
}

// StartRedis starts redis-server on a free 127.0.0.1 port and stops it when
// the test ends. Without redis-server on PATH the test is skipped, or failed
// when CI=true.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	if u := os.Getenv(RedisURLEnv); u != "" {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatalf("testenv: parsing %s: %v", RedisURLEnv, err)
		}
		return &Redis{t: t, external: true, url: u, addr: parsed.Host}
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missingBinary(t, "testenv: redis-server not found on PATH; install it (apt-get install redis-server) or set "+RedisURLEnv)
		return nil
	}
	r := &Redis{t: t, bin: bin, dir: t.TempDir()}
	// A free port can be taken by someone else before redis binds it, so a
	// failed first start is retried on a fresh port.
	for attempt := 1; ; attempt++ {
		if r.port, err = FreePort(); err == nil {
			r.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
			if err = r.start(); err == nil {
				break
			}
		}
		if attempt == 3 {
			t.Fatalf("testenv: starting redis: %v", err)
		}
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("testenv: stopping redis: %v", err)
		}
	})
	return r
}

// URL returns the redis:// URL of database 0.
func (r *Redis) URL() string {
	if r.external {
		return r.url
	}
	return "redis://" + r.addr + "/0"
}

// Addr returns host:port.
func (r *Redis) Addr() string { return r.addr }

// Stop kills the server and returns once it has exited and its port is free.
func (r *Redis) Stop() {
	r.t.Helper()
	r.refuseExternal("Stop")
	if err := r.stop(); err != nil {
		r.t.Fatalf("testenv: stopping redis: %v", err)
	}
}

// Start starts the server again on the same port, empty.
func (r *Redis) Start() {
	r.t.Helper()
	r.refuseExternal("Start")
	if err := r.start(); err != nil {
		r.t.Fatalf("testenv: starting redis: %v", err)
	}
}

// Restart is Stop followed by Start.
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	r.Start()
}

func (r *Redis) refuseExternal(op string) {
	r.t.Helper()
	if r.external {
		r.t.Skipf("testenv: redis.%s: restart is unsupported for the external server set by %s", op, RedisURLEnv)
	}
}

func (r *Redis) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		return nil
	}
	cmd := exec.Command(r.bin,
		"--save", "", "--appendonly", "no",
		"--bind", "127.0.0.1", "--port", strconv.Itoa(r.port), "--dir", r.dir)
	p, err := startProcess(cmd, nil)
	if err != nil {
		return err
	}
	if err := p.waitReady(redisReadyTimeout, func() error { return redisPing(r.addr) }); err != nil {
		_ = p.stop(os.Kill, 0)
		return fmt.Errorf("waiting for redis-server on %s: %w\n%s", r.addr, err, p.logs)
	}
	r.proc = p
	return nil
}

func (r *Redis) stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return nil
	}
	// Kill rather than SHUTDOWN: Redis keeps nothing anyway and a crash is
	// the harsher, more useful thing to test against.
	if err := r.proc.stop(os.Kill, 0); err != nil {
		return err
	}
	r.proc = nil
	return waitPortFree(r.port, 5*time.Second)
}

// redisPing speaks just enough RESP to know the server accepts commands,
// keeping this file independent of any client library.
func redisPing(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return fmt.Errorf("sending PING: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading PING reply: %w", err)
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected PING reply %q", strings.TrimSpace(line))
	}
	return nil
}
