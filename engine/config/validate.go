package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"
)

func (c *Config) applyDefaults() {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	defD := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	defI := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.StateDir, DefaultStateDir)
	def(&c.PluginsDir, DefaultPluginsDir)
	def(&c.Log.Level, "info")
	def(&c.Log.Format, "text")
	def(&c.Storage.Mode, "embedded")
	defD(&c.Storage.Redis.LeaderTTL, DefaultLeaderTTL)
	defD(&c.Storage.Redis.HeartbeatInterval, DefaultHeartbeatInterval)
	defD(&c.Shutdown, DefaultShutdownTimeout)
	for _, a := range []*Auth{&c.Gateway.Auth, &c.Distribution.Auth, &c.Admin.Auth} {
		def(&a.Mode, "none")
	}
	for _, s := range []*Surface{&c.Distribution, &c.Admin} {
		if s.MaxBodyBytes == 0 {
			s.MaxBodyBytes = DefaultMaxBodyBytes
		}
	}
	l := &c.Gateway.Limits
	defI(&l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	defI(&l.MaxHeaderCount, DefaultMaxHeaderCount)
	defD(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	defD(&l.IdleTimeout, DefaultIdleTimeout)
	defD(&l.DialTimeout, DefaultDialTimeout)
	defD(&l.ResponseTimeout, DefaultResponseTimeout)
	defI(&l.MaxConns, DefaultMaxConns)
	defI(&l.MaxIdleConnsPerUps, 16)
	defD(&c.Gateway.MaxStaleAge, DefaultMaxStaleAge)
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		f := &u.Fetch
		defD(&f.RequestInterval, DefaultRequestInterval)
		defD(&f.Timeout, DefaultFetchTimeout)
		defI(&f.MaxInFlight, DefaultMaxInFlight)
		defI(&f.EstimatedIPsPerCall, DefaultEstimatedIPs)
		defI(&f.EmptyThreshold, DefaultEmptyThreshold)
		if f.MaxResponseBytes == 0 {
			f.MaxResponseBytes = DefaultMaxResponseBytes
		}
		defD(&f.Backoff.Initial, DefaultBackoffInitial)
		defD(&f.Backoff.Max, DefaultBackoffMax)
		p := &u.Pool
		defI(&p.Minimum, DefaultPoolMinimum)
		defI(&p.Target, max(DefaultPoolTarget, p.Minimum))
		defI(&p.MaxSize, max(DefaultPoolMaxSize, p.Target))
		defD(&p.DefaultTTL, DefaultProxyTTL)
		defD(&p.AllocationSafetyMargin, DefaultSafetyMargin)
		if p.MaxConcurrency == 0 {
			p.MaxConcurrency = DefaultMaxConcurrency
		}
		k := &u.Check
		defD(&k.Interval, DefaultCheckInterval)
		defD(&k.Timeout, DefaultCheckTimeout)
		defI(&k.FailureThreshold, DefaultFailureThreshold)
		defI(&k.MaxInFlight, DefaultCheckMaxInFlight)
		def(&k.Anonymity, DefaultAnonymity)
	}
	if len(c.Routings) == 0 && len(c.Upstreams) > 0 {
		// No routing: one catch-all rule over every upstream, so a config
		// with just a provider is already usable.
		r := Routing{Name: "default"}
		for _, u := range c.Upstreams {
			r.Upstreams = append(r.Upstreams, u.Name)
		}
		c.Routings = []Routing{r}
	}
	for i := range c.Routings {
		r := &c.Routings[i]
		def(&r.Strategy, "leastConnections")
		def(&r.OnUnavailable, "reject")
		if r.Strategy == "sequential" {
			def(&r.OnExhausted, "stop")
		}
		defD(&r.WaitTimeout, DefaultWaitTimeout)
		defI(&r.Retry.MaxAttempts, DefaultRetryAttempts)
		if r.Sticky.Header != "" {
			defI(&r.Sticky.MaxEntries, 10000)
		}
		if r.Check != nil {
			defI(&r.Check.ExpectStatus, DefaultTargetStatus)
			defD(&r.Check.Interval, DefaultCheckInterval)
		}
	}
	e := &c.Extraction
	defD(&e.MinRemainingTTL, DefaultMinRemainingTTL)
	defD(&e.MaxHealthCheckAge, DefaultMaxHealthAge)
	defD(&e.IdempotencyTTL, DefaultIdempotencyTTL)
	defI(&e.MaxCount, DefaultMaxExtractCount)
}

