package proxy

import (
	"strings"
	"testing"
	"time"
)

func TestKeyExcludesUpstreamAndPassword(t *testing.T) {
	a := Candidate{Scheme: SchemeHTTP, Host: "10.0.0.1", Port: 8000, Username: "u", Password: "secret-1"}
	b := a
	if a.Key() != b.Key() {
		t.Fatal("same candidate, different keys")
	}
	b.Password = "secret-2"
	if a.Key() == b.Key() {
		t.Fatal("a credential rotation must give a new key")
	}
	if s := a.Key().String(); strings.Contains(s, "secret") {
		t.Fatalf("key string leaks the password: %s", s)
	}
	v6 := Key{Scheme: SchemeHTTP, Host: "::1", Port: 80}
	if got := v6.String(); got != "http://[::1]:80" {
		t.Fatalf("ipv6 key = %s", got)
	}
}

func TestCandidateValidateAndExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		c    Candidate
		ok   bool
	}{
		{"ok", Candidate{Scheme: SchemeHTTP, Host: "h", Port: 1}, true},
		{"bad scheme", Candidate{Scheme: "ftp", Host: "h", Port: 1}, false},
		{"no host", Candidate{Scheme: SchemeHTTP, Port: 1}, false},
		{"port zero", Candidate{Scheme: SchemeHTTP, Host: "h"}, false},
		{"negative ttl", Candidate{Scheme: SchemeHTTP, Host: "h", Port: 1, TTL: -1}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	c := Candidate{TTL: time.Minute}
	if got := c.Expiry(now, time.Hour); !got.Equal(now.Add(time.Minute)) {
		t.Fatalf("ttl expiry = %v", got)
	}
	c = Candidate{ExpiresAt: now.Add(2 * time.Minute), TTL: time.Minute}
	if got := c.Expiry(now, time.Hour); !got.Equal(now.Add(2 * time.Minute)) {
		t.Fatalf("expiresAt must win over ttl, got %v", got)
	}
	c = Candidate{}
	if got := c.Expiry(now, time.Hour); !got.Equal(now.Add(time.Hour)) {
		t.Fatalf("default ttl expiry = %v", got)
	}
}

func TestUsable(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := Proxy{State: StateAvailable, UsableUntil: now.Add(time.Second)}
	if !p.Usable(now) {
		t.Fatal("available before usable_until must be usable")
	}
	if p.Usable(now.Add(time.Second)) {
		t.Fatal("usable_until is the last allocatable instant, exclusive")
	}
	p.State = StateSuspect
	if p.Usable(now) {
		t.Fatal("suspect proxies take no new allocations")
	}
}
