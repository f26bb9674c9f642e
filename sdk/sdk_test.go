package sdk

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// withPlugin installs p for one test, bypassing Register's once-only rule.
func withPlugin(t *testing.T, p *Plugin) {
	t.Helper()
	registered.Lock()
	prev := registered.p
	registered.p = p
	registered.Unlock()
	t.Cleanup(func() {
		registered.Lock()
		registered.p = prev
		registered.Unlock()
	})
}

var now = time.Date(2026, 11, 29, 22, 51, 3, 5, time.UTC)

func TestHandleBuild(t *testing.T) {
	var seen BuildInput
	withPlugin(t, &Plugin{
		BuildRequest: func(in BuildInput) (Request, error) {
			seen = in
			switch in.Params["mode"] {
			case "status":
				return Request{}, &StatusError{Status: 401}
			case "vendor":
				return Request{}, &VendorError{Message: "v"}
			case "panic":
				panic("boom")
			}
			return Request{URL: "http://v.example/", Body: []byte{0, 1}}, nil
		},
		ParseResponse: func(Response) (Result, error) { return Result{}, nil },
	})
	cases := []struct {
		name, input, want string
	}{
		{"ok", `{"params":{"mode":"ok"},"secrets":{"k":"s"},"count":3,"now":"2026-11-29T22:51:03.000000005Z"}`,
			`{"request":{"method":"GET","url":"http://v.example/","body":"AAE="}}`},
		{"status", `{"params":{"mode":"status"}}`, `{"error":{"kind":"status","message":"unexpected http status 401","status":401}}`},
		{"vendor", `{"params":{"mode":"vendor"}}`, `{"error":{"kind":"vendor","message":"v"}}`},
		{"panic", `{"params":{"mode":"panic"}}`, `{"error":{"kind":"plugin","message":"building request: plugin panicked: boom"}}`},
		{"bad input", `{`, `{"error":{"kind":"plugin","message":"decoding host input: unexpected end of JSON input"}}`},
		{"no input", ``, `{"error":{"kind":"plugin","message":"decoding host input: unexpected end of JSON input"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(handleBuild([]byte(tc.input))); got != tc.want {
				t.Fatalf("output %s\nwant %s", got, tc.want)
			}
		})
	}
	want := BuildInput{Params: map[string]string{"mode": "ok"}, Secrets: map[string]string{"k": "s"}, Count: 3, Now: now}
	handleBuild([]byte(cases[0].input))
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("plugin saw %+v, want %+v", seen, want)
	}
}

func TestHandleParse(t *testing.T) {
	var seen Response
	withPlugin(t, &Plugin{
		BuildRequest: func(BuildInput) (Request, error) { return Request{}, nil },
		ParseResponse: func(r Response) (Result, error) {
			seen = r
			switch string(r.Body) {
			case "429":
				return Result{}, CheckStatus(Response{Status: 429, Headers: map[string]string{"retry-after": "9"}})
			case "retry":
				return Result{RetryAfter: 2 * time.Hour}, errors.New("slow down")
			case "panic":
				panic("boom")
			}
			return Result{Proxies: []Proxy{
				{Scheme: "HTTPS", Host: "[2001:db8::1]", Port: 443, TTL: 1500 * time.Millisecond, ExpiresAt: now,
					Tags: map[string]string{"b": "2", "a": "<&>"}},
				{Host: "203.0.113.1", Port: 80},
			}, RetryAfter: 3 * time.Second}, nil
		},
	})
	cases := []struct {
		name, input, body, want string
	}{
		{"ok", `{"status":200,"headers":{"X":"1"},"params":{"p":"v"},"now":"2026-11-29T22:51:03.000000005Z"}`, "ok",
			`{"proxies":[{"scheme":"https","host":"2001:db8::1","port":443,"expiresAt":"2026-11-29T22:51:03.000000005Z","ttlSeconds":1.5,"tags":{"a":"<&>","b":"2"}},{"host":"203.0.113.1","port":80}],"retryAfterSeconds":3}`},
		{"status", `{"status":200}`, "429", `{"proxies":[],"retryAfterSeconds":9,"error":{"kind":"status","message":"unexpected http status 429 (retry after 9s)","status":429}}`},
		{"error keeps the retry hint, capped", `{"status":200}`, "retry", `{"proxies":[],"retryAfterSeconds":3600,"error":{"kind":"plugin","message":"slow down"}}`},
		{"panic", `{"status":200}`, "panic", `{"proxies":[],"error":{"kind":"plugin","message":"parsing response: plugin panicked: boom"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(handleParse([]byte(tc.input), []byte(tc.body))); got != tc.want {
				t.Fatalf("output %s\nwant %s", got, tc.want)
			}
		})
	}
	handleParse([]byte(cases[0].input), []byte("ok"))
	want := Response{Status: 200, Headers: map[string]string{"X": "1"}, Body: []byte("ok"), Params: map[string]string{"p": "v"}, Now: now}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("plugin saw %+v, want %+v", seen, want)
	}
}

