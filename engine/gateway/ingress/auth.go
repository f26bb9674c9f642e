package ingress

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/proxypool/proxypool/engine/config"
)

// Principal is an authenticated client. Name feeds routing's client match;
// it is empty for anonymous clients.
type Principal struct {
	Name string
}

// Authenticator decides who a request comes from. It returns
// ErrAuthRequired (possibly wrapped) when the client must authenticate.
type Authenticator interface {
	Authenticate(r *http.Request) (Principal, error)
}

// ErrAuthRequired: missing or wrong credentials; the client gets 407.
var ErrAuthRequired = errors.New("authenticating client: proxy authentication required")

// AuthFactory builds an Authenticator from the gateway's auth section.
type AuthFactory func(a *config.Auth) (Authenticator, error)

var (
	authMu        sync.RWMutex
	authFactories = map[string]AuthFactory{}
)

// RegisterAuth makes an auth mode available by name. It is meant for
// init(); a duplicate name panics.
func RegisterAuth(mode string, f AuthFactory) {
	authMu.Lock()
	defer authMu.Unlock()
	if _, dup := authFactories[mode]; dup {
		panic("ingress: auth mode registered twice: " + mode)
	}
	authFactories[mode] = f
}

// AuthModes lists the registered modes, sorted.
func AuthModes() []string {
	authMu.RLock()
	defer authMu.RUnlock()
	out := make([]string, 0, len(authFactories))
	for m := range authFactories {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// NewAuthenticator builds the authenticator of a.Mode.
func NewAuthenticator(a *config.Auth) (Authenticator, error) {
	mode := a.Mode
	if mode == "" {
		mode = "none"
	}
	authMu.RLock()
	f := authFactories[mode]
	authMu.RUnlock()
	if f == nil {
		return nil, fmt.Errorf("building gateway auth: mode %q is not supported by the gateway (have %s)", mode, strings.Join(AuthModes(), ", "))
	}
	return f(a)
}

func init() {
	RegisterAuth("none", func(*config.Auth) (Authenticator, error) { return noAuth{}, nil })
	RegisterAuth("usernamePassword", newUserPassAuth)
}

type noAuth struct{}

func (noAuth) Authenticate(*http.Request) (Principal, error) { return Principal{}, nil }

// userPassAuth checks Basic credentials in Proxy-Authorization. Passwords
// are kept as SHA-256 digests and compared in constant time, so neither
// the comparison nor a heap dump gives them away cheaply.
type userPassAuth struct {
	users map[string][sha256.Size]byte
}

func newUserPassAuth(a *config.Auth) (Authenticator, error) {
	if len(a.Users) == 0 {
		return nil, errors.New("building gateway auth: usernamePassword needs at least one user")
	}
	u := &userPassAuth{users: make(map[string][sha256.Size]byte, len(a.Users))}
	for i := range a.Users {
		name := a.Users[i].Username
		if name == "" || strings.ContainsRune(name, ':') {
			return nil, fmt.Errorf("building gateway auth: user %d: invalid username", i)
		}
		u.users[name] = sha256.Sum256([]byte(a.Users[i].Password.Value()))
	}
	return u, nil
}

// dummyDigest keeps the work done for an unknown user the same as for a
// known one.
var dummyDigest = sha256.Sum256([]byte("proxypool: no such user"))

func (u *userPassAuth) Authenticate(r *http.Request) (Principal, error) {
	user, pass, ok := ParseBasic(r.Header.Get("Proxy-Authorization"))
	if !ok {
		return Principal{}, ErrAuthRequired
	}
	want, known := u.users[user]
	if !known {
		want = dummyDigest
	}
	got := sha256.Sum256([]byte(pass))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 || !known {
		return Principal{}, ErrAuthRequired
	}
	return Principal{Name: user}, nil
}

// maxBasicLen bounds the credentials we decode (the header size is bounded
// too; this keeps the decode buffer small whatever that limit is).
const maxBasicLen = 1024

// ParseBasic parses a "Basic base64(user:pass)" credential. The scheme is
// case-insensitive; the username may not contain ':'.
func ParseBasic(h string) (user, pass string, ok bool) {
	const prefix = "basic "
	if len(h) <= len(prefix) || len(h) > maxBasicLen || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimLeft(h[len(prefix):], " "))
	if err != nil {
		return "", "", false
	}
	user, pass, ok = strings.Cut(string(raw), ":")
	if !ok || user == "" {
		return "", "", false
	}
	return user, pass, true
}

var _ Authenticator = noAuth{}
var _ Authenticator = (*userPassAuth)(nil)
