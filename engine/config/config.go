// Package config owns the YAML configuration of Proxy Pool: the schema, its
// defaults, strict decoding, validation that reports every error with its
// path, and secret references. It builds an immutable *Config; reload
// compares two of them. It must not import any engine component.
package config

import (
	"time"
)

// Defaults. Each is named so the documentation and the validation messages
// can refer to it.
const (
	DefaultGatewayAddr       = "127.0.0.1:8080"
	DefaultDistributionAddr  = "127.0.0.1:8081"
	DefaultAdminAddr         = "127.0.0.1:8082"
	DefaultStateDir          = "/var/lib/proxypool"
	DefaultPluginsDir        = "/etc/proxypool/plugins"
	DefaultShutdownTimeout   = 30 * time.Second
	DefaultRequestInterval   = 2 * time.Second
	DefaultFetchTimeout      = 10 * time.Second
	DefaultMaxInFlight       = 1
	DefaultEmptyThreshold    = 3
	DefaultEstimatedIPs      = 10
	DefaultMaxResponseBytes  = 4 << 20
	DefaultBackoffInitial    = time.Second
	DefaultBackoffMax        = 5 * time.Minute
	DefaultPoolMinimum       = 5
	DefaultPoolTarget        = 20
	DefaultPoolMaxSize       = 200
	DefaultProxyTTL          = 5 * time.Minute
	DefaultSafetyMargin      = 15 * time.Second
	DefaultMaxConcurrency    = 32
	DefaultCheckInterval     = 30 * time.Second
	DefaultCheckTimeout      = 5 * time.Second
	DefaultFailureThreshold  = 3
	DefaultCheckMaxInFlight  = 64
	DefaultAnonymity         = "anonymous"
	DefaultTargetStatus      = 200
	DefaultMaxHeaderBytes    = 32 << 10
	DefaultMaxHeaderCount    = 100
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 90 * time.Second
	DefaultDialTimeout       = 10 * time.Second
	DefaultResponseTimeout   = 30 * time.Second
	DefaultMaxConns          = 10000
	DefaultMaxStaleAge       = 2 * time.Minute
	DefaultRetryAttempts     = 2
	DefaultWaitTimeout       = 2 * time.Second
	DefaultMinRemainingTTL   = 30 * time.Second
	DefaultMaxHealthAge      = 5 * time.Minute
	DefaultIdempotencyTTL    = 10 * time.Minute
	DefaultMaxExtractCount   = 100
	DefaultMaxBodyBytes      = 64 << 10
	// DefaultLeaderTTL is storage.redis.leaderTTL: a crashed fetch leader
	// is replaced within it.
	DefaultLeaderTTL = 10 * time.Second
	// DefaultHeartbeatInterval is storage.redis.heartbeatInterval; a
	// worker counts as live for three intervals after its last beat.
	DefaultHeartbeatInterval = 5 * time.Second
)

// Bounds of the cluster coordination timings. A leader lease is renewed
// on the provider runtime's one-second cycle, so it must span a few of
// them; past ten minutes a crashed leader would starve its upstream.
const (
	MinLeaderTTL         = 3 * time.Second
	MaxLeaderTTL         = 10 * time.Minute
	MinHeartbeatInterval = time.Second
	MaxHeartbeatInterval = time.Minute
)

// Config is the whole configuration. After Load it is immutable: reload
// builds a new one and swaps it.
type Config struct {
	Listeners    Listeners     `yaml:"listeners"`
	StateDir     string        `yaml:"stateDir"`
	PluginsDir   string        `yaml:"pluginsDir"`
	Strict       *bool         `yaml:"strict"`
	Log          Log           `yaml:"log"`
	Storage      Storage       `yaml:"storage"`
	Gateway      Gateway       `yaml:"gateway"`
	Distribution Surface       `yaml:"distribution"`
	Admin        Surface       `yaml:"admin"`
	Upstreams    []Upstream    `yaml:"upstreams"`
	Routings     []Routing     `yaml:"routings"`
	Extraction   Extraction    `yaml:"extraction"`
	Checker      Checker       `yaml:"checker"`
	Security     Security      `yaml:"security"`
	Shutdown     time.Duration `yaml:"shutdownTimeout"`
	// Demo starts testenv's simulated vendor, upstream proxies and target
	// in-process. It exists for `make run` only, requires
	// security.allowLoopbackDestinations, and the packaged sample never has it.
	Demo *Demo `yaml:"demo"`

	// Source is the file the config was read from (not part of YAML).
	Source string `yaml:"-"`
	// Digest is the SHA-256 of the file's bytes, recorded as the revision
	// fingerprint (the cluster store keys it with an HMAC instead).
	Digest string `yaml:"-"`
}