func TestHandleWithoutRegistration(t *testing.T) {
	withPlugin(t, nil)
	for name, out := range map[string][]byte{
		"describe": handleDescribe(),
		"build":    handleBuild([]byte(`{}`)),
		"parse":    handleParse([]byte(`{}`), nil),
	} {
		if !strings.Contains(string(out), "no plugin registered: call sdk.Register") {
			t.Errorf("%s: %s", name, out)
		}
	}
}

func TestHandleDescribe(t *testing.T) {
	withPlugin(t, &Plugin{
		Description: "d",
		Params:      []Param{{Name: "url", Required: true, Description: "u"}, {Name: "n", Default: "1"}},
		Secrets:     []string{"apiKey"},
	})
	want := `{"description":"d","params":[{"name":"url","required":true,"description":"u"},{"name":"n","default":"1"}],"secrets":["apiKey"]}`
	if got := string(handleDescribe()); got != want {
		t.Fatalf("describe %s\nwant %s", got, want)
	}
}

func TestRegisterRefuses(t *testing.T) {
	fn := Plugin{
		BuildRequest:  func(BuildInput) (Request, error) { return Request{}, nil },
		ParseResponse: func(Response) (Result, error) { return Result{}, nil },
	}
	cases := []struct {
		name string
		p    Plugin
		want string
	}{
		{"no functions", Plugin{}, "needs BuildRequest and ParseResponse"},
		{"bad param name", with(fn, func(p *Plugin) { p.Params = []Param{{Name: "1x"}} }), "param: name"},
		{"duplicate param", with(fn, func(p *Plugin) { p.Params = []Param{{Name: "a"}, {Name: "a"}} }), "declared twice"},
		{"bad secret", with(fn, func(p *Plugin) { p.Secrets = []string{""} }), "secret: name"},
		{"long description", with(fn, func(p *Plugin) { p.Description = strings.Repeat("x", 2000) }), "description longer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), tc.want) {
					t.Fatalf("recovered %v, want a panic containing %q", r, tc.want)
				}
			}()
			Register(tc.p)
		})
	}
	t.Run("twice", func(t *testing.T) {
		withPlugin(t, &fn)
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "twice") {
				t.Fatalf("recovered %v", r)
			}
		}()
		Register(fn)
	})
}

func with(p Plugin, f func(*Plugin)) Plugin {
	f(&p)
	return p
}

