package ingress

import (
	"encoding/base64"
	"net/netip"
	"strings"

	"github.com/proxypool/proxypool/engine/adapters/http/auth"
	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
)

// APIKeyHeader carries an API key for auth modes apiKey and any. It is the
// gateway's own header, always removed before forwarding, so a target's
// own X-Api-Key passes through untouched.
const APIKeyHeader = "X-Proxypool-Api-Key"

// SessionMarker separates the user from the sticky session id in a
// Proxy-Authorization username: "alice-session-42" authenticates as
// "alice" and asks for session "42" (seed 001 §4.1).
const SessionMarker = "-session-"

// Client is who a request comes from, after access, forwarding and auth.
type Client struct {
	// IP is the client address (X-Forwarded-For resolved through
	// trustedProxies).
	IP netip.Addr
	// Name is the authenticated principal ("anonymous" for mode none);
	// routing's client match and sticky sessions key on it.
	Name string
	// Anonymous: mode none accepted the client; per-client limits then
	// key on IP instead of Name.
	Anonymous bool
	// Session is the username-convention session id, "" when none.
	Session string
}

// credentials extracts what the client presented for the gateway:
//
//   - Proxy-Authorization: Basic user:pass — username/password; the
//     password also stands as the API key and bearer token, so clients
//     that can only put credentials in a proxy URL can use any mode; a
//     username "USER-session-ID" authenticates as USER with session ID;
//   - Proxy-Authorization: Bearer TOKEN — a bearer token;
//   - X-Proxypool-Api-Key: KEY — an API key.
func credentials(r *h1.Request, ip netip.Addr) (auth.Credentials, string) {
	c := auth.Credentials{RemoteIP: ip}
	var session string
	if v, ok := r.Get("Proxy-Authorization"); ok && len(v) <= maxBasicLen {
		h := string(v)
		if user, pass, ok := ParseBasic(h); ok {
			if i := strings.LastIndex(user, SessionMarker); i > 0 && i+len(SessionMarker) < len(user) {
				user, session = user[:i], user[i+len(SessionMarker):]
			}
			c.Username, c.Password, c.HasBasic = user, pass, true
			c.APIKey, c.Bearer = pass, pass
		} else if tok, ok := parseBearer(h); ok {
			c.Bearer = tok
		}
	}
	if k, ok := r.Get(APIKeyHeader); ok && len(k) > 0 {
		c.APIKey = string(k)
	}
	return c, session
}

// challenge is the Proxy-Authenticate value for a refused client of an
// authenticator accepting schemes.
func challenge(schemes []auth.Scheme) string {
	v := `Basic realm="proxypool"`
	for _, s := range schemes {
		if s == auth.SchemeBearer {
			v += `, Bearer realm="proxypool"`
		}
	}
	return v
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

func parseBearer(h string) (string, bool) {
	const prefix = "bearer "
	if len(h) <= len(prefix) || len(h) > maxBasicLen || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	tok := strings.TrimSpace(h[len(prefix):])
	return tok, tok != ""
}
