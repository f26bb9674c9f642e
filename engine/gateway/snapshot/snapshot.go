package snapshot

import (
	"encoding/base64"
	"errors"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// Target is what the transport needs to use one upstream proxy. It is built
// once per proxy and reused by every snapshot while the proxy's identity is
// unchanged, so a request never formats credentials.
type Target struct {
	ID       proxy.ID
	Upstream string
	Scheme   proxy.Scheme
	// Addr is host:port to dial.
	Addr string
	// ProxyAuthorization is the complete header value ("Basic ..."), empty
	// for a proxy without credentials. Never log it.
	ProxyAuthorization string
	// URL carries the credentials for net/http's Proxy hook. Never log it.
	URL *url.URL

	host       string
	port       uint16
	user, pass string
}

// LogValue keeps credentials out of logs: a target logs as its ID.
func (t *Target) LogValue() slog.Value { return slog.StringValue(string(t.ID)) }

func newTarget(p *proxy.Proxy) *Target {
	t := &Target{
		ID:       p.ID,
		Upstream: p.Upstream,
		Scheme:   p.Key.Scheme,
		Addr:     p.Addr(),
		host:     p.Key.Host,
		port:     p.Key.Port,
		user:     p.Key.Username,
		pass:     p.Password,
	}
	t.URL = &url.URL{Scheme: string(p.Key.Scheme), Host: t.Addr}
	if p.Key.Username != "" || p.Password != "" {
		t.URL.User = url.UserPassword(p.Key.Username, p.Password)
		t.ProxyAuthorization = "Basic " + base64.StdEncoding.EncodeToString([]byte(p.Key.Username+":"+p.Password))
	}
	return t
}

func (t *Target) same(p *proxy.Proxy) bool {
	return t.Upstream == p.Upstream && t.Scheme == p.Key.Scheme && t.host == p.Key.Host &&
		t.port == p.Key.Port && t.user == p.Key.Username && t.pass == p.Password
}

// Entry is one allocatable proxy as a rule's candidate list holds it: the
// fields the candidate filter reads sit together so a scan touches one
// cache line per entry plus the counter it inspects.
type Entry struct {
	counter     *Counter
	usableUntil int64 // unix nanoseconds; no new allocation from then on
	limit       uint64
	target      *Target
}

// Counter is the entry's runtime counter.
func (e *Entry) Counter() *Counter { return e.counter }

// UsableUntil is the last instant (unix nanoseconds, exclusive) at which a
// new allocation may start.
func (e *Entry) UsableUntil() int64 { return e.usableUntil }

// Limit is the proxy's maximum of active+reserved.
func (e *Entry) Limit() uint64 { return e.limit }

// Target is how to reach the proxy.
func (e *Entry) Target() *Target { return e.target }

// Rule is a compiled routing rule: its candidate proxies are resolved at
// build time from its upstreams (strategy, cursor, disabled) and tags, so
// the request path filters only on time and capacity.
type Rule struct {
	Name          string
	Strategy      routing.Strategy
	OnUnavailable routing.Unavailable
	// MaxAttempts bounds the distinct proxies one request may try.
	MaxAttempts int
	// Exhausted: a sequential rule whose cursor ran past its last upstream.
	Exhausted bool
	// Disabled: every upstream the rule could use now is disabled.
	Disabled bool

	candidates []Entry
}

// Candidates is the rule's allocatable proxies. Callers must not modify it.
func (r *Rule) Candidates() []Entry { return r.candidates }

// Snapshot is the compiled, immutable view one worker routes from.
type Snapshot struct {
	Version     uint64
	GeneratedAt time.Time
	ValidUntil  time.Time
	// BuiltAt is when Build ran; the gateway applies right after, so
	// maxStaleAge counts from here.
	BuiltAt time.Time
	// Proxies is the number of proxies in the source snapshot; Allocatable
	// how many of them can take new allocations.
	Proxies     int
	Allocatable int

	validUntil int64 // unix nanoseconds; 0 = no controller bound
	builtAt    int64
	matchers   []routing.Rule
	rules      []Rule
}

// Route returns the first rule matching q, or nil.
func (s *Snapshot) Route(q *routing.Request) *Rule {
	i := routing.First(s.matchers, q)
	if i < 0 {
		return nil
	}
	return &s.rules[i]
}

// Rules is the compiled rules in order. Callers must not modify it.
func (s *Snapshot) Rules() []Rule { return s.rules }

// Stale reports whether no new allocation may start at now (unix
// nanoseconds): the controller's ValidUntil passed, or maxStaleAge elapsed
// since the snapshot was applied (seed 000 §11).
func (s *Snapshot) Stale(now int64, maxStaleAge time.Duration) bool {
	if s.validUntil != 0 && now >= s.validUntil {
		return true
	}
	return maxStaleAge > 0 && now-s.builtAt > int64(maxStaleAge)
}

// Holder publishes the current snapshot behind one atomic pointer.
type Holder struct {
	p atomic.Pointer[Snapshot]
}

// Load returns the current snapshot, nil before the first Store.
func (h *Holder) Load() *Snapshot { return h.p.Load() }

// Store publishes s for every request that starts from now on; requests
// already routing keep the snapshot they loaded.
func (h *Holder) Store(s *Snapshot) { h.p.Store(s) }

// allocatable: a proxy new allocations may land on, as far as the snapshot
// alone can tell (time is checked per request).
func allocatable(p *proxy.Proxy) bool {
	// Only http upstreams are dialled today (SPEC §7); the key must be
	// dialable.
	return p.State == proxy.StateAvailable && p.Key.Scheme == proxy.SchemeHTTP &&
		p.Key.Host != "" && p.Key.Port != 0 && !p.UsableUntil.IsZero()
}

// Build compiles ws against reg. It binds every allocatable proxy to its
// counter in reg (creating missing ones, refusing with *BoundError past the
// registry bound), reclaims idle counters of proxies that left an earlier
// snapshot, and resolves each rule's candidate list. It does not publish:
// the caller stores the result in a Holder. Builds must not run
// concurrently with each other on one registry; Build serialises them.
func Build(ws *worker.Snapshot, reg *Registry) (*Snapshot, error) {
	if ws == nil {
		return nil, errors.New("building snapshot: nil snapshot")
	}
	if reg == nil {
		return nil, errors.New("building snapshot: nil registry")
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	now := reg.now()
	s := &Snapshot{
		Version:     ws.Version,
		GeneratedAt: ws.GeneratedAt,
		ValidUntil:  ws.ValidUntil,
		BuiltAt:     now,
		Proxies:     len(ws.Proxies),
		builtAt:     now.UnixNano(),
	}
	if !ws.ValidUntil.IsZero() {
		s.validUntil = max(ws.ValidUntil.UnixNano(), 1)
	}
	refs, err := reg.bind(ws, allocatable)
	if err != nil {
		return nil, err
	}

	// Group the allocatable proxies by upstream in one backing array:
	// count, then place.
	upIndex := make(map[string]int)
	var upCount []int
	nowNano := s.builtAt
	usable := func(i int) bool {
		p := &ws.Proxies[i]
		return refs[i] != nil && allocatable(p) && p.UsableUntil.UnixNano() > nowNano
	}
	for i := range ws.Proxies {
		if !usable(i) {
			continue
		}
		u := ws.Proxies[i].Upstream
		k, ok := upIndex[u]
		if !ok {
			k = len(upCount)
			upIndex[u] = k
			upCount = append(upCount, 0)
		}
		upCount[k]++
		s.Allocatable++
	}
	backing := make([]Entry, s.Allocatable)
	order := make([]int32, s.Allocatable) // index into ws.Proxies, parallel to backing
	start := make([]int, len(upCount)+1)
	for k, n := range upCount {
		start[k+1] = start[k] + n
	}
	fill := append([]int(nil), start[:len(upCount)]...)
	for i := range ws.Proxies {
		if !usable(i) {
			continue
		}
		p := &ws.Proxies[i]
		e := refs[i]
		if e.target == nil || !e.target.same(p) {
			e.target = newTarget(p)
		}
		k := upIndex[p.Upstream]
		j := fill[k]
		fill[k]++
		backing[j] = Entry{counter: e.c, usableUntil: p.UsableUntil.UnixNano(), limit: limitOf(p), target: e.target}
		order[j] = int32(i)
	}

	s.matchers = make([]routing.Rule, len(ws.Routings))
	s.rules = make([]Rule, len(ws.Routings))
	for i := range ws.Routings {
		src := &ws.Routings[i]
		s.matchers[i] = compileMatcher(src)
		r := &s.rules[i]
		*r = Rule{Name: src.Name, Strategy: src.Strategy, OnUnavailable: src.OnUnavailable, MaxAttempts: max(src.MaxAttempts, 1)}
		ups := ruleUpstreams(src, ws, r)
		if len(ups) == 1 && len(src.Tags) == 0 {
			// The common case shares the upstream's slice: no copy.
			if k, ok := upIndex[ups[0]]; ok {
				r.candidates = backing[start[k]:start[k+1]:start[k+1]]
			}
			continue
		}
		n := 0
		for _, u := range ups {
			if k, ok := upIndex[u]; ok {
				n += upCount[k]
			}
		}
		if n == 0 {
			continue
		}
		list := make([]Entry, 0, n)
		for _, u := range ups {
			k, ok := upIndex[u]
			if !ok {
				continue
			}
			for j := start[k]; j < start[k+1]; j++ {
				if hasTags(&ws.Proxies[order[j]], src.Tags) {
					list = append(list, backing[j])
				}
			}
		}
		r.candidates = list[:len(list):len(list)]
	}
	return s, nil
}

// ruleUpstreams resolves which upstreams a rule may allocate from now:
// every enabled one for least-connections, only the cursor's for
// sequential (seed 000 §9). It flags r when the answer is none for a
// reason other than an empty pool.
func ruleUpstreams(src *routing.Rule, ws *worker.Snapshot, r *Rule) []string {
	if src.Strategy == routing.Sequential {
		cur, ok := ws.Cursors[src.Name]
		if !ok {
			cur = 0
		}
		if cur < 0 || cur >= len(src.Upstreams) {
			r.Exhausted = true
			return nil
		}
		if ws.Disabled[src.Upstreams[cur]] {
			r.Disabled = true
			return nil
		}
		return src.Upstreams[cur : cur+1]
	}
	ups := make([]string, 0, len(src.Upstreams))
	for _, u := range src.Upstreams {
		if ws.Disabled[u] || contains(ups, u) {
			continue
		}
		ups = append(ups, u)
	}
	if len(ups) == 0 && len(src.Upstreams) > 0 {
		r.Disabled = true
	}
	return ups
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// compileMatcher copies the matching part of a rule, normalising host
// patterns the way the request side normalises hosts (lower case, no
// trailing dot), so a snapshot never shares slices with its source.
func compileMatcher(src *routing.Rule) routing.Rule {
	m := routing.Rule{Name: src.Name}
	if len(src.Hosts) > 0 {
		m.Hosts = make([]string, len(src.Hosts))
		for i, h := range src.Hosts {
			m.Hosts[i] = strings.TrimSuffix(strings.ToLower(h), ".")
		}
	}
	m.Ports = append([]uint16(nil), src.Ports...)
	m.Clients = append([]string(nil), src.Clients...)
	return m
}

// hasTags reports whether p carries every tag of the rule. Region and
// carrier are first-class proxy fields, so the tag names "region" and
// "carrier" also match them.
func hasTags(p *proxy.Proxy, tags map[string]string) bool {
	for k, want := range tags {
		got, ok := p.Tags[k]
		if !ok {
			switch k {
			case "region":
				got, ok = p.Region, p.Region != ""
			case "carrier":
				got, ok = p.Carrier, p.Carrier != ""
			}
		}
		if !ok || got != want {
			return false
		}
	}
	return true
}

// limitOf is the proxy's concurrency limit. The controller sets it from
// pool.maxConcurrency; a zero from an older controller gets the documented
// default rather than "unlimited".
func limitOf(p *proxy.Proxy) uint64 {
	n := p.MaxConcurrency
	if n <= 0 {
		n = config.DefaultMaxConcurrency
	}
	return uint64(min(n, MaxLimit, math.MaxInt64))
}
