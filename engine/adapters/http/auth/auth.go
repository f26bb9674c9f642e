package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/netip"
	"sort"
	"sync"

	"github.com/proxypool/proxypool/engine/config"
)

// Credentials is what a client presented, already extracted from its
// protocol. Empty strings mean "not presented".
type Credentials struct {
	// RemoteIP is the client address after trusted-proxy resolution.
	RemoteIP netip.Addr
	Username string
	Password string
	// HasBasic reports that username/password were presented at all, so an
	// empty password can still be checked (and refused).
	HasBasic bool
	APIKey   string
	Bearer   string
}

// Principal is the authenticated client. Name is what audit logs record
// and per-client limits key on; it never contains a secret.
type Principal struct {
	Name   string
	Method string // the mode that accepted the client
}

// Scheme is an HTTP authentication scheme a client may answer a challenge
// with.
type Scheme string

// Schemes the built-in modes accept.
const (
	SchemeBasic  Scheme = "Basic"
	SchemeBearer Scheme = "Bearer"
	// SchemeAPIKey is not an IANA scheme; it tells a client to send the
	// X-API-Key header.
	SchemeAPIKey Scheme = "ApiKey"
)

// Mode names, as in config.Auth.Mode.
const (
	ModeNone             = "none"
	ModeUsernamePassword = "usernamePassword"
	ModeAPIKey           = "apiKey"
	ModeBearer           = "bearer"
	ModeIPWhitelist      = "ipWhitelist"
	ModeAny              = "any"
)

// AnonymousPrincipal is the principal of mode none.
const AnonymousPrincipal = "anonymous"

// Authenticator decides whether presented credentials identify a client.
// Implementations are immutable and safe for concurrent use; reload builds
// a new one.
type Authenticator interface {
	Authenticate(c Credentials) (Principal, bool)
	// Schemes lists the challenges a refused client could answer; empty
	// when no credential can help (none, ipWhitelist), in which case the
	// caller answers 403 rather than 401.
	Schemes() []Scheme
}

// Constructor builds an Authenticator from one surface's auth config.
type Constructor func(a config.Auth) (Authenticator, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Constructor{}
)

// Register makes an auth mode available by name. It is meant to be called
// from init; registering an empty name, a nil constructor or a name twice
// panics, because either is a programming error found at start-up.
func Register(mode string, c Constructor) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if mode == "" {
		panic("auth: Register with an empty mode name")
	}
	if c == nil {
		panic("auth: Register " + mode + " with a nil constructor")
	}
	if _, dup := registry[mode]; dup {
		panic("auth: mode " + mode + " registered twice")
	}
	registry[mode] = c
}

// Modes lists the registered mode names, sorted.
func Modes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for m := range registry {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// New builds the Authenticator for a.Mode. An empty mode is an error, not
// "none": config applies that default, and a caller that skipped it must
// not end up with an open surface by accident.
func New(a config.Auth) (Authenticator, error) {
	registryMu.RLock()
	c, ok := registry[a.Mode]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("building authenticator: unknown auth mode %q (registered: %v)", a.Mode, Modes())
	}
	au, err := c(a)
	if err != nil {
		return nil, fmt.Errorf("building authenticator %s: %w", a.Mode, err)
	}
	return au, nil
}

func init() {
	Register(ModeNone, newNone)
	Register(ModeUsernamePassword, newUserPass)
	Register(ModeAPIKey, func(a config.Auth) (Authenticator, error) {
		return newKeys(ModeAPIKey, "apiKeys", SchemeAPIKey, a.APIKeys, func(c Credentials) string { return c.APIKey })
	})
	Register(ModeBearer, func(a config.Auth) (Authenticator, error) {
		return newKeys(ModeBearer, "bearerTokens", SchemeBearer, a.Tokens, func(c Credentials) string { return c.Bearer })
	})
	Register(ModeIPWhitelist, newIPList)
	Register(ModeAny, newAny)
}

// digest is the fixed-length form in which secrets are kept and compared:
// equal lengths make subtle.ConstantTimeCompare independent of the
// configured secret's length.
type digest [sha256.Size]byte

func digestOf(s string) digest { return sha256.Sum256([]byte(s)) }

func (d *digest) equal(o *digest) int { return subtle.ConstantTimeCompare(d[:], o[:]) }

type none struct{}

func newNone(config.Auth) (Authenticator, error) { return none{}, nil }

func (none) Authenticate(Credentials) (Principal, bool) {
	return Principal{Name: AnonymousPrincipal, Method: ModeNone}, true
}
func (none) Schemes() []Scheme { return nil }

type userEntry struct {
	name     string
	user, pw digest
}

type userPass struct{ users []userEntry }

