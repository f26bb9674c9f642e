// Command tck is the compatibility kit of ABI v1: a guest that exercises
// every export and every form of output, so a host (or a new SDK) can be
// checked against it. BuildRequest echoes what it received; ParseResponse
// returns what the "mode" param asks for.
package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/proxypool/proxypool/sdk"
)

func init() {
	sdk.Register(sdk.Plugin{
		Description: "compatibility kit",
		Params: []sdk.Param{
			{Name: "a", Required: true, Description: "any value"},
			{Name: "b", Default: "dflt"},
			{Name: "mode", Default: "echo"},
		},
		Secrets:       []string{"token", "other"},
		BuildRequest:  build,
		ParseResponse: parse,
	})
}

func main() {}

// Echo is what BuildRequest saw, returned as the request body.
type Echo struct {
	Params  map[string]string `json:"params"`
	Secrets map[string]string `json:"secrets"`
	Count   int               `json:"count"`
	Now     time.Time         `json:"now"`
	Clock   time.Time         `json:"clock"` // time.Now() inside the guest
}

func build(in sdk.BuildInput) (sdk.Request, error) {
	switch in.Params["mode"] {
	case "error":
		return sdk.Request{}, errors.New("plugin says no")
	case "vendor":
		return sdk.Request{}, &sdk.VendorError{Message: "not at build time"}
	case "panic":
		panic("build panic")
	case "empty-method":
		return sdk.Request{URL: "http://vendor.example/"}, nil
	case "bad-header":
		return sdk.Request{URL: "http://vendor.example/", Headers: map[string]string{"X-A": "1\r\nInjected: 1"}}, nil
	}
	body, err := json.Marshal(Echo{Params: in.Params, Secrets: in.Secrets, Count: in.Count, Now: in.Now, Clock: time.Now()})
	if err != nil {
		return sdk.Request{}, err
	}
	u, err := sdk.AddQuery("https://vendor.example/v1/echo?x=1", map[string]string{"count": strconv.Itoa(in.Count), "a": in.Params["a"]})
	if err != nil {
		return sdk.Request{}, err
	}
	return sdk.Request{
		Method:  "POST",
		URL:     u,
		Headers: map[string]string{"Content-Type": "application/json", "X-Params": joinMap(in.Params)},
		Body:    body,
	}, nil
}

// entry is a proxy as the "proxies" mode reads it from the body.
type entry struct {
	Scheme    string            `json:"scheme"`
	Host      string            `json:"host"`
	Port      int               `json:"port"`
	Username  string            `json:"username"`
	Password  string            `json:"password"`
	TTL       float64           `json:"ttl"`
	ExpiresAt time.Time         `json:"expiresAt"`
	Region    string            `json:"region"`
	Carrier   string            `json:"carrier"`
	Tags      map[string]string `json:"tags"`
}

func parse(r sdk.Response) (sdk.Result, error) {
	switch r.Params["mode"] {
	case "echo":
		return sdk.Result{Proxies: []sdk.Proxy{{
			Host: "203.0.113.1", Port: 8080,
			Tags: map[string]string{
				"status":  strconv.Itoa(r.Status),
				"header":  sdk.Header(r.Headers, "x-test"),
				"params":  joinMap(r.Params),
				"now":     r.Now.UTC().Format(time.RFC3339Nano),
				"clock":   time.Now().UTC().Format(time.RFC3339Nano),
				"bodyHex": hex.EncodeToString(r.Body[:min(len(r.Body), 100)]),
				"bodyLen": strconv.Itoa(len(r.Body)),
			},
		}}}, nil
	case "proxies":
		var es []entry
		if err := json.Unmarshal(r.Body, &es); err != nil {
			return sdk.Result{}, err
		}
		out := make([]sdk.Proxy, len(es))
		for i, e := range es {
			out[i] = sdk.Proxy{Scheme: e.Scheme, Host: e.Host, Port: e.Port, Username: e.Username, Password: e.Password,
				TTL: time.Duration(e.TTL * float64(time.Second)), ExpiresAt: e.ExpiresAt, Region: e.Region, Carrier: e.Carrier, Tags: e.Tags}
		}
		return sdk.Result{Proxies: out}, nil
	case "status":
		return sdk.Result{}, sdk.CheckStatus(r, 200, 204)
	case "vendor":
		return sdk.Result{}, &sdk.VendorError{Message: "balance exhausted"}
	case "entry":
		return sdk.Result{}, &sdk.EntryError{Index: 1, Field: "port", Err: errors.New("not a port")}
	case "retry":
		return sdk.Result{RetryAfter: 30 * time.Second}, nil
	case "panic":
		panic("parse panic")
	case "empty":
		return sdk.Result{}, nil
	}
	return sdk.Result{}, errors.New("unknown mode " + r.Params["mode"])
}

func joinMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + m[k])
	}
	return b.String()
}
