package snapshot

import (
	"encoding/base64"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/sticky"
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
	if p.Key.Username != "" || p.Password != "" {
		cred := p.Key.Username + ":" + p.Password
		buf := make([]byte, len("Basic ")+base64.StdEncoding.EncodedLen(len(cred)))
		copy(buf, "Basic ")
		base64.StdEncoding.Encode(buf[len("Basic "):], []byte(cred))
		// buf is never written again: share it rather than copy it.
		t.ProxyAuthorization = unsafe.String(&buf[0], len(buf))
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
	// WaitTimeout bounds onUnavailable "wait".
	WaitTimeout time.Duration
	// StickyHeader is the canonical name of the session header; empty
	// when the rule has no sticky sessions.
	StickyHeader string
	// Sessions holds the rule's session bindings; nil when the rule has no
	// sticky sessions. It outlives snapshots (the gateway keeps one per
	// routing name).
	Sessions *sticky.Cache
	// Gate is the rule's admission limit; nil when unlimited.
	Gate *Gate

	candidates []Entry
	// index finds a candidate by proxy ID; built only for sticky rules.
	index map[proxy.ID]int32
}

// Candidates is the rule's allocatable proxies. Callers must not modify it.
func (r *Rule) Candidates() []Entry { return r.candidates }

// Lookup returns the rule's candidate entry for id, nil when the proxy is
// not a candidate of this rule in this snapshot. Only sticky rules have an
// index; others always answer nil.
func (r *Rule) Lookup(id proxy.ID) *Entry {
	if i, ok := r.index[id]; ok {
		return &r.candidates[i]
	}
	return nil
}

// Gate bounds the requests one routing holds at once (admission before
// any proxy is chosen). Gates are kept per routing name by the caller, so
// the count survives snapshot swaps.
type Gate struct {
	n   atomic.Int64
	max atomic.Int64
}

// NewGate returns a gate admitting up to limit at once.
func NewGate(limit int64) *Gate {
	g := &Gate{}
	g.SetMax(limit)
	return g
}

// SetMax changes the limit; holders above a lowered limit keep their slot.
func (g *Gate) SetMax(limit int64) { g.max.Store(max(limit, 1)) }

// TryEnter takes a slot if one is free.
func (g *Gate) TryEnter() bool {
	if g.n.Add(1) > g.max.Load() {
		g.n.Add(-1)
		return false
	}
	return true
}

// Leave gives a slot back.
func (g *Gate) Leave() { g.n.Add(-1) }

// InFlight is the number of slots held.
func (g *Gate) InFlight() int64 { return g.n.Load() }

// RuleSettings are a rule's parameters that the gateway's own config
// supplies rather than the controller's snapshot.
type RuleSettings struct {
	WaitTimeout time.Duration
	// Sessions enables sticky sessions for a rule whose snapshot entry
	// names a sticky header; nil disables them.
	Sessions *sticky.Cache
	Gate     *Gate
}

// Options adjust Build.
type Options struct {
	// Settings returns the gateway's settings for a rule; nil leaves every
	// rule without sessions, gate or wait timeout.
	Settings func(r *routing.Rule) RuleSettings
}

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
//
// Build withdraws (see Counter) every proxy that the new snapshot no longer
// offers before it returns, so callers may publish and acknowledge at once.
func Build(ws *worker.Snapshot, reg *Registry) (*Snapshot, error) {
	return BuildWith(ws, reg, Options{})
}

// BuildWith is Build with per-rule settings.
func BuildWith(ws *worker.Snapshot, reg *Registry, opts Options) (*Snapshot, error) {
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
		backing[j] = Entry{counter: &e.c, usableUntil: p.UsableUntil.UnixNano(), limit: limitOf(p), target: e.target}
		order[j] = int32(i)
	}

	s.matchers = make([]routing.Rule, len(ws.Routings))
	s.rules = make([]Rule, len(ws.Routings))
	for i := range ws.Routings {
		src := &ws.Routings[i]
		s.matchers[i] = compileMatcher(src)
		r := &s.rules[i]
		*r = Rule{Name: src.Name, Strategy: src.Strategy, OnUnavailable: src.OnUnavailable, MaxAttempts: max(src.MaxAttempts, 1)}
		if opts.Settings != nil {
			set := opts.Settings(src)
			r.WaitTimeout, r.Gate = set.WaitTimeout, set.Gate
			if src.StickyHeader != "" && set.Sessions != nil {
				r.StickyHeader, r.Sessions = CanonicalHeaderKey(src.StickyHeader), set.Sessions
			}
		}
		r.candidates = ruleCandidates(src, ws, r, upIndex, upCount, start, backing, order)
		if r.Sessions != nil && len(r.candidates) > 0 {
			r.index = make(map[proxy.ID]int32, len(r.candidates))
			for j := range r.candidates {
				r.index[r.candidates[j].target.ID] = int32(j)
			}
		}
	}
	return s, nil
}

// ruleCandidates resolves the candidate list of one rule.
func ruleCandidates(src *routing.Rule, ws *worker.Snapshot, r *Rule, upIndex map[string]int, upCount, start []int, backing []Entry, order []int32) []Entry {
	ups := ruleUpstreams(src, ws, r)
	var excluded map[proxy.ID]bool
	if ex := ws.RoutingExclusions[src.Name]; len(ex) > 0 {
		// The controller's target checks failed through these proxies
		// for this routing only (seed 000 §13).
		excluded = make(map[proxy.ID]bool, len(ex))
		for _, id := range ex {
			excluded[id] = true
		}
	}
	if len(ups) == 1 && len(src.Tags) == 0 && excluded == nil {
		// The common case shares the upstream's slice: no copy.
		if k, ok := upIndex[ups[0]]; ok {
			return backing[start[k]:start[k+1]:start[k+1]]
		}
		return nil
	}
	n := 0
	for _, u := range ups {
		if k, ok := upIndex[u]; ok {
			n += upCount[k]
		}
	}
	if n == 0 {
		return nil
	}
	list := make([]Entry, 0, n)
	for _, u := range ups {
		k, ok := upIndex[u]
		if !ok {
			continue
		}
		for j := start[k]; j < start[k+1]; j++ {
			if p := &ws.Proxies[order[j]]; hasTags(p, src.Tags) && !excluded[p.ID] {
				list = append(list, backing[j])
			}
		}
	}
	return list[:len(list):len(list)]
}

// CanonicalHeaderKey is textproto.CanonicalMIMEHeaderKey for the header
// names a config can hold, without importing net: a name with a character
// outside the token set is returned unchanged, as net/http would key it.
func CanonicalHeaderKey(s string) string {
	b := []byte(s)
	upper := true
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			if upper {
				b[i] = c - 'a' + 'A'
			}
		case c >= 'A' && c <= 'Z':
			if !upper {
				b[i] = c - 'A' + 'a'
			}
		case c >= '0' && c <= '9', c == '-', strings.IndexByte("!#$%&'*+.^_`|~", c) >= 0:
		default:
			return s
		}
		upper = c == '-'
	}
	return string(b)
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
