package gateway_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/testenv"
)

// faulty starts two upstreams, the second with fault f, and a gateway
// routing over both.
func faulty(t *testing.T, f testenv.UpstreamFault) (*harness, []*testenv.UpstreamProxy) {
	t.Helper()
	h := start(t, "")
	ups := gwtest.Upstreams(t, 2, upUser, upPass)
	if err := ups[1].SetFault(f); err != nil {
		t.Fatal(err)
	}
	h.apply(t, snapshotOf(1, ups...))
	return h, ups
}

// The first choice is random: 40 tries miss the faulty proxy with
// probability 2^-40.
const tries = 40

func TestRetryRules(t *testing.T) {
	t.Run("GET refused by one proxy is retried on the other", func(t *testing.T) {
		h, ups := faulty(t, testenv.FaultRefuse)
		tg := gwtest.Target(t)
		for range tries {
			resp, body := do(t, h.client(""), http.MethodGet, tg.URL()+"/r", nil)
			if resp.StatusCode != 200 || received(t, body).UpstreamProxy != ups[0].ID() {
				t.Fatalf("got %d %q (%s)", resp.StatusCode, body, resp.Header.Get("X-Proxypool-Reason"))
			}
		}
		if h.metric(t, "proxypool_gateway_retries_total") == 0 {
			t.Fatal("no request was retried")
		}
		h.idle(t)
		gwtest.Eventually(t, "dial failure reported", func() bool {
			for _, o := range h.sink.outcomes() {
				if !o.Success && o.Phase == worker.PhaseDial {
					return true
				}
			}
			return false
		})
		if h.metric(t, "proxypool_gateway_upstream_failures_total", "phase", "dial") == 0 {
			t.Fatal("dial failure not counted")
		}
	})
	t.Run("GET answered 407 by one proxy is retried", func(t *testing.T) {
		h, ups := faulty(t, testenv.FaultHandshake407)
		tg := gwtest.Target(t)
		for range tries {
			resp, body := do(t, h.client(""), http.MethodGet, tg.URL()+"/r", nil)
			if resp.StatusCode != 200 || received(t, body).UpstreamProxy != ups[0].ID() {
				t.Fatalf("got %d (%s)", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
			}
		}
		if h.metric(t, "proxypool_gateway_upstream_failures_total", "phase", "proxy_handshake") == 0 {
			t.Fatal("407 not classified as proxy_handshake")
		}
	})
	t.Run("GET dropped after response headers is not retried", func(t *testing.T) {
		h, ups := faulty(t, testenv.FaultDropMidResponse)
		tg := gwtest.Target(t)
		broken, clientReqs := 0, int64(0)
		for i := 0; i < tries && broken == 0; i++ {
			clientReqs++
			req, _ := http.NewRequest(http.MethodGet, tg.URL()+"/bytes/100000", nil)
			resp, err := h.client("").Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: the headers should have reached the client", resp.StatusCode)
			}
			if _, err := io.ReadAll(resp.Body); err != nil {
				broken++
			}
			resp.Body.Close()
		}
		if broken == 0 {
			t.Fatal("never hit the dropping proxy")
		}
		if r := h.metric(t, "proxypool_gateway_retries_total"); r != 0 {
			t.Fatalf("retried %v times after headers reached the client", r)
		}
		if n := requests(ups); n != clientReqs {
			t.Fatalf("upstreams carried %d requests for %d client requests: replayed", n, clientReqs)
		}
		gwtest.Eventually(t, "tunnel-phase failure reported", func() bool {
			for _, o := range h.sink.outcomes() {
				if o.Phase == worker.PhaseTunnel {
					return true
				}
			}
			return false
		})
	})
	t.Run("POST refused by one proxy is never retried", func(t *testing.T) {
		h, _ := faulty(t, testenv.FaultRefuse)
		tg := gwtest.Target(t)
		var failed, ok int
		for i := 0; i < tries && failed == 0; i++ {
			resp, _ := do(t, h.client(""), http.MethodPost, tg.URL()+"/echo", strings.NewReader("payload"))
			switch resp.StatusCode {
			case 200:
				ok++
			case 502:
				failed++
				if r := resp.Header.Get("X-Proxypool-Reason"); r != "upstream-dial" {
					t.Fatalf("502 reason %q", r)
				}
			default:
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		if failed == 0 {
			t.Fatal("no POST ever chose the refusing proxy")
		}
		if r := h.metric(t, "proxypool_gateway_retries_total"); r != 0 {
			t.Fatalf("POST retried %v times", r)
		}
		if n := tg.Count(); n != int64(ok) {
			t.Fatalf("target saw %d POSTs for %d successes", n, ok)
		}
		h.idle(t)
	})
	t.Run("CONNECT refused by one proxy is retried before its 200", func(t *testing.T) {
		h, _ := faulty(t, testenv.FaultRefuse)
		echo := gwtest.NewEchoServer(t)
		for range tries {
			conn, br := connect(t, h.addr, echo, "")
			io.WriteString(conn, "ok")
			conn.(*net.TCPConn).CloseWrite()
			if got, err := io.ReadAll(br); err != nil || string(got) != "ok" {
				t.Fatalf("echo %q %v", got, err)
			}
			conn.Close()
		}
		if h.metric(t, "proxypool_gateway_retries_total") == 0 {
			t.Fatal("no CONNECT was retried")
		}
		h.idle(t)
	})
	t.Run("CONNECT dropped after its 200 is not retried", func(t *testing.T) {
		h, ups := faulty(t, testenv.FaultDropMidResponse)
		echo := gwtest.NewEchoServer(t)
		dropped, connects := 0, int64(0)
		for i := 0; i < tries && dropped == 0; i++ {
			connects++
			conn, br := connect(t, h.addr, echo, "")
			io.WriteString(conn, "ok")
			conn.(*net.TCPConn).CloseWrite()
			if got, _ := io.ReadAll(br); string(got) != "ok" {
				dropped++
			}
			conn.Close()
		}
		if dropped == 0 {
			t.Fatal("never hit the dropping proxy")
		}
		if r := h.metric(t, "proxypool_gateway_retries_total"); r != 0 {
			t.Fatalf("retried %v times after the 200", r)
		}
		if n := requests(ups); n != connects {
			t.Fatalf("upstreams opened %d tunnels for %d CONNECTs", n, connects)
		}
		h.idle(t)
	})
}