// validator collects errors with their paths.
type validator struct{ errs Errors }

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) positive(path string, d time.Duration) {
	if d <= 0 {
		v.add(path, "must be positive, got %s", d)
	}
}

func (v *validator) within(path string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		v.add(path, "must be between %s and %s, got %s", lo, hi, d)
	}
}

func (v *validator) atLeast(path string, n, min int) {
	if n < min {
		v.add(path, "must be at least %d, got %d", min, n)
	}
}

func (v *validator) oneOf(path, got string, allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	v.add(path, "must be one of %s, got %q", strings.Join(allowed, " | "), got)
}

func (v *validator) addr(path, a string, required bool) {
	if a == "" {
		if required {
			v.add(path, "is required")
		}
		return
	}
	if _, port, err := net.SplitHostPort(a); err != nil {
		v.add(path, "must be host:port: %v", err)
	} else if port == "" {
		v.add(path, "missing port")
	}
}

func (v *validator) cidrs(path string, list []string) {
	for i, s := range list {
		if _, err := netip.ParsePrefix(s); err != nil {
			if _, err2 := netip.ParseAddr(s); err2 != nil {
				v.add(fmt.Sprintf("%s[%d]", path, i), "not a CIDR or address: %q", s)
			}
		}
	}
}

func (v *validator) secret(path string, s *Secret, required bool) {
	if s.IsZero() {
		if required {
			v.add(path, "is required (env:NAME or file:/path)")
		}
		return
	}
	if _, err := ParseSecretRef(s.ref); err != nil {
		v.add(path, "%v", err)
		return
	}
	if err := s.Resolve(); err != nil {
		v.add(path, "%v", err)
	}
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// AuthModes are the accepted auth.mode values.
var AuthModes = []string{"none", "usernamePassword", "apiKey", "bearer", "ipWhitelist", "any"}

func (v *validator) auth(path string, a *Auth) {
	v.oneOf(path+".mode", a.Mode, AuthModes...)
	for i := range a.Users {
		p := fmt.Sprintf("%s.users[%d]", path, i)
		if a.Users[i].Username == "" {
			v.add(p+".username", "is required")
		}
		v.secret(p+".password", &a.Users[i].Password, true)
	}
	for i := range a.APIKeys {
		v.secret(fmt.Sprintf("%s.apiKeys[%d].key", path, i), &a.APIKeys[i].Key, true)
	}
	for i := range a.Tokens {
		v.secret(fmt.Sprintf("%s.bearerTokens[%d].key", path, i), &a.Tokens[i].Key, true)
	}
	v.cidrs(path+".ips", a.IPs)
	need := map[string]bool{
		"usernamePassword": len(a.Users) == 0,
		"apiKey":           len(a.APIKeys) == 0,
		"bearer":           len(a.Tokens) == 0,
		"ipWhitelist":      len(a.IPs) == 0,
		"any":              len(a.Users)+len(a.APIKeys)+len(a.Tokens)+len(a.IPs) == 0,
	}
	if need[a.Mode] {
		v.add(path, "mode %s needs at least one credential or address", a.Mode)
	}
}

func (c *Config) validate() Errors {
	v := &validator{}
	v.addr("listeners.gateway", c.Listeners.Gateway, false)
	v.addr("listeners.distribution", c.Listeners.Distribution, false)
	v.addr("listeners.admin", c.Listeners.Admin, false)
	v.addr("listeners.metrics", c.Listeners.Metrics, false)
	v.addr("listeners.grpc", c.Listeners.GRPC, false)
	if c.Listeners.Gateway == "" && c.Listeners.Distribution == "" && c.Listeners.Admin == "" {
		v.add("listeners", "at least one of gateway, distribution, admin is required")
	}
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "text", "json")
	v.oneOf("storage.mode", c.Storage.Mode, "embedded", "cluster")
	if c.Storage.Mode == "cluster" {
		if c.Storage.Redis.URL == "" {
			v.add("storage.redis.url", "is required in cluster mode")
		}
		if c.Storage.Postgres.URL == "" {
			v.add("storage.postgres.url", "is required in cluster mode")
		}
	}
	v.secret("storage.redis.password", &c.Storage.Redis.Password, false)
	v.secret("storage.postgres.password", &c.Storage.Postgres.Password, false)
	v.secret("storage.postgres.fingerprintKey", &c.Storage.Postgres.FingerprintKey, c.Storage.Mode == "cluster")
	v.storageURL("storage.redis.url", c.Storage.Redis.URL, "redis", "rediss")
	v.storageURL("storage.postgres.url", c.Storage.Postgres.URL, "postgres", "postgresql")
	v.tls("storage.redis.tls", &c.Storage.Redis.TLS)
	v.within("storage.redis.leaderTTL", c.Storage.Redis.LeaderTTL, MinLeaderTTL, MaxLeaderTTL)
	v.within("storage.redis.heartbeatInterval", c.Storage.Redis.HeartbeatInterval, MinHeartbeatInterval, MaxHeartbeatInterval)
	v.tls("storage.postgres.tls", &c.Storage.Postgres.TLS)
	v.positive("shutdownTimeout", c.Shutdown)

	v.auth("gateway.auth", &c.Gateway.Auth)
	v.cidrs("gateway.access.allowCIDRs", c.Gateway.Access.AllowCIDRs)
	v.cidrs("gateway.trustedProxies", c.Gateway.TrustedProxies)
	l := c.Gateway.Limits
	v.atLeast("gateway.limits.maxHeaderBytes", l.MaxHeaderBytes, 1024)
	v.atLeast("gateway.limits.maxHeaderCount", l.MaxHeaderCount, 8)
	v.positive("gateway.limits.readHeaderTimeout", l.ReadHeaderTimeout)
	v.positive("gateway.limits.idleTimeout", l.IdleTimeout)
	v.positive("gateway.limits.dialTimeout", l.DialTimeout)
	v.positive("gateway.limits.responseHeaderTimeout", l.ResponseTimeout)
	v.atLeast("gateway.limits.maxConns", l.MaxConns, 1)
	v.atLeast("gateway.limits.maxConnsPerClient", l.MaxConnsPerClient, 0)
	if l.RequestsPerSecond < 0 {
		v.add("gateway.limits.requestsPerSecondPerClient", "must not be negative")
	}
	v.positive("gateway.maxStaleAge", c.Gateway.MaxStaleAge)
	for name, s := range map[string]*Surface{"distribution": &c.Distribution, "admin": &c.Admin} {
		v.auth(name+".auth", &s.Auth)
		v.cidrs(name+".access.allowCIDRs", s.Access.AllowCIDRs)
		v.cidrs(name+".trustedProxies", s.TrustedProxies)
		if s.MaxBodyBytes < 0 {
			v.add(name+".maxBodyBytes", "must not be negative")
		}
	}
	if c.StrictMode() {
		c.validateStrict(v)
	}

	names := map[string]bool{}
	for i := range c.Upstreams {
		c.validateUpstream(v, i, names)
	}
	routings := map[string]bool{}
	for i := range c.Routings {
		c.validateRouting(v, i, names, routings)
	}
	// Below one check a second a typo would stall checking (new proxies
	// never become AVAILABLE): 0 or 1 to 1,000,000.
	if r := c.Checker.MaxPerSecond; r != 0 && (r < 1 || r > 1e6 || r != r) {
		v.add("checker.maxPerSecond", "must be 0 (no bound) or between 1 and 1000000, got %v", r)
	}
	e := c.Extraction
	v.positive("extraction.minRemainingTTL", e.MinRemainingTTL)
	v.positive("extraction.maxHealthCheckAge", e.MaxHealthCheckAge)
	v.positive("extraction.idempotencyTTL", e.IdempotencyTTL)
	v.atLeast("extraction.reserveForGateway", e.ReserveForGateway, 0)
	v.atLeast("extraction.maxCount", e.MaxCount, 1)
	v.atLeast("extraction.perClientPerMinute", e.PerClientPerMinute, 0)
	v.cidrs("security.deniedCIDRs", c.Security.DeniedCIDRs)
	if c.Demo != nil {
		if !c.Security.AllowLoopbackDestinations {
			v.add("demo", "requires security.allowLoopbackDestinations: true (the simulations listen on loopback)")
		}
		v.atLeast("demo.upstreamProxies", c.Demo.UpstreamProxies, 1)
		v.addr("demo.vendorAddr", c.Demo.VendorAddr, false)
		v.addr("demo.targetAddr", c.Demo.TargetAddr, false)
	}
	return v.errs
}

