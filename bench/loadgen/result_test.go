package loadgen

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func sampleResult() *Result {
	return &Result{
		Scenario: "steady", Mode: ModeHTTP, URL: "http://127.0.0.1:9/bytes/1024", Proxy: "http://u:xxxxx@127.0.0.1:8",
		Method: "GET", Concurrency: 64, TargetRate: 1000, Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		Elapsed: 10, Stopped: "duration", Operations: 10_010, OK: 10_000,
		Classes:    map[Class]int64{ClassOK: 10_000, ClassTimeout: 4, ClassProxy503: 6},
		Throughput: 1000, Bytes: 10_240_000, BytesPerS: 1_024_000,
		Latency:   Quantiles{Count: 10_000, Mean: 1.2, P50: 1, P90: 2, P99: 5.5, P999: 12.25, Max: 1500},
		Corrected: true,
		SUT:       &ProcStats{PIDs: []int{42}, Processes: 1, CPUPercent: 55, CPUPercentMax: 80, RSSBytes: 30 << 20, RSSMaxBytes: 31 << 20, FDs: 150, FDsMax: 160, ThreadsMax: 9},
		Host:      HostStats{LoopbackBytesPerSec: 3 << 20, TCPInUseMax: 200, Load1Start: 1, Load1End: 2},
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := sampleResult().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"scenario    steady",
		"open loop at 1000/s",
		"10010, ok 10000, errors 10 (proxy_503=6 timeout=4)",
		"1000.0 ok/s, 1000.0 KiB/s received",
		"p50 1.000ms  p90 2.000ms  p99 5.500ms  p99.9 12.2ms  max 1.50s  (n=10000)",
		"corrected for coordinated omission",
		"cpu 55% avg, 80% max",
		"rss 30.0 MiB (max 31.0 MiB), fds 150 (max 160)",
		"loopback 3.0 MiB/s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "setup") || strings.Contains(out, "tunnels ") {
		t.Errorf("http table shows tunnel lines:\n%s", out)
	}
}

func TestWriteJSONRoundTrip(t *testing.T) {
	in := sampleResult()
	var b bytes.Buffer
	if err := in.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"p99_ms": 5.5`, `"classes"`, `"proxy_503": 6`, `"cpu_percent": 55`, `"ops_per_sec": 1000`} {
		if !strings.Contains(b.String(), key) {
			t.Errorf("JSON lacks %s:\n%s", key, b.String())
		}
	}
	var out Result
	if err := json.Unmarshal(b.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.Latency != in.Latency || out.Classes[ClassTimeout] != 4 || out.SUT.FDsMax != 160 || out.Errors() != 10 {
		t.Fatalf("round trip lost data: %+v", out)
	}
}

func TestRedactProxy(t *testing.T) {
	if got := redactProxy("http://user:secret@127.0.0.1:8080"); strings.Contains(got, "secret") {
		t.Fatalf("redactProxy kept the password: %s", got)
	}
	if got := redactProxy(""); got != "" {
		t.Fatalf("redactProxy(\"\") = %q", got)
	}
}

func TestHuman(t *testing.T) {
	tests := map[float64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1.5 * (1 << 30): "1.5 GiB"}
	for in, want := range tests {
		if got := human(in); got != want {
			t.Errorf("human(%v) = %q, want %q", in, got, want)
		}
	}
}