// Listeners are the addresses the appliance binds. An empty address
// disables that listener (metrics then share the admin listener).
type Listeners struct {
	Gateway      string `yaml:"gateway"`
	Distribution string `yaml:"distribution"`
	Admin        string `yaml:"admin"`
	Metrics      string `yaml:"metrics"`
	GRPC         string `yaml:"grpc"`
}

// Log configures log/slog.
type Log struct {
	Level  string `yaml:"level"`  // debug | info | warn | error
	Format string `yaml:"format"` // text | json
}

// Storage selects the store implementations.
type Storage struct {
	Mode     string `yaml:"mode"` // embedded | cluster
	Redis    Redis  `yaml:"redis"`
	Postgres PG     `yaml:"postgres"`
}

// Redis is the cluster activity-pool store.
type Redis struct {
	URL      string `yaml:"url"` // redis:// or rediss:// (TLS)
	Password Secret `yaml:"password"`
	TLS      TLS    `yaml:"tls"`
	// LeaderTTL is the provider fetch leader lease's TTL (cluster mode):
	// renewed once half of it is left, it bounds how long an upstream has
	// no fetcher after its leader crashed.
	LeaderTTL time.Duration `yaml:"leaderTTL"`
	// HeartbeatInterval paces the worker heartbeats (cluster mode).
	HeartbeatInterval time.Duration `yaml:"heartbeatInterval"`
}

// PG is the cluster management store.
type PG struct {
	URL      string `yaml:"url"`
	Password Secret `yaml:"password"`
	TLS      TLS    `yaml:"tls"`
	// MigrateOnStart applies pending migrations when the store opens;
	// without it a schema behind the binary refuses to start
	// (`proxy-controller migrate up` applies them).
	MigrateOnStart bool `yaml:"migrateOnStart"`
	// FingerprintKey is the HMAC-SHA-256 key of config revision
	// fingerprints; every controller of a fleet must share it (seed 000
	// §14). Required in cluster mode.
	FingerprintKey Secret `yaml:"fingerprintKey"`
}