// validateStrict refuses an open proxy: a listener reachable from other
// hosts with no authentication and no address allow-list.
func (c *Config) validateStrict(v *validator) {
	check := func(path, addr string, a *Auth, acc *Access) {
		if addr == "" || a.Mode != "none" || len(acc.AllowCIDRs) > 0 {
			return
		}
		if !IsLoopbackListener(addr) {
			v.add(path, "strict mode: %s listens beyond loopback with auth none and no access.allowCIDRs", addr)
		}
	}
	check("listeners.gateway", c.Listeners.Gateway, &c.Gateway.Auth, &c.Gateway.Access)
	check("listeners.distribution", c.Listeners.Distribution, &c.Distribution.Auth, &c.Distribution.Access)
	check("listeners.admin", c.Listeners.Admin, &c.Admin.Auth, &c.Admin.Access)
}

// IsLoopbackListener reports whether addr binds only a loopback address.
// An empty host or an unspecified address binds every interface.
func IsLoopbackListener(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func (c *Config) validateUpstream(v *validator, i int, names map[string]bool) {
	u := &c.Upstreams[i]
	p := fmt.Sprintf("upstreams[%d]", i)
	switch {
	case u.Name == "":
		v.add(p+".name", "is required")
	case !nameRE.MatchString(u.Name):
		v.add(p+".name", "%q must match %s", u.Name, nameRE)
	case names[u.Name]:
		v.add(p+".name", "duplicate upstream %q", u.Name)
	}
	names[u.Name] = true
	if u.Provider.Plugin == "" {
		v.add(p+".provider.plugin", "is required")
	}
	for k := range u.Provider.Secrets {
		s := u.Provider.Secrets[k]
		v.secret(p+".provider.secrets."+k, &s, true)
		u.Provider.Secrets[k] = s
	}
	f := u.Fetch
	v.positive(p+".fetch.requestInterval", f.RequestInterval)
	v.positive(p+".fetch.timeout", f.Timeout)
	v.atLeast(p+".fetch.maxInFlight", f.MaxInFlight, 1)
	if f.MaxTotal < 0 {
		v.add(p+".fetch.maxTotal", "must not be negative (0 means unlimited)")
	}
	v.atLeast(p+".fetch.estimatedIPsPerCall", f.EstimatedIPsPerCall, 1)
	v.atLeast(p+".fetch.emptyThreshold", f.EmptyThreshold, 1)
	if f.MaxResponseBytes < 1024 || f.MaxResponseBytes > 64<<20 {
		v.add(p+".fetch.maxResponseBytes", "must be between 1024 and %d, got %d", 64<<20, f.MaxResponseBytes)
	}
	v.positive(p+".fetch.backoff.initial", f.Backoff.Initial)
	if f.Backoff.Max < f.Backoff.Initial {
		v.add(p+".fetch.backoff.max", "must not be below backoff.initial (%s)", f.Backoff.Initial)
	}
	pl := u.Pool
	v.atLeast(p+".pool.minimum", pl.Minimum, 0)
	if pl.Target < pl.Minimum {
		v.add(p+".pool.target", "must be at least pool.minimum (%d), got %d", pl.Minimum, pl.Target)
	}
	if pl.MaxSize < pl.Target {
		v.add(p+".pool.maxSize", "must be at least pool.target (%d), got %d", pl.Target, pl.MaxSize)
	}
	v.positive(p+".pool.defaultTTL", pl.DefaultTTL)
	if pl.AllocationSafetyMargin < 0 || pl.AllocationSafetyMargin >= pl.DefaultTTL {
		v.add(p+".pool.allocationSafetyMargin", "must be in [0, defaultTTL), got %s", pl.AllocationSafetyMargin)
	}
	if pl.MaxConcurrency < 1 || pl.MaxConcurrency > 1<<20 {
		v.add(p+".pool.maxConcurrency", "must be between 1 and %d, got %d", 1<<20, pl.MaxConcurrency)
	}
	k := u.Check
	v.positive(p+".check.interval", k.Interval)
	v.positive(p+".check.timeout", k.Timeout)
	v.atLeast(p+".check.failureThreshold", k.FailureThreshold, 1)
	v.atLeast(p+".check.maxInFlight", k.MaxInFlight, 1)
	v.addr(p+".check.probeTarget", k.ProbeTarget, false)
	if k.EgressURL != "" {
		v.checkURL(p+".check.egressURL", k.EgressURL)
	}
	v.oneOf(p+".check.anonymity", k.Anonymity, AnonymityLevels...)
}

// checkURL accepts an absolute http or https URL with a host and no
// credentials (they would end up in logs and observations).
func (v *validator) checkURL(path, s string) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		v.add(path, "not a URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		v.add(path, "must be an http or https URL, got %q", s)
	case u.Host == "" || u.Hostname() == "":
		v.add(path, "must name a host, got %q", s)
	case u.User != nil:
		v.add(path, "must not carry credentials")
	}
}

func (c *Config) validateRouting(v *validator, i int, upstreams, seen map[string]bool) {
	r := &c.Routings[i]
	p := fmt.Sprintf("routings[%d]", i)
	switch {
	case r.Name == "":
		v.add(p+".name", "is required")
	case !nameRE.MatchString(r.Name):
		v.add(p+".name", "%q must match %s", r.Name, nameRE)
	case seen[r.Name]:
		v.add(p+".name", "duplicate routing %q", r.Name)
	}
	seen[r.Name] = true
	v.oneOf(p+".strategy", r.Strategy, "leastConnections", "sequential")
	v.oneOf(p+".onUnavailable", r.OnUnavailable, "reject", "wait", "direct")
	if r.Strategy == "sequential" {
		v.oneOf(p+".onExhausted", r.OnExhausted, "stop", "loop", "stayLast")
		if len(r.Upstreams) < 2 {
			v.add(p+".upstreams", "sequential needs at least two upstreams, got %d", len(r.Upstreams))
		}
	} else if r.OnExhausted != "" {
		v.add(p+".onExhausted", "only applies to strategy sequential")
	}
	if len(r.Upstreams) == 0 {
		v.add(p+".upstreams", "is required")
	}
	dup := map[string]bool{}
	for j, name := range r.Upstreams {
		switch {
		case !upstreams[name]:
			v.add(fmt.Sprintf("%s.upstreams[%d]", p, j), "unknown upstream %q", name)
		case dup[name]:
			v.add(fmt.Sprintf("%s.upstreams[%d]", p, j), "upstream %q listed twice", name)
		}
		dup[name] = true
	}
	for j, h := range r.Match.Hosts {
		if h == "" || strings.Count(h, "*") > 1 || (strings.Contains(h, "*") && !strings.HasPrefix(h, "*.")) {
			v.add(fmt.Sprintf("%s.match.hosts[%d]", p, j), "%q must be a host name or *.suffix", h)
		}
	}
	for j, port := range r.Match.Ports {
		if port < 1 || port > 65535 {
			v.add(fmt.Sprintf("%s.match.ports[%d]", p, j), "port %d out of range", port)
		}
	}
	v.positive(p+".waitTimeout", r.WaitTimeout)
	if r.Retry.MaxAttempts < 1 || r.Retry.MaxAttempts > 2 {
		v.add(p+".retry.maxAttempts", "must be 1 or 2, got %d", r.Retry.MaxAttempts)
	}
	if r.Sticky.Header != "" {
		v.atLeast(p+".sticky.maxEntries", r.Sticky.MaxEntries, 1)
	}
	v.atLeast(p+".maxInFlight", r.MaxInFlight, 0)
	if k := r.Check; k != nil {
		if k.URL == "" {
			v.add(p+".check.url", "is required")
		} else {
			v.checkURL(p+".check.url", k.URL)
		}
		if k.ExpectStatus < 100 || k.ExpectStatus > 599 {
			v.add(p+".check.expectStatus", "must be an HTTP status 100..599, got %d", k.ExpectStatus)
		}
		v.positive(p+".check.interval", k.Interval)
	}
}

// storageURL checks the scheme of a storage server URL and that it carries
// no password: passwords are secret references (storage.*.password).
func (v *validator) storageURL(path, s string, schemes ...string) {
	if s == "" {
		return
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Parse echoes the input, which may hold a password.
		v.add(path, "not a URL")
		return
	}
	ok := false
	for _, sc := range schemes {
		ok = ok || u.Scheme == sc
	}
	if !ok {
		v.add(path, "scheme must be one of %s, got %q", strings.Join(schemes, ", "), u.Scheme)
	}
	if _, set := u.User.Password(); set {
		v.add(path, "must not carry a password; use the password secret reference")
	}
}

// tls checks that the files a storage TLS block names exist.
func (v *validator) tls(path string, t *TLS) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.add(path, "certFile and keyFile go together")
	}
	for _, f := range []struct{ name, file string }{{"caFile", t.CAFile}, {"certFile", t.CertFile}, {"keyFile", t.KeyFile}} {
		if f.file == "" {
			continue
		}
		if _, err := os.Stat(f.file); err != nil {
			v.add(path+"."+f.name, "%v", err)
		}
	}
}
