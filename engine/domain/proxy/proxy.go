// Package proxy holds the Proxy model, its unique key and its lifecycle state
// machine (seed 000 §5, §6). It is pure: no I/O, no clocks of its own.
package proxy

import (
	"fmt"
	"strconv"
	"time"
)

// Scheme is the protocol an upstream proxy speaks.
type Scheme string

// Schemes a provider may return. Only http is dialled by the gateway today;
// https and socks5 are extension points.
const (
	SchemeHTTP   Scheme = "http"
	SchemeHTTPS  Scheme = "https"
	SchemeSOCKS5 Scheme = "socks5"
)

// Valid reports whether s is a known scheme.
func (s Scheme) Valid() bool {
	switch s {
	case SchemeHTTP, SchemeHTTPS, SchemeSOCKS5:
		return true
	}
	return false
}

// Key is the unique identity of a proxy. It deliberately excludes the
// upstream: two vendors returning the same endpoint share one lifecycle, and
// the first source keeps ownership (seed 000 §5).
type Key struct {
	Scheme            Scheme
	Host              string
	Port              uint16
	Username          string
	CredentialVersion string
}

// String renders the key without any secret; it is safe to log.
func (k Key) String() string {
	s := string(k.Scheme) + "://"
	if k.Username != "" {
		s += k.Username + "@"
	}
	s += hostPort(k.Host, k.Port)
	if k.CredentialVersion != "" {
		s += "#" + k.CredentialVersion
	}
	return s
}

func hostPort(host string, port uint16) string {
	for i := 0; i < len(host); i++ {
		if host[i] == ':' {
			return "[" + host + "]:" + strconv.Itoa(int(port))
		}
	}
	return host + ":" + strconv.Itoa(int(port))
}

// ID is a compact, stable identifier derived from the key.
type ID string

// Proxy is one upstream proxy as the pool knows it. Runtime counters (active,
// reserved) are not part of it: they live in the gateway's sharded counters.
type Proxy struct {
	ID               ID
	Key              Key
	Password         string // never logged; see LogValue
	Upstream         string // the source that owns this lifecycle
	CreatedAt        time.Time
	ExpiresAt        time.Time // hard expiry from the vendor
	UsableUntil      time.Time // ExpiresAt minus allocationSafetyMargin
	LastCheckedAt    time.Time
	LastSuccessAt    time.Time
	Latency          time.Duration
	MaxConcurrency   int64
	State            State
	ConsecutiveFails int
	Region           string
	Carrier          string
	Tags             map[string]string
	// Owner is the gateway worker that may allocate this proxy; only
	// unowned proxies can be extracted (seed 000 §10.3, §11).
	Owner             string
	ExtractedAt       time.Time
	ExtractedByClient string
}

// Addr is host:port of the proxy.
func (p *Proxy) Addr() string { return hostPort(p.Key.Host, p.Key.Port) }

// URL renders the proxy as a URL including credentials. Only the
// distribution API hands this out; never log it.
func (p *Proxy) URL() string {
	u := string(p.Key.Scheme) + "://"
	if p.Key.Username != "" {
		u += p.Key.Username
		if p.Password != "" {
			u += ":" + p.Password
		}
		u += "@"
	}
	return u + p.Addr()
}

// Usable reports whether a new allocation may start on p at now.
func (p *Proxy) Usable(now time.Time) bool {
	return p.State == StateAvailable && now.Before(p.UsableUntil)
}

// RemainingTTL is the time until hard expiry, never negative.
func (p *Proxy) RemainingTTL(now time.Time) time.Duration {
	if d := p.ExpiresAt.Sub(now); d > 0 {
		return d
	}
	return 0
}

// MakeID derives the ID from a key. The format is readable and has no secret.
func MakeID(k Key) ID { return ID(k.String()) }

// Candidate is what a provider adapter returns for one proxy, before the
// pool decides whether it becomes a managed Proxy.
type Candidate struct {
	Scheme    Scheme
	Host      string
	Port      uint16
	Username  string
	Password  string
	TTL       time.Duration // relative lifetime; used when ExpiresAt is zero
	ExpiresAt time.Time
	Region    string
	Carrier   string
	Tags      map[string]string
}

// Validate checks a candidate's fields; it does not classify the address
// (that is the SSRF guard's job, which needs the network stack).
func (c *Candidate) Validate() error {
	if !c.Scheme.Valid() {
		return fmt.Errorf("invalid scheme %q", c.Scheme)
	}
	if c.Host == "" || len(c.Host) > 253 {
		return fmt.Errorf("invalid host %q", c.Host)
	}
	if c.Port == 0 {
		return fmt.Errorf("invalid port 0")
	}
	if len(c.Username) > 255 || len(c.Password) > 255 {
		return fmt.Errorf("credentials longer than 255 bytes")
	}
	if c.TTL < 0 {
		return fmt.Errorf("negative ttl %s", c.TTL)
	}
	return nil
}

// Key returns the unique key of the candidate.
func (c *Candidate) Key() Key {
	return Key{Scheme: c.Scheme, Host: c.Host, Port: c.Port, Username: c.Username, CredentialVersion: credentialVersion(c.Password)}
}

// credentialVersion distinguishes a password rotation for the same username
// without putting the password into the key: a short FNV-1a digest.
func credentialVersion(password string) string {
	if password == "" {
		return ""
	}
	var h uint32 = 2166136261
	for i := 0; i < len(password); i++ {
		h ^= uint32(password[i])
		h *= 16777619
	}
	return strconv.FormatUint(uint64(h), 36)
}

// Expiry resolves the hard expiry of a candidate fetched at now, using
// defaultTTL when the vendor gave neither ttl nor expiresAt.
func (c *Candidate) Expiry(now time.Time, defaultTTL time.Duration) time.Time {
	switch {
	case !c.ExpiresAt.IsZero():
		return c.ExpiresAt
	case c.TTL > 0:
		return now.Add(c.TTL)
	default:
		return now.Add(defaultTTL)
	}
}
