package sdk

import (
	"fmt"
	"sync"
	"time"
)

// ABIVersion is the version of the host ABI this SDK implements.
const ABIVersion = 1

// BuildInput is what the host hands BuildRequest.
type BuildInput struct {
	// Params are the upstream's params: exactly the declared ones, with
	// defaults applied by the host.
	Params map[string]string
	// Secrets holds every declared secret, "" when the upstream sets none.
	// Never put a secret into an error or a log line.
	Secrets map[string]string
	// Count is how many proxies the controller wants; it may be 0.
	Count int
	// Now is the fetch time. It is also what time.Now returns inside the
	// plugin during the call: the sandbox has no other clock.
	Now time.Time
}

// Request is the HTTP call the plugin asks the host to perform.
type Request struct {
	Method  string // GET when empty
	URL     string // absolute http or https URL
	Headers map[string]string
	Body    []byte
}

// Response is what the host received for the Request.
type Response struct {
	Status int
	// Headers hold the first value of each header, under canonical names
	// (Retry-After, Content-Type); Header looks one up case-insensitively.
	Headers map[string]string
	Body    []byte
	// Params are the upstream's params as given to BuildRequest, declared
	// defaults applied; secrets are not handed to parsing.
	Params map[string]string
	// Now is the time the response arrived.
	Now time.Time
}

// Proxy is one proxy a response yields.
type Proxy struct {
	Scheme   string // http (default), https or socks5
	Host     string // IP literal (brackets allowed for IPv6) or DNS name
	Port     int    // 1..65535
	Username string
	Password string
	// TTL is the lifetime from now; ExpiresAt, if set, is the vendor's
	// hard expiry and wins. Both zero: the upstream's configured pool.ttl.
	TTL       time.Duration
	ExpiresAt time.Time
	Region    string
	Carrier   string
	Tags      map[string]string
}

// Result is the plugin's reading of a response. An empty Proxies with a nil
// error is an empty fetch.
type Result struct {
	Proxies []Proxy
	// RetryAfter asks the host to wait before the next call (0: no hint).
	RetryAfter time.Duration
}

// Param declares one parameter of the plugin.
type Param struct {
	Name        string
	Required    bool
	Default     string // used when the upstream does not set it
	Description string
}

// Plugin is what a plugin registers.
type Plugin struct {
	// Description is shown by `proxypool plugin test` and config checks.
	Description string
	// Params are the params the plugin accepts. The host refuses an
	// upstream that sets an undeclared one or misses a required one, and
	// applies defaults.
	Params []Param
	// Secrets are the names of the secrets the plugin accepts.
	Secrets []string

	BuildRequest  func(BuildInput) (Request, error)
	ParseResponse func(Response) (Result, error)
}

var registered struct {
	sync.Mutex
	p   *Plugin
	err error // why the registration is unusable
}

// Register installs the plugin. Call it once, from init. It panics on a
// second call or a Plugin without functions: both are programming errors
// that the first test run shows.
func Register(p Plugin) {
	if p.BuildRequest == nil || p.ParseResponse == nil {
		panic("sdk: Register needs BuildRequest and ParseResponse")
	}
	if err := checkDeclarations(p); err != nil {
		panic("sdk: Register: " + err.Error())
	}
	registered.Lock()
	defer registered.Unlock()
	if registered.p != nil {
		panic("sdk: Register called twice")
	}
	registered.p = &p
}

func current() (*Plugin, error) {
	registered.Lock()
	defer registered.Unlock()
	if registered.p == nil {
		return nil, fmt.Errorf("no plugin registered: call sdk.Register from an init function")
	}
	return registered.p, nil
}

// Bounds of a declaration; the host checks the same.
const (
	maxDeclared     = 64
	maxNameLen      = 64
	maxDescription  = 1 << 10
	maxDefaultBytes = 4 << 10
)

func checkDeclarations(p Plugin) error {
	if len(p.Description) > maxDescription {
		return fmt.Errorf("description longer than %d bytes", maxDescription)
	}
	if len(p.Params) > maxDeclared || len(p.Secrets) > maxDeclared {
		return fmt.Errorf("more than %d params or secrets", maxDeclared)
	}
	seen := map[string]bool{}
	for _, prm := range p.Params {
		if err := checkName(prm.Name); err != nil {
			return fmt.Errorf("param: %w", err)
		}
		if seen[prm.Name] {
			return fmt.Errorf("param %s declared twice", prm.Name)
		}
		seen[prm.Name] = true
		if len(prm.Default) > maxDefaultBytes || len(prm.Description) > maxDescription {
			return fmt.Errorf("param %s: default or description too long", prm.Name)
		}
	}
	seen = map[string]bool{}
	for _, s := range p.Secrets {
		if err := checkName(s); err != nil {
			return fmt.Errorf("secret: %w", err)
		}
		if seen[s] {
			return fmt.Errorf("secret %s declared twice", s)
		}
		seen[s] = true
	}
	return nil
}

// checkName accepts what a YAML key in an upstream's params can reasonably
// be: letters, digits, '_', '-' and '.', starting with a letter.
func checkName(n string) error {
	if n == "" || len(n) > maxNameLen {
		return fmt.Errorf("name %q: want 1 to %d characters", n, maxNameLen)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case (c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') && i > 0:
		default:
			return fmt.Errorf("name %q: want letters, digits, '_', '-' and '.', starting with a letter", n)
		}
	}
	return nil
}

// StatusError is an HTTP status the plugin does not accept. The host counts
// it as a failed fetch and honours RetryAfter as a back-off hint.
type StatusError struct {
	Status     int
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("unexpected http status %d (retry after %s)", e.Status, e.RetryAfter)
	}
	return fmt.Sprintf("unexpected http status %d", e.Status)
}

// VendorError is an error the vendor reported inside an accepted response:
// a non-zero code in a JSON envelope, an "insufficient balance" text.
type VendorError struct {
	Message string
}

func (e *VendorError) Error() string { return "vendor reported an error: " + e.Message }

// EntryError is one proxy entry of a response that cannot be read. Index is
// the entry's position; Field is empty when the entry as a whole is wrong.
type EntryError struct {
	Index int
	Field string
	Err   error
}

func (e *EntryError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("proxy %d: %v", e.Index, e.Err)
	}
	return fmt.Sprintf("proxy %d: field %s: %v", e.Index, e.Field, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }
