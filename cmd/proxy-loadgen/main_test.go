package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/bench/loadgen"
	"github.com/proxypool/proxypool/testenv"
)

func TestRunAgainstLoopbackTarget(t *testing.T) {
	target, err := testenv.NewTarget("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	proxy, err := testenv.NewUpstreamProxy(testenv.UpstreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })

	var out, errOut bytes.Buffer
	code := run([]string{"-json", "-n", "40", "-c", "4", "-x", "http://" + proxy.Addr(),
		"-H", "X-Bench: 1", "-H", "X-Bench: 2", "-progress", "0", "-scenario", "cli",
		target.URL() + "/bytes/64"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	var res loadgen.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output is not a result: %v\n%s", err, out.String())
	}
	if res.Scenario != "cli" || res.OK != 40 || res.Bytes != 40*64 || res.Concurrency != 4 {
		t.Fatalf("result %+v", res)
	}
	got := target.Received()
	if len(got) == 0 || got[len(got)-1].Headers["X-Bench"] != "1, 2" {
		t.Fatalf("the target did not get the repeated header: %+v", got)
	}

	out.Reset()
	if code := run([]string{"-n", "5", "-progress", "0", target.URL() + "/"}, &out, &errOut); code != 0 {
		t.Fatalf("table run: exit %d", code)
	}
	if !strings.Contains(out.String(), "latency") || !strings.Contains(out.String(), "ok 5") {
		t.Fatalf("table output:\n%s", out.String())
	}
}

func TestRunUsageErrors(t *testing.T) {
	body := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(body, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no bound", []string{"http://127.0.0.1:1/"}, "request count or a duration"},
		{"no url", []string{"-n", "1"}, "url is required"},
		{"bad header", []string{"-H", "nocolon", "-n", "1", "http://127.0.0.1:1/"}, "Name: value"},
		{"bad pid", []string{"-sut-pid", "x", "-n", "1", "http://127.0.0.1:1/"}, "positive number"},
		{"two bodies", []string{"-body", "a", "-body-file", body, "-n", "1", "http://127.0.0.1:1/"}, "exclusive"},
		{"missing body file", []string{"-body-file", body + ".missing", "-n", "1", "http://127.0.0.1:1/"}, "reading body"},
		{"two urls", []string{"-n", "1", "http://127.0.0.1:1/", "http://127.0.0.1:2/"}, "one target URL"},
		{"unknown flag", []string{"-nope"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(tt.args, &out, &errOut); code != 2 {
				t.Fatalf("exit %d, want 2", code)
			}
			if !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("stderr %q lacks %q", errOut.String(), tt.want)
			}
		})
	}
}

func TestHeaderFlag(t *testing.T) {
	var f headerFlag
	for _, v := range []string{"A: 1", "a:2", "B:  spaced  "} {
		if err := f.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.h.Values("A"); len(got) != 2 || got[1] != "2" || f.h.Get("B") != "spaced" {
		t.Fatalf("headers %v", f.h)
	}
}
