package expr_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/adapters/plugin/expr"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

func loadTemplate(t testing.TB, name string) (*expr.Adapter, error) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "templates", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return expr.Compile(name, data)
}

func mustTemplate(t testing.TB, name string) *expr.Adapter {
	t.Helper()
	a, err := loadTemplate(t, name)
	if err != nil {
		t.Fatalf("compiling %s: %v", name, err)
	}
	return a
}

func TestCompileTemplates(t *testing.T) {
	cases := []struct {
		file string
		want []string // every substring must appear; none = must compile
	}{
		{"good-post", nil},
		{"good-passthrough", nil},
		{"good-hostile-eval", nil},
		{"bad-unknown-field", []string{"line 10", "field proxys not found"}},
		{"bad-builtin", []string{"request.url (line 4)", "unknown name date", "response.proxies (line 7)", "unknown name fromJSON"}},
		{"bad-env", []string{"unknown name env", "unknown name repeat"}},
		{"bad-type", []string{
			"request.url (line 6): expected string, but got int",
			"request.headers.X-Count (line 8): expected string",
			"response.error (line 11): expected string",
			"response.proxies (line 12): invalid operation: + (mismatched types string and int)",
		}},
		{"bad-name", []string{`name: "some-other-name" must equal the file name "bad-name"`}},
		{"bad-abi", []string{"abi: 2 is not supported"}},
		{"bad-undeclared", []string{"secrets.token is not declared", "params.num is not declared"}},
		{"bad-reserved", []string{"identifier __tick is reserved", "identifier __budget is reserved", "field __budget is reserved"}},
		{"bad-declarations", []string{
			"params.9lives: name must be an identifier",
			"params.loose: declare exactly one",
			"params.url: declare exactly one",
			`secrets: "key" declared twice`,
			`secrets: "not an ident" must be an identifier`,
			`request.method: "DELETE"`,
			"request.url: is required",
			"request.headers.Bad Header: invalid header name",
			"request.headers.Host: set by the host",
			`response.format: "xml"`,
			"response.okStatus: 42",
			"response.proxies: is required",
		}},
		{"bad-secret-in-response", []string{"response.proxies (line 8)", "unknown name secrets"}},
		{"bad-syntax", []string{"request.url (line 4): unexpected token EOF", "response.proxies (line 7)"}},
		{"bad-yaml", []string{"decoding template", "line 2"}},
		{"bad-empty", []string{"empty file"}},
		{"bad-expr-not-string", []string{"line 5: expression must be a string"}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			_, err := loadTemplate(t, tc.file)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("must compile: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("compiled, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func minimal(proxies string) []byte {
	return []byte(fmt.Sprintf("abi: 1\nname: t\nrequest:\n  url: '\"http://v.example/\"'\nresponse:\n  format: json\n  proxies: '%s'\n", proxies))
}

func TestCompileSizeLimits(t *testing.T) {
	cases := []struct {
		name, proxies, want string
	}{
		{"over MaxNodes", "take([], 0" + strings.Repeat(" + 0", expr.MaxNodes) + ")", "compilation failed: expression exceeds maximum allowed nodes"},
		{"over MaxExprBytes", "[]" + strings.Repeat(" ", expr.MaxExprBytes), fmt.Sprintf("longer than %d bytes", expr.MaxExprBytes)},
		{"well under MaxNodes is fine", "take([], 0" + strings.Repeat(" + 0", expr.MaxNodes/4) + ")", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := expr.Compile("t", minimal(tc.proxies))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Compile: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestBuildRequest(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cases := []struct {
		name    string
		plugin  string
		in      upstream.BuildInput
		want    upstream.Request
		wantErr string
	}{
		{
			name:   "envelope with key and count",
			plugin: "json-envelope",
			in:     upstream.BuildInput{Params: map[string]string{"url": "https://api.vendor.example/v1/proxies"}, Secrets: map[string]string{"apiKey": "a b&c"}, Count: 25, Now: now},
			want: upstream.Request{Method: "GET", URL: "https://api.vendor.example/v1/proxies?count=25&format=json&key=a+b%26c",
				Headers: map[string]string{"Accept": "application/json"}},
		},
		{
			name:   "envelope without key keeps the url's own query; count 0 asks the default",
			plugin: "json-envelope",
			in:     upstream.BuildInput{Params: map[string]string{"url": "https://api.vendor.example/get?pack=7", "format": "JSON"}, Now: now},
			want: upstream.Request{Method: "GET", URL: "https://api.vendor.example/get?count=10&format=JSON&pack=7",
				Headers: map[string]string{"Accept": "application/json"}},
		},
		{
			name:   "list: computed count parameter, empty key header omitted",
			plugin: "json-list",
			in:     upstream.BuildInput{Params: map[string]string{"url": "http://v.example/api", "countParam": "qty"}, Count: 3, Now: now},
			want:   upstream.Request{Method: "GET", URL: "http://v.example/api?qty=3", Headers: map[string]string{"Accept": "application/json"}},
		},
		{
			name:   "list: key header set",
			plugin: "json-list",
			in:     upstream.BuildInput{Params: map[string]string{"url": "http://v.example/api"}, Secrets: map[string]string{"apiKey": "K"}, Count: 3, Now: now},
			want:   upstream.Request{Method: "GET", URL: "http://v.example/api?num=3", Headers: map[string]string{"Accept": "application/json", "X-Api-Key": "K"}},
		},
		{
			name:   "text lines",
			plugin: "text-lines",
			in:     upstream.BuildInput{Params: map[string]string{"url": "http://v.example/p", "ttl": "60"}, Count: 2, Now: now},
			want:   upstream.Request{Method: "GET", URL: "http://v.example/p?count=2&format=text"},
		},
		{
			name:   "post with body, basic auth and default region",
			plugin: "good-post",
			in:     upstream.BuildInput{Params: map[string]string{"url": "https://v.example/q"}, Secrets: map[string]string{"user": "u", "pass": "p"}, Count: 4, Now: now},
			want: upstream.Request{Method: "POST", URL: "https://v.example/q",
				Headers: map[string]string{"Authorization": "Basic dTpw", "Content-Type": "application/json"},
				Body:    []byte(`{"count":4,"region":"any","at":1800000000}`)},
		},
		{
			name:    "missing required param",
			plugin:  "json-envelope",
			in:      upstream.BuildInput{Now: now},
			wantErr: "param url is required",
		},
		{
			name:    "undeclared param",
			plugin:  "json-envelope",
			in:      upstream.BuildInput{Params: map[string]string{"url": "http://v.example/", "cuont": "1"}},
			wantErr: "params not declared by the plugin: cuont",
		},
		{
			name:    "undeclared secret",
			plugin:  "json-envelope",
			in:      upstream.BuildInput{Params: map[string]string{"url": "http://v.example/"}, Secrets: map[string]string{"token": "x"}},
			wantErr: "secrets not declared by the plugin: token",
		},
		{
			name:    "negative count",
			plugin:  "json-envelope",
			in:      upstream.BuildInput{Params: map[string]string{"url": "http://v.example/"}, Count: -1},
			wantErr: "negative count",
		},
		{
			name:    "unparseable url param",
			plugin:  "json-envelope",
			in:      upstream.BuildInput{Params: map[string]string{"url": "http://v.example/%zz"}},
			wantErr: "addQuery: invalid url",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var a *expr.Adapter
			if strings.HasPrefix(tc.plugin, "good-") {
				a = mustTemplate(t, tc.plugin)
			} else {
				a = shipped(t, tc.plugin)
			}
			got, err := a.BuildRequest(context.Background(), tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("BuildRequest: %v", err)
			}
			if fmt.Sprint(got.Headers) != fmt.Sprint(tc.want.Headers) || got.Method != tc.want.Method || got.URL != tc.want.URL || string(got.Body) != string(tc.want.Body) {
				t.Fatalf("got  %s %s %v %q\nwant %s %s %v %q", got.Method, got.URL, got.Headers, got.Body, tc.want.Method, tc.want.URL, tc.want.Headers, tc.want.Body)
			}
			if err := plugin.CheckRequest(got); err != nil {
				t.Fatalf("the host would refuse the request: %v", err)
			}
		})
	}
}

func TestParseEntries(t *testing.T) {
	a := mustTemplate(t, "good-passthrough")
	now := time.Unix(1_800_000_000, 0)
	cases := []struct {
		name      string
		body      string
		wantField string // EntryError field ("" with wantErr = whole-entry or list error)
		wantErr   string
		check     func(t *testing.T, res upstream.ParseResult)
	}{
		{name: "minimal entry defaults to http", body: `[{"host":"h.example","port":1}]`, check: func(t *testing.T, r upstream.ParseResult) {
			if c := r.Proxies[0]; c.Scheme != "http" || c.Host != "h.example" || c.Port != 1 || c.TTL != 0 || !c.ExpiresAt.IsZero() {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "port as string, ttl as string, expiry as unix", body: `[{"host":"10.0.0.1","port":" 8080 ","ttl":"90","expiresAt":1800000600}]`, check: func(t *testing.T, r upstream.ParseResult) {
			if c := r.Proxies[0]; c.Port != 8080 || c.TTL != 90*time.Second || !c.ExpiresAt.Equal(now.Add(10*time.Minute)) {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "expiry as numeric string and RFC 3339 with offset", body: `[{"host":"10.0.0.1","port":1,"expiresAt":"1800000600"},{"host":"10.0.0.2","port":2,"expiresAt":"2027-01-15T16:00:00+08:00"}]`, check: func(t *testing.T, r upstream.ParseResult) {
			if !r.Proxies[0].ExpiresAt.Equal(now.Add(10*time.Minute)) || !r.Proxies[1].ExpiresAt.Equal(time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC)) {
				t.Fatalf("%+v", r.Proxies)
			}
		}},
		{name: "bracketed ipv6 host, socks5, tags", body: `[{"scheme":"SOCKS5","host":"[2001:db8::5]","port":1080,"tags":{"pool":"a"}}]`, check: func(t *testing.T, r upstream.ParseResult) {
			if c := r.Proxies[0]; c.Host != "2001:db8::5" || c.Scheme != "socks5" || c.Tags["pool"] != "a" {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "empty list is Empty, not an error", body: `[]`, check: func(t *testing.T, r upstream.ParseResult) {
			if len(r.Proxies) != 0 {
				t.Fatal(r.Proxies)
			}
		}},
		{name: "port zero", body: `[{"host":"h","port":0}]`, wantField: "port"},
		{name: "port too big", body: `[{"host":"h","port":65536}]`, wantField: "port"},
		{name: "port fractional", body: `[{"host":"h","port":80.5}]`, wantField: "port"},
		{name: "port missing", body: `[{"host":"h"}]`, wantField: "port"},
		{name: "port boolean", body: `[{"host":"h","port":true}]`, wantField: "port"},
		{name: "port junk string", body: `[{"host":"h","port":"http"}]`, wantField: "port"},
		{name: "host missing", body: `[{"port":80}]`, wantField: "host"},
		{name: "host is a url", body: `[{"host":"http://h.example","port":80}]`, wantField: "host"},
		{name: "host with space", body: `[{"host":"h .example","port":80}]`, wantField: "host"},
		{name: "host with port", body: `[{"host":"10.0.0.1:80","port":80}]`, wantField: "host"},
		{name: "host non-canonical ipv4", body: `[{"host":"127.1","port":80}]`, wantField: "host"},
		{name: "host hex number", body: `[{"host":"0x7f000001","port":80}]`, wantField: "host"},
		{name: "host with zone", body: `[{"host":"fe80::1%eth0","port":80}]`, wantField: "host"},
		{name: "host number type", body: `[{"host":167772161,"port":80}]`, wantField: "host"},
		{name: "scheme unknown", body: `[{"scheme":"ftp","host":"h","port":80}]`, wantField: "scheme"},
		{name: "negative ttl", body: `[{"host":"h","port":80,"ttl":-5}]`, wantField: "ttl"},
		{name: "ttl over a year", body: `[{"host":"h","port":80,"ttl":40000000}]`, wantField: "ttl"},
		{name: "expiry in milliseconds", body: `[{"host":"h","port":80,"expiresAt":1800000000000}]`, wantField: "expiresAt"},
		{name: "expiry unreadable", body: `[{"host":"h","port":80,"expiresAt":"tomorrow"}]`, wantField: "expiresAt"},
		{name: "password with newline", body: `[{"host":"h","port":80,"password":"a\nb"}]`, wantField: "password"},
		{name: "username too long", body: `[{"host":"h","port":80,"username":"` + strings.Repeat("u", 256) + `"}]`, wantField: "username"},
		{name: "unknown field", body: `[{"host":"h","port":80,"hots":"x"}]`, wantField: "hots"},
		{name: "tags not strings", body: `[{"host":"h","port":80,"tags":{"a":1}}]`, wantField: "tags"},
		{name: "entry not an object", body: `["10.0.0.1:80"]`, wantErr: "proxy 0: entry of type string, want an object"},
		{name: "second entry bad names index 1", body: `[{"host":"h","port":1},{"host":"h","port":"x"}]`, wantErr: "proxy 1: field port"},
		{name: "not a list", body: `{"host":"h"}`, wantErr: "want a list"},
		{name: "null", body: `null`, wantErr: "returned nil, want a list"},
		{name: "malformed json", body: `[{"host":`, wantErr: "decoding json body"},
		{name: "trailing garbage", body: `[] x`, wantErr: "decoding json body"},
		{name: "empty body", body: ``, wantErr: "decoding json body"},
		{name: "over MaxProxies", body: "[" + strings.TrimSuffix(strings.Repeat(`{"host":"h","port":1},`, plugin.MaxProxies+1), ",") + "]", wantErr: "more than 10000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 200, Body: []byte(tc.body)}, now)
			switch {
			case tc.wantField != "":
				var ee *expr.EntryError
				if !errors.As(err, &ee) || ee.Field != tc.wantField {
					t.Fatalf("err = %v, want an EntryError on field %s", err, tc.wantField)
				}
				if strings.Contains(err.Error(), "a\nb") {
					t.Fatal("error echoes the password")
				}
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
			default:
				if err != nil {
					t.Fatalf("ParseResponse: %v", err)
				}
				tc.check(t, res)
			}
		})
	}
}

func TestLinesLimits(t *testing.T) {
	a := shipped(t, "text-lines")
	cases := []struct {
		name, body, wantErr string
		wantN               int
	}{
		{"at MaxLines", strings.Repeat("10.0.0.1:80\n", expr.MaxLines), "", expr.MaxLines},
		{"over MaxLines", strings.Repeat("10.0.0.1:80\n", expr.MaxLines+1), "more than 10000 lines", 0},
		{"blank lines do not count", strings.Repeat("\n \n", expr.MaxLines) + "10.0.0.1:80", "", 1},
		{"over MaxLineBytes", "10.0.0.1:80:u:" + strings.Repeat("p", expr.MaxLineBytes), "line 1 longer than", 0},
		{"three fields", "10.0.0.1:80:u", "want host:port or host:port:user:pass", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 200, Body: []byte(tc.body)}, time.Unix(0, 0))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(res.Proxies) != tc.wantN {
				t.Fatalf("got %d proxies, err %v; want %d", len(res.Proxies), err, tc.wantN)
			}
		})
	}
}

func TestEvaluationBounds(t *testing.T) {
	a := mustTemplate(t, "good-hostile-eval")
	lines := func(first string, n int) []byte {
		return []byte(first + "\n" + strings.Repeat("x\n", n-1))
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name    string
		ctx     context.Context
		body    []byte
		wantErr string
		wantIs  error
	}{
		{"nested loops stop at the iteration budget", context.Background(), lines("nested", 1000), "iterations", nil},
		{"spinning predicates stop at the iteration budget", context.Background(), lines("spin", 2000), "iterations", nil},
		{"a cancelled context stops evaluation", cancelled, lines("spin", 2000), "", context.Canceled},
		{"huge ranges hit the memory budget", context.Background(), lines("range", 1), "memory budget exceeded", nil},
		{"10k ten-field objects fit the memory budget", context.Background(), lines("fields", 10000), "proxy 0: field a: unknown field", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.ParseResponse(tc.ctx, upstream.Response{Status: 200, Body: tc.body}, time.Unix(0, 0))
			if err == nil {
				t.Fatal("hostile evaluation returned no error")
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Fatalf("err = %v, want errors.Is %v", err, tc.wantIs)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	d := shipped(t, "text-lines").Describe()
	if len(d.Secrets) != 1 || d.Secrets[0] != "apiKey" {
		t.Fatalf("secrets = %v", d.Secrets)
	}
	got := map[string]plugin.Param{}
	for _, p := range d.Params {
		got[p.Name] = p
	}
	if !got["url"].Required || got["ttl"].Default != "0" || got["format"].Default != "text" {
		t.Fatalf("params = %+v", d.Params)
	}
}

func TestParsePostTemplate(t *testing.T) {
	a := mustTemplate(t, "good-post")
	body := `{"items":[
		{"alive":true,"proto":"HTTPS","addr":"10.0.0.1","port":"443","until":"2027-01-15 16:00:00","zone":"z1"},
		{"alive":false,"addr":"10.0.0.2","port":80,"until":""},
		{"alive":true,"addr":"10.0.0.3","port":8080,"until":1800000000}
	]}`
	res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 201, Body: []byte(body)}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Proxies) != 2 {
		t.Fatalf("filter must drop the dead entry: %+v", res.Proxies)
	}
	c := res.Proxies[0]
	if c.Scheme != "https" || c.Port != 443 || !c.ExpiresAt.Equal(time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC)) || c.Tags["zone"] != "z1" || c.Tags["source"] != "post" {
		t.Fatalf("%+v", c)
	}
	if c := res.Proxies[1]; c.Tags["zone"] != "none" || c.ExpiresAt.Unix() != 1_800_000_000 {
		t.Fatalf("%+v", c)
	}
}

// TestConcurrentUse runs one compiled adapter from many goroutines: each
// call has its own VM and budget (run with -race).
func TestConcurrentUse(t *testing.T) {
	a := shipped(t, "json-envelope")
	body, err := os.ReadFile(filepath.Join("testdata", "responses", "json-envelope", "ok.json"))
	if err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 8, 50
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < rounds; i++ {
				if _, err := a.BuildRequest(context.Background(), upstream.BuildInput{Params: map[string]string{"url": "http://v.example/"}, Count: i}); err != nil {
					errs <- err
					return
				}
				res, err := a.ParseResponse(context.Background(), upstream.Response{Status: 200, Body: body}, time.Unix(0, 0))
				if err != nil || len(res.Proxies) != 3 {
					errs <- fmt.Errorf("%d proxies, %v", len(res.Proxies), err)
					return
				}
			}
			errs <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
