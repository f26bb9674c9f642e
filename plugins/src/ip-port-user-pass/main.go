// Command ip-port-user-pass reads plain-text vendor answers, one proxy per
// line:
//
//	203.0.113.10:8001:user1:pa:ss1
//	203.0.113.11:8002
//	[2001:db8::1]:8003:u3:p3
//	alice:pw@203.0.113.31:7002
//
// The password is everything after the third colon. Blank lines and a
// UTF-8 byte order mark are ignored; any other unreadable line fails the
// fetch (Error), naming the line. The vendor sends no lifetime: the ttl
// param (seconds; 0 = the upstream's pool.ttl) sets it.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o ip-port-user-pass.wasm .
package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/sdk"
)

// maxLines bounds the lines of one answer, as the host bounds proxies.
const maxLines = 10000

func init() {
	sdk.Register(sdk.Plugin{
		Description: "ip:port:user:pass per line",
		Params: []sdk.Param{
			{Name: "url", Required: true, Description: "endpoint, e.g. https://api.vendor.example/v1/proxies"},
			{Name: "countParam", Default: "count", Description: "name of the query parameter carrying the count"},
			{Name: "format", Default: "text", Description: "value of the format query parameter; empty to omit it"},
			{Name: "ttl", Default: "0", Description: "lifetime of each proxy in seconds; 0 = pool default"},
			{Name: "scheme", Default: "http", Description: "protocol of the returned proxies"},
		},
		Secrets:       []string{"apiKey"},
		BuildRequest:  buildRequest,
		ParseResponse: parseResponse,
	})
}

func main() {}

func buildRequest(in sdk.BuildInput) (sdk.Request, error) {
	count := in.Count
	if count <= 0 {
		count = 10
	}
	q := map[string]string{in.Params["countParam"]: strconv.Itoa(count)}
	if f := in.Params["format"]; f != "" {
		q["format"] = f
	}
	if k := in.Secrets["apiKey"]; k != "" {
		q["key"] = k
	}
	u, err := sdk.AddQuery(in.Params["url"], q)
	if err != nil {
		return sdk.Request{}, fmt.Errorf("param url: %w", err)
	}
	return sdk.Request{Method: "GET", URL: u}, nil
}

func parseResponse(r sdk.Response) (sdk.Result, error) {
	if err := sdk.CheckStatus(r); err != nil {
		return sdk.Result{}, err
	}
	ttl, err := ttlParam(r.Params["ttl"])
	if err != nil {
		return sdk.Result{}, err
	}
	lines := sdk.Lines(r.Body)
	if len(lines) > maxLines {
		return sdk.Result{}, fmt.Errorf("more than %d lines", maxLines)
	}
	out := make([]sdk.Proxy, 0, len(lines))
	for i, l := range lines {
		p, err := sdk.ParseProxyLine(l)
		if err != nil {
			// The line itself is not echoed: it may hold a password.
			return sdk.Result{}, fmt.Errorf("line %d: %w", i+1, err)
		}
		p.Scheme, p.TTL = r.Params["scheme"], ttl
		out = append(out, p)
	}
	return sdk.Result{Proxies: out}, nil
}

func ttlParam(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("param ttl: %q is not a number of seconds", s)
	}
	return time.Duration(n) * time.Second, nil
}