// TLS configures a client connection to a storage server. Enabled with no
// files uses the system roots; CertFile and KeyFile (both or neither) add a
// client certificate.
type TLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"caFile"`
	CertFile   string `yaml:"certFile"`
	KeyFile    string `yaml:"keyFile"`
	ServerName string `yaml:"serverName"`
	// InsecureSkipVerify disables server verification; for tests only.
	InsecureSkipVerify bool `yaml:"insecureSkipVerify"`
}

// Auth configures how one surface authenticates its clients.
type Auth struct {
	Mode    string   `yaml:"mode"` // none | usernamePassword | apiKey | bearer | ipWhitelist | any
	Users   []User   `yaml:"users"`
	APIKeys []APIKey `yaml:"apiKeys"`
	Tokens  []APIKey `yaml:"bearerTokens"`
	// IPs are the client CIDRs accepted by ipWhitelist.
	IPs []string `yaml:"ips"`
}

// User is one username/password principal.
type User struct {
	Username string `yaml:"username"`
	Password Secret `yaml:"password"`
}

// APIKey is a named key or bearer token.
type APIKey struct {
	Name string `yaml:"name"`
	Key  Secret `yaml:"key"`
}

// Access restricts which client addresses may connect at all, independent
// of authentication.
type Access struct {
	AllowCIDRs []string `yaml:"allowCIDRs"`
}

// Surface is the distribution or admin HTTP API.
type Surface struct {
	Auth           Auth     `yaml:"auth"`
	Access         Access   `yaml:"access"`
	TrustedProxies []string `yaml:"trustedProxies"`
	MaxBodyBytes   int64    `yaml:"maxBodyBytes"`
}

// Gateway configures the data plane listener.
type Gateway struct {
	Auth           Auth          `yaml:"auth"`
	Access         Access        `yaml:"access"`
	TrustedProxies []string      `yaml:"trustedProxies"`
	Limits         GatewayLimits `yaml:"limits"`
	// MaxStaleAge stops new traffic when no snapshot arrived for this long.
	MaxStaleAge time.Duration `yaml:"maxStaleAge"`
	// TunnelSplice copies CONNECT tunnels with splice(2) through pooled
	// pipes (Linux) instead of through buffers.
	TunnelSplice bool `yaml:"tunnelSplice"`
}

// GatewayLimits bounds every resource a client can hold.
type GatewayLimits struct {
	MaxHeaderBytes     int           `yaml:"maxHeaderBytes"`
	MaxHeaderCount     int           `yaml:"maxHeaderCount"`
	ReadHeaderTimeout  time.Duration `yaml:"readHeaderTimeout"`
	IdleTimeout        time.Duration `yaml:"idleTimeout"`
	DialTimeout        time.Duration `yaml:"dialTimeout"`
	ResponseTimeout    time.Duration `yaml:"responseHeaderTimeout"`
	MaxConns           int           `yaml:"maxConns"`
	MaxConnsPerClient  int           `yaml:"maxConnsPerClient"`
	RequestsPerSecond  float64       `yaml:"requestsPerSecondPerClient"`
	MaxIdleConnsPerUps int           `yaml:"maxIdleConnsPerUpstreamProxy"`
}

// Upstream is one provider of proxies.
type Upstream struct {
	Name     string    `yaml:"name"`
	Enabled  *bool     `yaml:"enabled"`
	Provider Provider  `yaml:"provider"`
	Fetch    Fetch     `yaml:"fetch"`
	Pool     Pool      `yaml:"pool"`
	Check    Check     `yaml:"check"`
	Tags     StringMap `yaml:"tags"`
}

// IsEnabled applies the default (enabled).
func (u *Upstream) IsEnabled() bool { return u.Enabled == nil || *u.Enabled }

// StringMap is a YAML mapping of strings.
type StringMap map[string]string

// Provider names the adapter plugin and its inputs.
type Provider struct {
	Plugin  string            `yaml:"plugin"`
	Params  StringMap         `yaml:"params"`
	Secrets map[string]Secret `yaml:"secrets"`
}

// Fetch bounds how the controller calls the provider.
type Fetch struct {
	RequestInterval     time.Duration `yaml:"requestInterval"`
	Timeout             time.Duration `yaml:"timeout"`
	MaxInFlight         int           `yaml:"maxInFlight"`
	MaxTotal            int64         `yaml:"maxTotal"` // 0 = unlimited
	EstimatedIPsPerCall int           `yaml:"estimatedIPsPerCall"`
	EmptyThreshold      int           `yaml:"emptyThreshold"`
	MaxResponseBytes    int64         `yaml:"maxResponseBytes"`
	Backoff             Backoff       `yaml:"backoff"`
}

// Backoff is exponential with full jitter between Initial and Max.
type Backoff struct {
	Initial time.Duration `yaml:"initial"`
	Max     time.Duration `yaml:"max"`
}

// Pool sizes the upstream's share of the activity pool.
type Pool struct {
	Minimum                int           `yaml:"minimum"`
	Target                 int           `yaml:"target"`
	MaxSize                int           `yaml:"maxSize"`
	DefaultTTL             time.Duration `yaml:"defaultTTL"`
	AllocationSafetyMargin time.Duration `yaml:"allocationSafetyMargin"`
	MaxConcurrency         int64         `yaml:"maxConcurrency"`
}

// Check is the health-check policy.
// Checker bounds the health checker every upstream shares.
type Checker struct {
	// MaxPerSecond bounds the checks started per second across every
	// upstream, so that checking a bulk import of new proxies (each check
	// a connection and a CONNECT) cannot take the CPU the gateway needs;
	// 0 means no bound.
	MaxPerSecond float64 `yaml:"maxPerSecond"`
}

type Check struct {
	Interval         time.Duration `yaml:"interval"`
	Timeout          time.Duration `yaml:"timeout"`
	FailureThreshold int           `yaml:"failureThreshold"`
	MaxInFlight      int           `yaml:"maxInFlight"`
	// ProbeTarget is the host:port the BASIC check asks each proxy to
	// CONNECT to; empty: the proxy's own address.
	ProbeTarget string `yaml:"probeTarget"`
	// EgressURL, when set, adds the EGRESS check: a request through the
	// proxy to this echo service, which must answer with what it received
	// (JSON with the remote address and headers, or the caller's IP as
	// text). It records the exit IP and whether our address or proxy
	// headers leaked.
	EgressURL string `yaml:"egressURL"`
	// Anonymity is what the EGRESS check requires: transparent (anything),
	// anonymous (our address never leaks; the default) or elite (no Via,
	// X-Forwarded-For or Forwarded either).
	Anonymity string `yaml:"anonymity"`
}

// Anonymity levels of check.anonymity.
var AnonymityLevels = []string{"transparent", "anonymous", "elite"}

// RoutingCheck is a routing's TARGET check: a request to URL through each
// proxy the routing may use. A proxy failing it is excluded from this
// routing only.
type RoutingCheck struct {
	URL          string        `yaml:"url"`
	ExpectStatus int           `yaml:"expectStatus"`
	Interval     time.Duration `yaml:"interval"`
}

// Routing is one first-match rule.
type Routing struct {
	Name          string        `yaml:"name"`
	Match         Match         `yaml:"match"`
	Upstreams     []string      `yaml:"upstreams"`
	Strategy      string        `yaml:"strategy"`    // leastConnections | sequential
	OnExhausted   string        `yaml:"onExhausted"` // sequential: stop | loop | stayLast
	OnUnavailable string        `yaml:"onUnavailable"`
	WaitTimeout   time.Duration `yaml:"waitTimeout"`
	Tags          StringMap     `yaml:"tags"` // proxies must carry these tags
	Sticky        Sticky        `yaml:"sticky"`
	Retry         Retry         `yaml:"retry"`
	// Check, when set, runs a TARGET check for this routing.
	Check *RoutingCheck `yaml:"check"`
	// MaxInFlight bounds the requests and tunnels one gateway worker
	// carries for this routing at once (admission before a proxy is
	// chosen); 0 means no bound beyond the proxies' own limits.
	MaxInFlight int `yaml:"maxInFlight"`
}

// Match selects requests; every set field must match. An empty Match
// matches everything.
type Match struct {
	Hosts   []string `yaml:"hosts"` // exact or "*.suffix"
	Ports   []int    `yaml:"ports"`
	Clients []string `yaml:"clients"`
}

// Sticky keeps a client session on one proxy.
type Sticky struct {
	Header     string `yaml:"header"`
	MaxEntries int    `yaml:"maxEntries"`
}

// Retry bounds safe retries of idempotent requests.
type Retry struct {
	MaxAttempts int `yaml:"maxAttempts"`
}

// Extraction configures the distribution API.
type Extraction struct {
	MinRemainingTTL   time.Duration `yaml:"minRemainingTTL"`
	MaxHealthCheckAge time.Duration `yaml:"maxHealthCheckAge"`
	ReserveForGateway int           `yaml:"reserveForGateway"`
	IdempotencyTTL    time.Duration `yaml:"idempotencyTTL"`
	MaxCount          int           `yaml:"maxCount"`
	// PerClientPerMinute limits how many proxies one client may extract.
	PerClientPerMinute int `yaml:"perClientPerMinute"`
}

// Security holds destination policy.
type Security struct {
	DeniedCIDRs []string `yaml:"deniedCIDRs"`
	// AllowLoopbackDestinations lets the gateway and checker reach loopback
	// targets and accept loopback proxies. Tests and the demo set it; a
	// production config never should.
	AllowLoopbackDestinations bool `yaml:"allowLoopbackDestinations"`
}

// Demo describes the in-process simulations `make run` starts.
type Demo struct {
	UpstreamProxies int    `yaml:"upstreamProxies"`
	VendorAddr      string `yaml:"vendorAddr"`
	TargetAddr      string `yaml:"targetAddr"`
}

// StrictMode applies the default (on).
func (c *Config) StrictMode() bool { return c.Strict == nil || *c.Strict }

// Upstream returns the named upstream or nil.
func (c *Config) Upstream(name string) *Upstream {
	for i := range c.Upstreams {
		if c.Upstreams[i].Name == name {
			return &c.Upstreams[i]
		}
	}
	return nil
}
