package sdk_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/sdk"
)

// A whole plugin: a vendor answering {"code":0,"data":[{"ip","port"}]}.
// In a plugin, the Register call sits in func init and main is empty; the
// functions are plain Go, so a test calls them directly.
func ExampleRegister() {
	p := sdk.Plugin{
		Description: `{"code":0,"data":[{"ip","port"}]}`,
		Params:      []sdk.Param{{Name: "url", Required: true}, {Name: "ttl", Default: "300"}},
		Secrets:     []string{"apiKey"},
		BuildRequest: func(in sdk.BuildInput) (sdk.Request, error) {
			u, err := sdk.AddQuery(in.Params["url"], map[string]string{"n": strconv.Itoa(in.Count), "key": in.Secrets["apiKey"]})
			return sdk.Request{URL: u}, err
		},
		ParseResponse: func(r sdk.Response) (sdk.Result, error) {
			if err := sdk.CheckStatus(r); err != nil {
				return sdk.Result{}, err
			}
			var body struct {
				Code int `json:"code"`
				Data []struct {
					IP   string     `json:"ip"`
					Port sdk.Number `json:"port"`
				} `json:"data"`
			}
			if err := json.Unmarshal(r.Body, &body); err != nil {
				return sdk.Result{}, fmt.Errorf("decoding body: %w", err)
			}
			if body.Code != 0 {
				return sdk.Result{}, &sdk.VendorError{Message: "code " + strconv.Itoa(body.Code)}
			}
			ttl, _ := strconv.Atoi(r.Params["ttl"])
			var res sdk.Result
			for i, e := range body.Data {
				port, err := e.Port.Port()
				if err != nil {
					return sdk.Result{}, &sdk.EntryError{Index: i, Field: "port", Err: err}
				}
				res.Proxies = append(res.Proxies, sdk.Proxy{Host: e.IP, Port: port, TTL: time.Duration(ttl) * time.Second})
			}
			return res, nil
		},
	}
	sdk.Register(p)

	req, _ := p.BuildRequest(sdk.BuildInput{Params: map[string]string{"url": "https://api.vendor.example/get"}, Secrets: map[string]string{"apiKey": "k"}, Count: 5})
	fmt.Println(req.URL)

	res, _ := p.ParseResponse(sdk.Response{Status: 200, Body: []byte(`{"code":0,"data":[{"ip":"203.0.113.7","port":"8080"}]}`), Params: map[string]string{"ttl": "300"}})
	fmt.Printf("%s:%d ttl %s\n", res.Proxies[0].Host, res.Proxies[0].Port, res.Proxies[0].TTL)

	_, err := p.ParseResponse(sdk.Response{Status: 200, Body: []byte(`{"code":7}`)})
	fmt.Println(err)
	// Output:
	// https://api.vendor.example/get?key=k&n=5
	// 203.0.113.7:8080 ttl 5m0s
	// vendor reported an error: code 7
}

func ExampleParseProxyLine() {
	for _, line := range []string{"203.0.113.10:8001:user1:pa:ss1", "[2001:db8::1]:8003", "alice:pw@proxy.example:7002", "203.0.113.10"} {
		p, err := sdk.ParseProxyLine(line)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Printf("host=%s port=%d user=%q pass=%q\n", p.Host, p.Port, p.Username, p.Password)
	}
	// Output:
	// host=203.0.113.10 port=8001 user="user1" pass="pa:ss1"
	// host=2001:db8::1 port=8003 user="" pass=""
	// host=proxy.example port=7002 user="alice" pass="pw"
	// error: want host:port or host:port:user:pass
}

func ExampleLines() {
	body := []byte("\xEF\xBB\xBF203.0.113.30:7001\r\n\r\n   \r\n203.0.113.31:7002")
	fmt.Printf("%q\n", sdk.Lines(body))
	// Output: ["203.0.113.30:7001" "203.0.113.31:7002"]
}

func ExampleCheckStatus() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	err := sdk.CheckStatus(sdk.Response{Status: 429, Headers: map[string]string{"Retry-After": "30"}, Now: now})
	var se *sdk.StatusError
	if errors.As(err, &se) {
		fmt.Println(se.Status, se.RetryAfter)
	}
	fmt.Println(sdk.CheckStatus(sdk.Response{Status: 204}, 200, 204))
	// Output:
	// 429 30s
	// <nil>
}

func ExampleAddQuery() {
	u, _ := sdk.AddQuery("https://api.vendor.example/v1/list?format=json", map[string]string{"count": "10", "key": "a&b"})
	fmt.Println(u)
	// Output: https://api.vendor.example/v1/list?count=10&format=json&key=a%26b
}

func ExampleNumber() {
	var e struct {
		Port sdk.Number `json:"port"`
		TTL  sdk.Number `json:"ttl"`
	}
	_ = json.Unmarshal([]byte(`{"port":"8080","ttl":90.5}`), &e)
	port, _ := e.Port.Port()
	ttl, _ := e.TTL.Seconds()
	fmt.Println(port, ttl)
	// Output: 8080 1m30.5s
}

func ExampleEntryError() {
	err := &sdk.EntryError{Index: 3, Field: "port", Err: errors.New("not a number")}
	fmt.Println(err)
	// Output: proxy 3: field port: not a number
}
