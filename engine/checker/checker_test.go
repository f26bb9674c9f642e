package checker

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

func proxyFor(t *testing.T, up *testenv.UpstreamProxy, user, pass string) proxy.Proxy {
	t.Helper()
	key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: up.Host(), Port: uint16(up.Port()), Username: user}
	return proxy.Proxy{ID: proxy.MakeID(key), Key: key, Password: pass, Upstream: "vendor-a"}
}

func TestBasicCheck(t *testing.T) {
	up, err := testenv.NewUpstreamProxy(testenv.UpstreamConfig{Username: "u", Password: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	// A probe target that accepts and holds connections: the CONNECT must
	// reach it for the proxy to answer 200.
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()

	cases := []struct {
		name       string
		probe      string
		taskProbe  string
		user, pass string
		fault      testenv.UpstreamFault
		timeout    time.Duration
		wantOK     bool
		wantPhase  Phase
		wantStatus int
	}{
		{name: "ok self probe", user: "u", pass: "secret", wantOK: true, wantStatus: 200},
		{name: "ok probe target", probe: target.Addr().String(), user: "u", pass: "secret", wantOK: true, wantStatus: 200},
		{name: "ok task probe target", taskProbe: target.Addr().String(), probe: "127.0.0.1:1", user: "u", pass: "secret", wantOK: true, wantStatus: 200},
		{name: "unreachable probe target", probe: "127.0.0.1:1", user: "u", pass: "secret", wantPhase: PhaseHandshake, wantStatus: 502},
		{name: "wrong password 407", user: "u", pass: "nope", wantPhase: PhaseHandshake, wantStatus: 407},
		{name: "no credentials 407", wantPhase: PhaseHandshake, wantStatus: 407},
		{name: "fault 407", user: "u", pass: "secret", fault: testenv.FaultHandshake407, wantPhase: PhaseHandshake, wantStatus: 407},
		{name: "fault 502", user: "u", pass: "secret", fault: testenv.FaultHandshake502, wantPhase: PhaseHandshake, wantStatus: 502},
		{name: "refused", user: "u", pass: "secret", fault: testenv.FaultRefuse, wantPhase: PhaseDial},
		{name: "slow times out", user: "u", pass: "secret", fault: testenv.FaultSlow, timeout: 200 * time.Millisecond, wantPhase: PhaseHandshake},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := up.SetFault(tc.fault); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = up.SetFault(testenv.FaultNone) })
			c := New(Options{ProbeTarget: tc.probe})
			obs := c.Check(context.Background(), Task{Proxy: proxyFor(t, up, tc.user, tc.pass), Timeout: tc.timeout, ProbeTarget: tc.taskProbe})
			if obs.Success != tc.wantOK || obs.Phase != tc.wantPhase || obs.Status != tc.wantStatus {
				t.Fatalf("obs = success %v phase %s status %d (%s); want %v %s %d", obs.Success, obs.Phase, obs.Status, obs.Err, tc.wantOK, tc.wantPhase, tc.wantStatus)
			}
			if obs.Level != LevelBasic || obs.ID == "" || obs.Upstream != "vendor-a" {
				t.Fatalf("observation not attributed: %+v", obs)
			}
			if tc.pass != "" && containsString(obs.Err, tc.pass) {
				t.Fatalf("observation error leaks the password: %q", obs.Err)
			}
		})
	}
}