func newUserPass(a config.Auth) (Authenticator, error) {
	if len(a.Users) == 0 {
		return nil, fmt.Errorf("no users configured")
	}
	u := &userPass{users: make([]userEntry, 0, len(a.Users))}
	for i, cu := range a.Users {
		if cu.Username == "" {
			return nil, fmt.Errorf("users[%d]: empty username", i)
		}
		// An unresolved or empty secret would accept an empty password.
		if cu.Password.Value() == "" {
			return nil, fmt.Errorf("users[%d] (%s): password is empty or unresolved", i, cu.Username)
		}
		u.users = append(u.users, userEntry{name: cu.Username, user: digestOf(cu.Username), pw: digestOf(cu.Password.Value())})
	}
	return u, nil
}

func (u *userPass) Authenticate(c Credentials) (Principal, bool) {
	if !c.HasBasic || c.Username == "" || c.Password == "" {
		return Principal{}, false
	}
	user, pw := digestOf(c.Username), digestOf(c.Password)
	// Every entry is compared so the time taken does not say which user
	// exists or where it is in the list.
	match := -1
	for i := range u.users {
		ok := u.users[i].user.equal(&user) & u.users[i].pw.equal(&pw)
		match = subtle.ConstantTimeSelect(ok, i, match)
	}
	if match < 0 {
		return Principal{}, false
	}
	return Principal{Name: u.users[match].name, Method: ModeUsernamePassword}, true
}

func (*userPass) Schemes() []Scheme { return []Scheme{SchemeBasic} }

type keyEntry struct {
	name string
	key  digest
}

type keys struct {
	mode    string
	scheme  Scheme
	entries []keyEntry
	pick    func(Credentials) string
}

func newKeys(mode, field string, scheme Scheme, list []config.APIKey, pick func(Credentials) string) (Authenticator, error) {
	if len(list) == 0 {
		return nil, fmt.Errorf("no %s configured", field)
	}
	k := &keys{mode: mode, scheme: scheme, pick: pick, entries: make([]keyEntry, 0, len(list))}
	for i, ck := range list {
		if ck.Key.Value() == "" {
			return nil, fmt.Errorf("%s[%d]: key is empty or unresolved", field, i)
		}
		name := ck.Name
		if name == "" {
			// The principal must be nameable in the audit log without
			// revealing the key.
			name = fmt.Sprintf("%s[%d]", field, i)
		}
		k.entries = append(k.entries, keyEntry{name: name, key: digestOf(ck.Key.Value())})
	}
	return k, nil
}

func (k *keys) Authenticate(c Credentials) (Principal, bool) {
	v := k.pick(c)
	if v == "" {
		return Principal{}, false
	}
	d := digestOf(v)
	match := -1
	for i := range k.entries {
		match = subtle.ConstantTimeSelect(k.entries[i].key.equal(&d), i, match)
	}
	if match < 0 {
		return Principal{}, false
	}
	return Principal{Name: k.entries[match].name, Method: k.mode}, true
}

func (k *keys) Schemes() []Scheme { return []Scheme{k.scheme} }

type ipList struct{ prefixes []netip.Prefix }

func newIPList(a config.Auth) (Authenticator, error) {
	if len(a.IPs) == 0 {
		return nil, fmt.Errorf("no ips configured")
	}
	ps, err := ParsePrefixes(a.IPs)
	if err != nil {
		return nil, fmt.Errorf("ips: %w", err)
	}
	return &ipList{prefixes: ps}, nil
}

func (l *ipList) Authenticate(c Credentials) (Principal, bool) {
	if !Contains(l.prefixes, c.RemoteIP) {
		return Principal{}, false
	}
	return Principal{Name: "ip:" + Normalize(c.RemoteIP).String(), Method: ModeIPWhitelist}, true
}

func (*ipList) Schemes() []Scheme { return nil }

// anyOf accepts a client that any configured mode accepts, in a fixed
// order so the principal of a client presenting several credentials is
// deterministic.
type anyOf struct {
	members []Authenticator
	schemes []Scheme
}

func newAny(a config.Auth) (Authenticator, error) {
	parts := []struct {
		mode string
		set  bool
	}{
		{ModeUsernamePassword, len(a.Users) > 0},
		{ModeAPIKey, len(a.APIKeys) > 0},
		{ModeBearer, len(a.Tokens) > 0},
		{ModeIPWhitelist, len(a.IPs) > 0},
	}
	out := &anyOf{}
	for _, p := range parts {
		if !p.set {
			continue
		}
		sub := a
		sub.Mode = p.mode
		m, err := New(sub)
		if err != nil {
			return nil, err
		}
		out.members = append(out.members, m)
		out.schemes = append(out.schemes, m.Schemes()...)
	}
	if len(out.members) == 0 {
		return nil, fmt.Errorf("no users, apiKeys, bearerTokens or ips configured")
	}
	return out, nil
}

func (a *anyOf) Authenticate(c Credentials) (Principal, bool) {
	for _, m := range a.members {
		if p, ok := m.Authenticate(c); ok {
			return p, true
		}
	}
	return Principal{}, false
}

func (a *anyOf) Schemes() []Scheme { return a.schemes }

var (
	_ Authenticator = none{}
	_ Authenticator = (*userPass)(nil)
	_ Authenticator = (*keys)(nil)
	_ Authenticator = (*ipList)(nil)
	_ Authenticator = (*anyOf)(nil)
)
