package gateway_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

// Every gateway metric is proxypool_gateway_*, and no label could carry a
// proxy address, client id, session, URL or request id: label names come
// from a closed set and values from closed vocabularies.
func TestMetricsCarryNoIdentities(t *testing.T) {
	h := start(t, stickyConfig(t))
	tg := gwtest.Target(t)
	ups := gwtest.Upstreams(t, 2, upUser, upPass)
	ws := snapshotOf(1, ups...)
	ws.Routings[0].StickyHeader = "X-Session"
	h.apply(t, ws)
	for _, hdr := range [][]string{{"X-Session", "secret-session"}, nil} {
		do(t, h.client("client:client-pass"), http.MethodGet, tg.URL()+"/m?q=secret-query", nil, hdr...)
	}
	do(t, h.client(""), http.MethodGet, tg.URL()+"/m", nil)
	echo := gwtest.NewEchoServer(t)
	conn, _ := connect(t, h.addr, echo, "", "Proxy-Authorization", "Basic "+base64Of("client:client-pass"))
	conn.Close()
	h.idle(t)

	allowed := map[string]*regexp.Regexp{
		"method_class": regexp.MustCompile(`^(connect|get_head|other)$`),
		"result":       regexp.MustCompile(`^[a-z_]+$`),
		"reason":       regexp.MustCompile(`^[a-z_-]+$`),
		"direction":    regexp.MustCompile(`^(upstream|downstream)$`),
		"phase":        regexp.MustCompile(`^(none|dial|proxy_handshake|response_headers|tunnel)$`),
	}
	secrets := []string{"127.0.0.1", "client", "secret", ups[0].ID(), ups[0].Addr(), "/m", "vendor-user"}
	mfs, err := h.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) < 15 {
		t.Fatalf("only %d metric families", len(mfs))
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "proxypool_gateway_") {
			t.Errorf("metric %s outside proxypool_gateway_", mf.GetName())
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				re, ok := allowed[lp.GetName()]
				if !ok {
					t.Errorf("%s has label %s", mf.GetName(), lp.GetName())
					continue
				}
				if !re.MatchString(lp.GetValue()) {
					t.Errorf("%s{%s=%q} outside its vocabulary", mf.GetName(), lp.GetName(), lp.GetValue())
				}
				for _, s := range secrets {
					if strings.Contains(lp.GetValue(), s) {
						t.Errorf("%s{%s=%q} carries %q", mf.GetName(), lp.GetName(), lp.GetValue(), s)
					}
				}
			}
		}
	}
}
