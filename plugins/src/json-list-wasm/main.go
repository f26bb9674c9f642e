// Command json-list-wasm is the WASM twin of plugins/json-list.yaml: a bare
// JSON array of proxy objects,
//
//	[{"ip":"203.0.113.7","port":8000,"user":"u","pass":"p","ttl":300}]
//
// where port and ttl may be numbers or numeric strings and user/pass may be
// null. Other fields of an entry are ignored. A body that is not an array
// is a vendor error.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o json-list-wasm.wasm .
package main

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/proxypool/proxypool/sdk"
)

func init() {
	sdk.Register(sdk.Plugin{
		Description: `[{"ip","port","user","pass","ttl"}]`,
		Params: []sdk.Param{
			{Name: "url", Required: true, Description: "endpoint returning the array"},
			{Name: "countParam", Default: "num", Description: "name of the query parameter carrying the count"},
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
	u, err := sdk.AddQuery(in.Params["url"], map[string]string{in.Params["countParam"]: strconv.Itoa(count)})
	if err != nil {
		return sdk.Request{}, fmt.Errorf("param url: %w", err)
	}
	h := map[string]string{"Accept": "application/json"}
	if k := in.Secrets["apiKey"]; k != "" {
		h["X-Api-Key"] = k
	}
	return sdk.Request{Method: "GET", URL: u, Headers: h}, nil
}

func parseResponse(r sdk.Response) (sdk.Result, error) {
	if err := sdk.CheckStatus(r); err != nil {
		return sdk.Result{}, err
	}
	var body any
	if err := json.Unmarshal(sdk.TrimBOM(r.Body), &body); err != nil {
		return sdk.Result{}, fmt.Errorf("decoding json body: %w", err)
	}
	list, ok := body.([]any)
	if !ok {
		return sdk.Result{}, &sdk.VendorError{Message: "response is not a json array"}
	}
	out := make([]sdk.Proxy, 0, len(list))
	for i, v := range list {
		p, err := toProxy(v, r.Params["scheme"])
		if err != nil {
			err.Index = i
			return sdk.Result{}, err
		}
		out = append(out, p)
	}
	return sdk.Result{Proxies: out}, nil
}

func toProxy(v any, scheme string) (sdk.Proxy, *sdk.EntryError) {
	e, ok := v.(map[string]any)
	if !ok {
		return sdk.Proxy{}, &sdk.EntryError{Err: fmt.Errorf("entry of type %s, want an object", jsonType(v))}
	}
	p := sdk.Proxy{Scheme: scheme}
	var err error
	if p.Host, err = str(e["ip"]); err != nil {
		return sdk.Proxy{}, &sdk.EntryError{Field: "host", Err: err}
	}
	if p.Username, err = str(e["user"]); err != nil {
		return sdk.Proxy{}, &sdk.EntryError{Field: "username", Err: err}
	}
	if p.Password, err = str(e["pass"]); err != nil {
		return sdk.Proxy{}, &sdk.EntryError{Field: "password", Err: err}
	}
	port, err := num(e["port"])
	if err == nil {
		p.Port, err = port.Port()
	}
	if err != nil {
		return sdk.Proxy{}, &sdk.EntryError{Field: "port", Err: err}
	}
	ttl, err := num(e["ttl"])
	if err == nil {
		p.TTL, err = ttl.Seconds()
	}
	if err != nil {
		return sdk.Proxy{}, &sdk.EntryError{Field: "ttl", Err: err}
	}
	return p, nil
}

// str reads a string field; absent and null are "".
func str(v any) (string, error) {
	switch s := v.(type) {
	case nil:
		return "", nil
	case string:
		return s, nil
	}
	return "", fmt.Errorf("value of type %s, want string", jsonType(v))
}

// num reads a number or numeric string field; absent, null and "" are 0.
func num(v any) (sdk.Number, error) {
	var n sdk.Number
	switch x := v.(type) {
	case nil:
		return 0, nil
	case float64:
		return sdk.Number(x), nil
	case string:
		b, _ := json.Marshal(x)
		err := n.UnmarshalJSON(b)
		return n, err
	}
	return 0, fmt.Errorf("value of type %s, want a number", jsonType(v))
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	}
	return "object"
}
