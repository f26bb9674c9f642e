// Package auth owns the credential checks shared by every client-facing
// surface of Proxy Pool (distribution API, admin API and, later, the
// gateway): the auth modes of config.Auth (none, usernamePassword, apiKey,
// bearer, ipWhitelist, any), registered by name, and the client-address
// rules (access.allowCIDRs, trustedProxies and X-Forwarded-For).
//
// It takes already-extracted inputs (peer address, basic user/password, API
// key, bearer token) so the HTTP APIs, which read Authorization, and the
// gateway, which reads Proxy-Authorization, share one implementation. It
// must never import net/http, the controller, the gateway or any store.
//
// Secrets are kept only as SHA-256 digests and compared in constant time,
// so neither a configured value nor the length of one leaks through timing.
package auth
