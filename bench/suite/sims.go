package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Upstream is one simulated upstream proxy.
type Upstream struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

type simState struct {
	PID       int        `json:"pid"`
	Upstreams []Upstream `json:"upstreams"`
	Target    string     `json:"target"`
	TLSTarget string     `json:"tls_target"`
	Vendor    string     `json:"vendor"`
	Control   string     `json:"control"`
}

// Sims are the simulations: a target, a TLS target and a vendor API in one
// process, and the upstream proxies spread over UpstreamProcs more, so
// that ten thousand tunnels (two descriptors each in an upstream) stay
// under each process's descriptor limit.
type Sims struct {
	Target, TLSTarget string // host:port
	Vendor            string // base URL
	Control           string // host:port of the control API
	Upstreams         []Upstream
	TargetPID         int
	UpstreamPIDs      []int // the process of each upstream, by index
	client            *http.Client
}

// StartSims starts n upstreams over procs processes plus the
// target/vendor process.
func StartSims(ps *Procs, bin string, n, procs int) (*Sims, error) {
	p, line, err := ps.firstLine("sim-target", []string{bin,
		"-target", "127.0.0.1:0", "-tls-target", "127.0.0.1:0", "-vendor", "127.0.0.1:0", "-control", "127.0.0.1:0"}, 10*time.Second)
	if err != nil {
		return nil, err
	}
	var st simState
	if err := json.Unmarshal(line, &st); err != nil {
		return nil, fmt.Errorf("reading simulation state: %w", err)
	}
	s := &Sims{Target: st.Target, TLSTarget: st.TLSTarget, Vendor: st.Vendor, Control: st.Control,
		TargetPID: p.PID, client: &http.Client{Timeout: 30 * time.Second}}
	procs = max(1, min(procs, n))
	for i := range procs {
		lo, hi := n*i/procs, n*(i+1)/procs
		name := "sim-upstreams-" + strconv.Itoa(i+1)
		p, line, err := ps.firstLine(name, []string{bin,
			"-upstreams", strconv.Itoa(hi - lo), "-id-base", strconv.Itoa(lo)}, 10*time.Second)
		if err != nil {
			return nil, err
		}
		var us simState
		if err := json.Unmarshal(line, &us); err != nil {
			return nil, fmt.Errorf("reading simulation state: %w", err)
		}
		for _, u := range us.Upstreams {
			s.Upstreams = append(s.Upstreams, u)
			s.UpstreamPIDs = append(s.UpstreamPIDs, p.PID)
		}
	}
	return s, nil
}

// Addrs returns the upstreams' addresses.
func (s *Sims) Addrs() []string {
	out := make([]string, len(s.Upstreams))
	for i, u := range s.Upstreams {
		out[i] = u.Addr
	}
	return out
}

// SetVendorProxies makes the vendor hand out count proxies spread over
// the upstreams; userPrefix "" gives them no username (one proxy per
// upstream is then all there is), otherwise proxy i is userPrefix+i.
func (s *Sims) SetVendorProxies(ctx context.Context, count int, userPrefix string) error {
	body, _ := json.Marshal(map[string]any{"addrs": s.Addrs(), "count": count, "userPrefix": userPrefix})
	return s.post(ctx, "/vendor/proxies", body)
}

// SetVendorMode switches the vendor (normal, error500, ...).
func (s *Sims) SetVendorMode(ctx context.Context, mode string) error {
	return s.post(ctx, "/vendor/mode?m="+url.QueryEscape(mode), nil)
}

func (s *Sims) post(ctx context.Context, path string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Control+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("simulation control %s: %w", path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("simulation control %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