func containsString(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestCheckUnsupportedScheme(t *testing.T) {
	p := proxy.Proxy{ID: "x", Key: proxy.Key{Scheme: proxy.SchemeSOCKS5, Host: "127.0.0.1", Port: 1}}
	obs := New(Options{}).Check(context.Background(), Task{Proxy: p})
	if obs.Success || obs.Phase != PhaseNone {
		t.Fatalf("socks5 check = %+v, want failure before dialling", obs)
	}
}

// gateExec is an Executor whose checks block until released, recording the
// order in which they started.
type gateExec struct {
	started chan proxy.ID
	release chan struct{}
}

func newGate() *gateExec {
	return &gateExec{started: make(chan proxy.ID, 100), release: make(chan struct{})}
}

func (g *gateExec) Check(ctx context.Context, t Task) Observation {
	g.started <- t.Proxy.ID
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	return Observation{ID: t.Proxy.ID, Level: LevelBasic, Success: true}
}

func task(id string, p Priority) Task {
	return Task{Proxy: proxy.Proxy{ID: proxy.ID(id)}, Priority: p}
}

func recv(t *testing.T, ch <-chan proxy.ID) proxy.ID {
	t.Helper()
	select {
	case id := <-ch:
		return id
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for a check to start")
		return ""
	}
}

func TestSchedulerPriorityOrder(t *testing.T) {
	g := newGate()
	reports := make(chan Observation, 10)
	s := NewScheduler(SchedulerOptions{Executor: g, MaxInFlight: 1, QueueSize: 10, Report: func(o Observation) { reports <- o }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	if err := s.Submit(task("blocker", PriorityNormal)); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, g.started); got != "blocker" {
		t.Fatalf("first check %s", got)
	}
	for _, tk := range []Task{task("recheck-1", PriorityNormal), task("recheck-2", PriorityNormal), task("new-1", PriorityHigh), task("suspect-1", PriorityHigh)} {
		if err := s.Submit(tk); err != nil {
			t.Fatal(err)
		}
	}
	// Coalesced: a proxy already queued is not queued twice.
	if err := s.Submit(task("recheck-1", PriorityNormal)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.QueuedHigh != 2 || st.QueuedNormal != 2 || st.InFlight != 1 {
		t.Fatalf("stats = %+v", st)
	}
	want := []proxy.ID{"new-1", "suspect-1", "recheck-1", "recheck-2"}
	for _, w := range want {
		g.release <- struct{}{}
		if got := recv(t, g.started); got != w {
			t.Fatalf("started %s, want %s", got, w)
		}
	}
	g.release <- struct{}{}
	for range 5 {
		select {
		case <-reports:
		case <-time.After(5 * time.Second):
			t.Fatal("missing report")
		}
	}
	if s.Pending("new-1") || s.PendingKey(Key{ID: "new-1", Level: LevelBasic}) {
		t.Fatal("a finished check is still pending")
	}
}

func TestSchedulerBounds(t *testing.T) {
	g := newGate()
	s := NewScheduler(SchedulerOptions{Executor: g, MaxInFlight: 1, QueueSize: 2})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := s.Submit(task("blocker", PriorityHigh)); err != nil {
		t.Fatal(err)
	}
	recv(t, g.started)

	steps := []struct {
		t       Task
		wantErr bool
	}{
		{task("n1", PriorityNormal), false},
		{task("n2", PriorityNormal), false},
		{task("n3", PriorityNormal), true}, // full: an ordinary recheck is dropped
		{task("h1", PriorityHigh), false},  // evicts n1
		{task("h2", PriorityHigh), false},  // evicts n2
		{task("h3", PriorityHigh), true},   // nothing to evict: refused, counted
	}
	for i, st := range steps {
		err := s.Submit(st.t)
		if (err != nil) != st.wantErr {
			t.Fatalf("step %d (%s): err = %v, want error %v", i, st.t.Proxy.ID, err, st.wantErr)
		}
		if err != nil && err != ErrQueueFull {
			t.Fatalf("step %d: err = %v, want ErrQueueFull", i, err)
		}
	}
	st := s.Stats()
	if st.QueuedHigh != 2 || st.QueuedNormal != 0 || st.Dropped != 3 || st.Refused != 1 {
		t.Fatalf("stats = %+v, want 2 high queued, 3 dropped, 1 refused", st)
	}
	for _, id := range []proxy.ID{"n1", "n2", "n3", "h3"} {
		if s.Pending(id) {
			t.Fatalf("%s is pending after being shed", id)
		}
	}
	for _, w := range []proxy.ID{"h1", "h2"} {
		g.release <- struct{}{}
		if got := recv(t, g.started); got != w {
			t.Fatalf("started %s, want %s", got, w)
		}
	}
	g.release <- struct{}{}
}

func TestSchedulerInFlightBound(t *testing.T) {
	g := newGate()
	s := NewScheduler(SchedulerOptions{Executor: g, MaxInFlight: 3, QueueSize: 100})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	for i := range 10 {
		if err := s.Submit(task("p"+strconv.Itoa(i), PriorityNormal)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		recv(t, g.started)
	}
	select {
	case id := <-g.started:
		t.Fatalf("a fourth check (%s) started with maxInFlight 3", id)
	default:
	}
	if st := s.Stats(); st.InFlight != 3 || st.QueuedNormal != 7 {
		t.Fatalf("stats = %+v", st)
	}
	cancel()
	<-done // running checks see the cancellation and Run waits for them
}

func TestSchedulerReloadsInFlightLimit(t *testing.T) {
	g := newGate()
	s := NewScheduler(SchedulerOptions{Executor: g, MaxInFlight: 1, QueueSize: 100})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for i := range 6 {
		if err := s.Submit(task("p"+strconv.Itoa(i), PriorityNormal)); err != nil {
			t.Fatal(err)
		}
	}
	recv(t, g.started)
	s.SetMaxInFlight(3) // raised: two more start at once
	recv(t, g.started)
	recv(t, g.started)
	if st := s.Stats(); st.InFlight != 3 || st.MaxInFlight != 3 {
		t.Fatalf("stats = %+v", st)
	}
	// Lowered: running checks finish, nothing new starts until below it.
	s.SetMaxInFlight(1)
	g.release <- struct{}{}
	g.release <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().InFlight != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("stats = %+v, want the two released checks finished", s.Stats())
		}
		runtime.Gosched()
	}
	// With one running and a limit of one, nothing may have started.
	select {
	case id := <-g.started:
		t.Fatalf("%s started with 1 running and a limit of 1", id)
	default:
	}
	g.release <- struct{}{}
	recv(t, g.started)
	if st := s.Stats(); st.InFlight != 1 {
		t.Fatalf("in flight %d after lowering the limit to 1", st.InFlight)
	}
	for range 3 {
		g.release <- struct{}{}
	}
}

func TestSchedulerCoalescesPerLevelAndRouting(t *testing.T) {
	s := NewScheduler(SchedulerOptions{Executor: newGate(), QueueSize: 10})
	p := proxy.Proxy{ID: "p"}
	for _, tk := range []Task{
		{Proxy: p}, {Proxy: p, Level: LevelBasic}, // the same key
		{Proxy: p, Level: LevelEgress},
		{Proxy: p, Level: LevelTarget, Routing: "a"}, {Proxy: p, Level: LevelTarget, Routing: "b"},
		{Proxy: p, Level: LevelTarget, Routing: "a"},
	} {
		if err := s.Submit(tk); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.QueuedNormal != 4 {
		t.Fatalf("queued %d, want 4 (basic, egress, target a, target b)", st.QueuedNormal)
	}
	if !s.PendingKey(Key{ID: "p", Level: LevelTarget, Routing: "b"}) || s.PendingKey(Key{ID: "p", Level: LevelTarget, Routing: "c"}) || !s.Pending("p") {
		t.Fatal("pending keys wrong")
	}
	if (Stats{QueuedHigh: 1, QueueSize: 10}).Backlogged() != true || (Stats{QueuedNormal: 4, QueueSize: 10}).Backlogged() || !(Stats{QueuedNormal: 5, QueueSize: 10}).Backlogged() {
		t.Fatal("Backlogged thresholds wrong")
	}
}

// fastExec is an Executor whose checks finish at once, reporting starts.
type fastExec struct{ started chan proxy.ID }

func (f *fastExec) Check(_ context.Context, t Task) Observation {
	f.started <- t.Proxy.ID
	return Observation{ID: t.Proxy.ID, Level: LevelBasic, Success: true}
}

// With maxPerSecond the scheduler starts checks at that pace, on its own
// clock (a burst of a twentieth of a second at once); a reload lifts it.
func TestSchedulerMaxPerSecond(t *testing.T) {
	var now atomic.Int64 // nanoseconds since t0
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return t0.Add(time.Duration(now.Load())) }
	ex := &fastExec{started: make(chan proxy.ID, 100)}
	s := NewScheduler(SchedulerOptions{Executor: ex, MaxInFlight: 64, QueueSize: 100, MaxPerSecond: 40, Now: clock})
	var rested atomic.Int64
	s.rest = func(_ context.Context, d time.Duration, _ <-chan struct{}) restEnd {
		rested.Add(int64(d))
		now.Add(int64(d))
		return restDone
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	const n = 22
	for i := range n {
		if err := s.Submit(task("p"+strconv.Itoa(i), PriorityHigh)); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		recv(t, ex.started)
	}
	// 40/s with a burst of 2: the first two at once, then one every 25 ms.
	if got, want := time.Duration(rested.Load()), (n-2)*25*time.Millisecond; got != want {
		t.Errorf("rested %v before %d checks at 40/s, want %v", got, n, want)
	}

	s.SetMaxPerSecond(0)
	before := rested.Load()
	for i := range n {
		if err := s.Submit(task("q"+strconv.Itoa(i), PriorityHigh)); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		recv(t, ex.started)
	}
	if d := rested.Load() - before; d != 0 {
		t.Errorf("rested %v with no bound", time.Duration(d))
	}
}

// A reload lifting the bound frees a start that was waiting at the old
// rate at once, not after the old delay.
func TestSchedulerReloadWakesPacedStart(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ex := &fastExec{started: make(chan proxy.ID, 10)}
	// One check per ~11 days: the second start waits on a real timer far
	// longer than the test's bound unless the reload wakes it.
	s := NewScheduler(SchedulerOptions{Executor: ex, MaxInFlight: 4, QueueSize: 10, MaxPerSecond: 1e-6, Now: func() time.Time { return t0 }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for _, id := range []string{"first", "second"} {
		if err := s.Submit(task(id, PriorityHigh)); err != nil {
			t.Fatal(err)
		}
	}
	if got := recv(t, ex.started); got != "first" {
		t.Fatalf("first start %s", got)
	}
	s.SetMaxPerSecond(0)
	if got := recv(t, ex.started); got != "second" {
		t.Fatalf("second start %s", got)
	}
}
