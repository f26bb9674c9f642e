// Package routing holds routing rules, first-match selection and the
// sequential cursor arithmetic (seed 000 §9). It is pure.
package routing

import (
	"strings"
)

// Strategy picks among a rule's upstreams.
type Strategy uint8

// Strategies.
const (
	LeastConnections Strategy = iota + 1
	Sequential
)

// Exhaustion is what a sequential rule does after its last upstream.
type Exhaustion uint8

// Exhaustion policies; Stop is the default.
const (
	Stop Exhaustion = iota + 1
	Loop
	StayLast
)

// Unavailable is what a rule does when no proxy can be reserved.
type Unavailable uint8

// OnUnavailable policies; Reject is the default.
const (
	Reject Unavailable = iota + 1
	Wait
	Direct
)

// Rule is one compiled routing rule.
type Rule struct {
	Name          string
	Hosts         []string // exact names or "*.suffix", lower case, no trailing dot
	Ports         []uint16
	Clients       []string
	Upstreams     []string
	Strategy      Strategy
	OnExhausted   Exhaustion
	OnUnavailable Unavailable
	Tags          map[string]string
	StickyHeader  string
	MaxAttempts   int
}

// Request is what a rule matches on.
type Request struct {
	Host   string // lower case, without port or trailing dot
	Port   uint16
	Client string
}

// Matches reports whether every set condition of r holds for q.
func (r *Rule) Matches(q *Request) bool {
	if len(r.Hosts) > 0 && !matchHost(r.Hosts, q.Host) {
		return false
	}
	if len(r.Ports) > 0 {
		ok := false
		for _, p := range r.Ports {
			if p == q.Port {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.Clients) > 0 {
		ok := false
		for _, c := range r.Clients {
			if c == q.Client {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func matchHost(patterns []string, host string) bool {
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*"); ok {
			// "*.example.com" matches "a.example.com" but not "example.com".
			if len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
				return true
			}
		} else if p == host {
			return true
		}
	}
	return false
}

// First returns the index of the first rule that matches q, or -1.
func First(rules []Rule, q *Request) int {
	for i := range rules {
		if rules[i].Matches(q) {
			return i
		}
	}
	return -1
}

// Cursor is a sequential rule's position. Generation increases with every
// move so that a compare-and-set can refuse a stale writer.
type Cursor struct {
	Index      int
	Generation int64
	// Exhausted is set when policy Stop ran past the last upstream.
	Exhausted bool
}

// Advance computes the cursor after the upstream at cur.Index was depleted.
// skip reports upstreams that must be passed over (disabled). ok is false
// when nothing changes (already exhausted, or StayLast on the last).
func Advance(cur Cursor, n int, policy Exhaustion, skip func(i int) bool) (next Cursor, ok bool) {
	if n == 0 || cur.Exhausted {
		return cur, false
	}
	for step := 1; step <= n; step++ {
		i := cur.Index + step
		if i >= n {
			switch policy {
			case Loop:
				i %= n
			case StayLast:
				return cur, false
			default:
				return Cursor{Index: cur.Index, Generation: cur.Generation + 1, Exhausted: true}, true
			}
		}
		if skip != nil && skip(i) {
			continue
		}
		if i == cur.Index {
			return cur, false
		}
		return Cursor{Index: i, Generation: cur.Generation + 1}, true
	}
	return cur, false
}
