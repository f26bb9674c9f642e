package testenv

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestTargetDescribesRequests(t *testing.T) {
	tg := startTarget(t, false)
	tg.MapSource("127.0.0.1", "direct")
	req, _ := http.NewRequest(http.MethodPost, tg.URL()+"/some/path?a=1&b=2", strings.NewReader("12345"))
	req.Header.Set("X-Test", "yes")
	resp, err := tg.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rec Received
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
		t.Fatal(err)
	}
	if rec.Method != "POST" || rec.Path != "/some/path" || rec.Query != "a=1&b=2" || rec.BodyBytes != 5 ||
		rec.Headers["X-Test"] != "yes" || rec.Headers["Host"] != tg.Addr() ||
		!strings.HasPrefix(rec.RemoteAddr, "127.0.0.1:") || rec.UpstreamProxy != "direct" {
		t.Fatalf("description %+v", rec)
	}

	// The header wins over the source mapping.
	req, _ = http.NewRequest(http.MethodGet, tg.URL(), nil)
	req.Header.Set(UpstreamHeader, "up-9")
	resp, err = tg.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	got := tg.Received()
	if tg.Count() != 2 || len(got) != 2 || got[0].Path != "/some/path" || got[1].UpstreamProxy != "up-9" {
		t.Fatalf("Count %d, Received %+v", tg.Count(), got)
	}
}

func TestTargetSpecialPaths(t *testing.T) {
	tg := startTarget(t, false)
	c := tg.Client()
	get := func(path string) (*http.Response, []byte) {
		t.Helper()
		resp, err := c.Get(tg.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}

	if resp, body := get("/bytes/100000"); resp.StatusCode != 200 || len(body) != 100000 || strings.Trim(string(body), "x") != "" {
		t.Fatalf("/bytes: status %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp, _ := get("/bytes/99999999999"); resp.StatusCode != 400 {
		t.Fatalf("/bytes over limit: status %d", resp.StatusCode)
	}
	for path, code := range map[string]int{"/status/418": 418, "/status/204": 204, "/status/503": 503, "/status/42": 400} {
		if resp, _ := get(path); resp.StatusCode != code {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
	}

	payload := bytes.Repeat([]byte("echo!"), 10000)
	resp, err := c.Post(tg.URL()+"/echo", "application/octet-stream", bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(body, payload) {
		t.Fatalf("/echo returned %d bytes, err %v", len(body), err)
	}
}

func TestTargetKeepsBoundedHistory(t *testing.T) {
	tg := startTarget(t, false)
	const n = targetMaxReceived + 5
	for i := range n {
		resp, err := tg.Client().Get(tg.URL() + "/r?i=" + strings.Repeat("x", i%3))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	got := tg.Received()
	if tg.Count() != n || len(got) != targetMaxReceived {
		t.Fatalf("Count %d, kept %d", tg.Count(), len(got))
	}
	// Oldest first: the 6th request (i=5, 5%3=2) is now the first kept.
	if got[0].Query != "i=xx" || got[len(got)-1].Query != "i="+strings.Repeat("x", (n-1)%3) {
		t.Fatalf("order: first %q last %q", got[0].Query, got[len(got)-1].Query)
	}
}

func TestTLSTarget(t *testing.T) {
	tg := startTarget(t, true)
	if !strings.HasPrefix(tg.URL(), "https://127.0.0.1:") || tg.CertPool() == nil {
		t.Fatalf("URL %s pool %v", tg.URL(), tg.CertPool())
	}
	resp, err := tg.Client().Get(tg.URL() + "/status/201")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || resp.TLS == nil {
		t.Fatalf("status %d tls %v", resp.StatusCode, resp.TLS != nil)
	}
	if _, err := directClient.Get(tg.URL()); err == nil {
		t.Fatal("untrusting client accepted the self-signed certificate")
	}
}