func TestParseProxyLine(t *testing.T) {
	cases := []struct {
		line    string
		want    Proxy
		wantErr string
	}{
		{line: "203.0.113.10:8001", want: Proxy{Host: "203.0.113.10", Port: 8001}},
		{line: " 203.0.113.10:8001:u:p:w ", want: Proxy{Host: "203.0.113.10", Port: 8001, Username: "u", Password: "p:w"}},
		{line: "[2001:db8::1]:8003:u3:p3", want: Proxy{Host: "2001:db8::1", Port: 8003, Username: "u3", Password: "p3"}},
		{line: "u:p@[2001:db8::1]:80", want: Proxy{Host: "2001:db8::1", Port: 80, Username: "u", Password: "p"}},
		{line: "u:p@a@host.example:80", want: Proxy{Host: "host.example", Port: 80, Username: "u", Password: "p@a"}},
		{line: "host:0", wantErr: "port must be 1 to 65535"},
		{line: "host:65536", wantErr: "port must be 1 to 65535"},
		{line: "host:8080:user", wantErr: "want host:port"},
		{line: ":8080", wantErr: "empty host"},
		{line: "user@host:80", wantErr: "must be user:pass"},
		{line: "u:p@a:b:80", wantErr: "want user:pass@host:port"},
		{line: "[::1]8080", wantErr: "want [ipv6]:port"},
		{line: "[::1]:80:u", wantErr: "want [ipv6]:port or"},
	}
	for _, tc := range cases {
		t.Run(tc.line, func(t *testing.T) {
			got, err := ParseProxyLine(tc.line)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"7", 7 * time.Second, true},
		{"999999", MaxRetryAfter, true},
		{now.Add(90 * time.Second).Format("Mon, 02 Jan 2006 15:04:05 GMT"), 90*time.Second - 5, true},
		{now.Add(-time.Minute).Format("Mon, 02 Jan 2006 15:04:05 GMT"), 0, true},
		{"Sunday, 29-Nov-26 22:52:03 GMT", 60*time.Second - 5, true},
		{"Sun Nov 29 22:52:03 2026", 60*time.Second - 5, true},
		{"soon", 0, false},
		{"", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := RetryAfter(tc.in, now)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("RetryAfter(%q) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestNumber(t *testing.T) {
	cases := []struct {
		in      string
		want    Number
		wantErr bool
	}{
		{`8080`, 8080, false}, {`"8080"`, 8080, false}, {`" 90.5 "`, 90.5, false}, {`null`, 0, false},
		{`""`, 0, false}, {`"90a1"`, 0, true}, {`"NaN"`, 0, true}, {`true`, 0, true}, {`"1e400"`, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			var n Number
			err := json.Unmarshal([]byte(tc.in), &n)
			if (err != nil) != tc.wantErr || n != tc.want {
				t.Fatalf("got %v, %v", n, err)
			}
		})
	}
	if _, err := Number(80.5).Port(); err == nil {
		t.Error("80.5 accepted as a port")
	}
	if _, err := Number(-1).Seconds(); err == nil {
		t.Error("-1 accepted as seconds")
	}
}

func TestHeader(t *testing.T) {
	h := map[string]string{"Retry-After": "1", "x-lower": "2"}
	for name, want := range map[string]string{"retry-after": "1", "Retry-After": "1", "X-Lower": "2", "missing": ""} {
		if got := Header(h, name); got != want {
			t.Errorf("Header(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestAddQueryHidesTheURL(t *testing.T) {
	_, err := AddQuery("http://v.example/%zz?key=SECRET", nil)
	if err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("err = %v: want an error that does not repeat the url", err)
	}
}

// The hand-written encoder must write what encoding/json writes, up to
// formatting: compare the decoded documents.
func TestAppendParseOutputMatchesEncodingJSON(t *testing.T) {
	res := Result{Proxies: []Proxy{
		{Scheme: "SOCKS5", Host: "[2001:db8::1]", Port: 1, Username: "u\"\\\n\t\x01", Password: "\xff\xfe<&>\u2028",
			TTL: 90500 * time.Millisecond, ExpiresAt: now, Region: "é", Carrier: "c", Tags: map[string]string{"k": "v", "z": ""}},
		{Host: "h", Port: 65535},
	}, RetryAfter: 1500 * time.Millisecond}
	checkEncoder(t, res)
	checkEncoder(t, Result{})
}

func checkEncoder(t testing.TB, res Result) {
	t.Helper()
	got := appendParseOutput(nil, res)
	o := wireParseOutput{Proxies: make([]wireProxy, len(res.Proxies)), RetryAfterSeconds: retrySeconds(res.RetryAfter)}
	for i, p := range res.Proxies {
		o.Proxies[i] = toWireProxy(p)
	}
	want, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("invalid json %s: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("appendParseOutput wrote %s\nencoding/json writes %s", got, want)
	}
}

func FuzzAppendParseOutput(f *testing.F) {
	f.Add("203.0.113.1", 8080, "u", "p\x00\"", "k", "\xff", int64(1500))
	f.Add("[::1]", 1, "", "", "", "", int64(0))
	f.Fuzz(func(t *testing.T, host string, port int, user, pass, tagKey, tagValue string, ttlMillis int64) {
		p := Proxy{Host: host, Port: port, Username: user, Password: pass, TTL: time.Duration(ttlMillis) * time.Millisecond}
		if tagKey != "" {
			p.Tags = map[string]string{tagKey: tagValue}
		}
		checkEncoder(t, Result{Proxies: []Proxy{p}})
	})
}

func TestLines(t *testing.T) {
	got := Lines([]byte("\xEF\xBB\xBF a \r\n\n\tb\n\r\n"))
	if !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("Lines = %q", got)
	}
	if Lines(nil) != nil {
		t.Fatal("Lines(nil) not nil")
	}
}
