package suite

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/bench/loadgen"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP proxypool_provider_fetch_total Provider calls.
# TYPE proxypool_provider_fetch_total counter
proxypool_provider_fetch_total{outcome="error",upstream="bench"} 4
proxypool_provider_fetch_total{outcome="success",upstream="bench"} 21
proxypool_provider_fetch_total{outcome="error",upstream="other"} 1
proxypool_distribution_publish_duration_seconds_sum 1.5
proxypool_distribution_publish_duration_seconds_count 30
garbage line
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"by label", "proxypool_provider_fetch_total", []string{`outcome="error"`}, 5},
		{"two labels", "proxypool_provider_fetch_total", []string{`outcome="error"`, `upstream="bench"`}, 4},
		{"all", "proxypool_provider_fetch_total", nil, 26},
		{"no labels", "proxypool_distribution_publish_duration_seconds_count", nil, 30},
		{"prefix is not a match", "proxypool_distribution_publish_duration_seconds", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sumMetric(m, tt.metric, tt.labels...); got != tt.want {
				t.Fatalf("sumMetric = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseTop(t *testing.T) {
	out := `File: proxypool-pprof
Type: cpu
Showing nodes accounting for 9.50s, 95.00% of 10s total
      flat  flat%   sum%        cum   cum%
     2.10s 21.00% 21.00%      2.10s 21.00%  internal/runtime/syscall.Syscall6
     1.00s 10.00% 31.00%      3.00s 30.00%  net/http.(*conn).serve
     0.50s  5.00% 36.00%      0.70s  7.00%  github.com/proxypool/proxypool/engine/gateway/dispatch.(*Dispatcher).Acquire
`
	got := parseTop([]byte(out), 2)
	if len(got) != 2 || got[0].fn != "internal/runtime/syscall.Syscall6" || got[0].flat != 21 || got[1].cum != 30 {
		t.Fatalf("parseTop = %+v", got)
	}
}

func TestSustainedAndMedian(t *testing.T) {
	res := func(tput, p99 float64, unsent, errs int64) *loadgen.Result {
		return &loadgen.Result{Throughput: tput, Latency: loadgen.Quantiles{P99: p99},
			Operations: 10_000 + unsent + errs,
			Classes:    map[loadgen.Class]int64{loadgen.ClassOK: 10_000, loadgen.ClassUnsent: unsent, loadgen.ClassTimeout: errs}}
	}
	tests := []struct {
		name string
		r    *loadgen.Result
		want bool
	}{
		{"kept up", res(990, 20, 0, 0), true},
		{"too slow", res(900, 20, 0, 0), false},
		{"unsent work", res(1000, 20, 3, 0), false},
		{"errors", res(1000, 20, 0, 50), false},
		{"p99 over the bound", res(1000, 60, 0, 0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sustained(tt.r, 1000, 50*time.Millisecond); got != tt.want {
				t.Fatalf("sustained = %v, want %v", got, tt.want)
			}
		})
	}
	rs := []*loadgen.Result{res(3, 0, 0, 0), res(1, 0, 0, 0), res(2, 0, 0, 0), res(10, 0, 0, 0)}
	tp := func(r *loadgen.Result) float64 { return r.Throughput }
	if got := median(rs, tp); got != 2.5 {
		t.Errorf("median of 4 = %v, want 2.5", got)
	}
	if got := median(rs[:3], tp); got != 2 {
		t.Errorf("median of 3 = %v, want 2", got)
	}
	if got := median(nil, tp); got != 0 {
		t.Errorf("median of none = %v", got)
	}
}

func TestPeerConfigs(t *testing.T) {
	var b bytes.Buffer
	err := squidConfig.Execute(&b, map[string]any{"Addr": "127.0.0.1:3128", "Dir": "/tmp/s",
		"Parents": []hostPort{{"127.0.0.1", 4001}, {"127.0.0.1", 4002}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"http_port 127.0.0.1:3128", "cache deny all", "never_direct allow all",
		"cache_peer 127.0.0.1 parent 4001 0 no-query no-digest no-netdb-exchange round-robin name=up0",
		"cache_peer 127.0.0.1 parent 4002 0", "dns_nameservers 127.0.0.1",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("squid.conf lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	err = tinyproxyConfig.Execute(&b, map[string]any{"User": "nobody", "Group": "nogroup", "Host": "127.0.0.1", "Port": 8888, "Dir": "/tmp/t", "Upstream": "127.0.0.1:4001"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Port 8888", "Listen 127.0.0.1", "Upstream http 127.0.0.1:4001"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("tinyproxy.conf lacks %q:\n%s", want, b.String())
		}
	}
}

func TestFreePortsDistinct(t *testing.T) {
	ps, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range ps {
		if seen[p] || !strings.HasPrefix(p, "127.0.0.1:") {
			t.Fatalf("ports %v: duplicate or not loopback", ps)
		}
		seen[p] = true
	}
}

func TestProcsStopByPID(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep binary")
	}
	var log bytes.Buffer
	ps := NewProcs(t.TempDir(), &log)
	a, err := ps.Start("a", []string{"sleep", "60"}, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ps.Start("b", []string{"sleep", "60"}, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ps.Stop(a)
	if !a.Exited() || b.Exited() {
		t.Fatalf("after Stop(a): a exited %v, b exited %v", a.Exited(), b.Exited())
	}
	ps.StopAll()
	if !b.Exited() {
		t.Fatal("StopAll left b running")
	}
	if err := b.Wait(context.Background()); err == nil {
		t.Error("a process stopped by SIGTERM should report it")
	}
	for _, want := range []string{"started a pid", "stopped a pid", "stopped b pid"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
}

func TestFirstLine(t *testing.T) {
	ps := NewProcs(t.TempDir(), &bytes.Buffer{})
	defer ps.StopAll()
	p, line, err := ps.firstLine("echo", []string{"sh", "-c", `echo '{"pid":1}'; exec sleep 60`}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(line)) != `{"pid":1}` || p.Exited() {
		t.Fatalf("line %q exited %v", line, p.Exited())
	}
	if _, _, err := ps.firstLine("silent", []string{"sh", "-c", "exit 3"}, 10*time.Second); err == nil {
		t.Fatal("a process that prints nothing: want an error")
	}
}

func TestCountFDKinds(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep binary")
	}
	ps := NewProcs(t.TempDir(), &bytes.Buffer{})
	defer ps.StopAll()
	p, err := ps.Start("sleeper", []string{"sleep", "60"}, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k := countFDKinds(p.PID)
	// At least stdin, stdout and stderr; no sockets. (Right after fork the
	// child may still hold the runtime's descriptors, so pipes and the
	// exact total are not checked.)
	if k.total < 3 || k.sockets != 0 {
		t.Fatalf("fd kinds %+v", k)
	}
	stop := make(chan struct{})
	close(stop)
	if got := watchFDKinds(p.PID, stop); got.total < 3 {
		t.Fatalf("watch = %+v", got)
	}
	if got := countFDKinds(1 << 30); got != (fdKinds{}) {
		t.Fatalf("missing process: %+v", got)
	}
}

func TestTimelineFigures(t *testing.T) {
	res := &loadgen.Result{Timeline: []loadgen.Second{
		{At: 0, OK: 10, MaxMS: 5}, {At: 1, OK: 0, Errors: 3}, {At: 2, OK: 4, MaxMS: 1500}, {At: 3, OK: 0},
	}}
	if got := quietSeconds(res); got != 1 {
		t.Errorf("quietSeconds = %d, want 1 (the last, partial second does not count)", got)
	}
	if got := slowSeconds(res, 1000); got != 1 {
		t.Errorf("slowSeconds = %d, want 1", got)
	}
}
