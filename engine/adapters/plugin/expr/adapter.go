package expr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/expr-lang/expr/vm"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Bounds of a response as a template sees it.
const (
	// MaxBodyBytes is a backstop: the host bounds the body it reads
	// (fetch.maxResponseBytes); this refuses anything larger regardless.
	MaxBodyBytes = 32 << 20
	// MaxLines bounds the non-empty lines of a lines body.
	MaxLines = 10000
	// MaxLineBytes bounds one line of a lines body.
	MaxLineBytes = 2 << 10
)

// Adapter is a compiled template. It is immutable and safe for concurrent
// use: every call gets its own VM and evaluation budget.
type Adapter struct {
	name        string
	description string
	params      []plugin.Param
	secrets     []string

	method  string
	url     *vm.Program
	headers []header
	body    *vm.Program // nil: no body

	format   string
	okStatus map[int]bool
	errProg  *vm.Program // nil: no error expression
	proxies  *vm.Program
}

type header struct {
	name string
	prog *vm.Program
}

var (
	_ upstream.Adapter = (*Adapter)(nil)
	_ plugin.Describer = (*Adapter)(nil)
)

// Compile decodes and compiles a template. name is the file name stem the
// template must declare. Every problem is reported, each naming the field and
// its line.
func Compile(name string, data []byte) (*Adapter, error) {
	t, err := decodeTemplate(name, data)
	if err != nil {
		return nil, err
	}
	a := &Adapter{
		name:        t.Name,
		description: t.Description,
		method:      t.Request.Method,
		format:      t.Response.Format,
		okStatus:    map[int]bool{},
	}
	d := declared{params: map[string]bool{}, secrets: map[string]bool{}}
	for _, p := range sortedKeys(t.Params) {
		spec := t.Params[p]
		prm := plugin.Param{Name: p, Required: spec.Required}
		if spec.Default != nil {
			prm.Default = *spec.Default
		}
		a.params = append(a.params, prm)
		d.params[p] = true
	}
	a.secrets = append([]string(nil), t.Secrets...)
	sort.Strings(a.secrets)
	for _, s := range a.secrets {
		d.secrets[s] = true
	}
	for _, s := range t.Response.OKStatus {
		a.okStatus[s] = true
	}

	var errs []error
	compile := func(field string, s source, env any, want reflect.Kind) *vm.Program {
		p, err := compileExpr(s, env, want, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (line %d): %w", field, s.Line, err))
		}
		return p
	}
	reqEnv := &requestEnv{}
	a.url = compile("request.url", t.Request.URL, reqEnv, reflect.String)
	for _, h := range sortedKeys(t.Request.Headers) {
		a.headers = append(a.headers, header{name: h, prog: compile("request.headers."+h, t.Request.Headers[h], reqEnv, reflect.String)})
	}
	if !t.Request.Body.empty() {
		a.body = compile("request.body", t.Request.Body, reqEnv, reflect.String)
	}
	var respEnv any = &responseEnv[any]{}
	if a.format == FormatLines {
		respEnv = &responseEnv[[]string]{}
	}
	if !t.Response.Error.empty() {
		a.errProg = compile("response.error", t.Response.Error, respEnv, reflect.String)
	}
	a.proxies = compile("response.proxies", t.Response.Proxies, respEnv, reflect.Slice)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return a, nil
}

// Name is the plugin name.
func (a *Adapter) Name() string { return a.name }

// Describe reports the declared inputs.
func (a *Adapter) Describe() plugin.Description {
	return plugin.Description{
		Text:    a.description,
		Params:  append([]plugin.Param(nil), a.params...),
		Secrets: append([]string(nil), a.secrets...),
	}
}

// resolveParams applies defaults. strict (request side) refuses undeclared
// and missing required params; the response side is lenient because the
// request already enforced them and a dry run may not pass them all.
func (a *Adapter) resolveParams(in map[string]string, strict bool) (map[string]string, error) {
	return plugin.ResolveParams(a.params, in, strict)
}

// resolveSecrets maps every declared secret, "" when not supplied: many
// vendors authenticate by caller IP instead, and the template decides.
func (a *Adapter) resolveSecrets(in map[string]string) (map[string]string, error) {
	return plugin.ResolveSecrets(a.secrets, in)
}

// BuildRequest evaluates the request expressions.
func (a *Adapter) BuildRequest(ctx context.Context, in upstream.BuildInput) (upstream.Request, error) {
	params, err := a.resolveParams(in.Params, true)
	if err != nil {
		return upstream.Request{}, err
	}
	secrets, err := a.resolveSecrets(in.Secrets)
	if err != nil {
		return upstream.Request{}, err
	}
	if in.Count < 0 {
		return upstream.Request{}, fmt.Errorf("negative count %d", in.Count)
	}
	env := &requestEnv{
		Params: params, Secrets: secrets, Count: in.Count,
		Now: in.Now.Unix(), NowTime: in.Now, Budget: &budget{ctx: ctx},
	}
	var m vm.VM
	req := upstream.Request{Method: a.method}
	if req.URL, err = evalString(&m, a.url, env, "request.url"); err != nil {
		return upstream.Request{}, err
	}
	if len(a.headers) > 0 {
		req.Headers = make(map[string]string, len(a.headers))
		for _, h := range a.headers {
			v, err := evalString(&m, h.prog, env, "request.headers."+h.name)
			if err != nil {
				return upstream.Request{}, err
			}
			if v != "" { // lets a template omit a header, e.g. an unset key
				req.Headers[h.name] = v
			}
		}
	}
	if a.body != nil {
		b, err := evalString(&m, a.body, env, "request.body")
		if err != nil {
			return upstream.Request{}, err
		}
		req.Body = []byte(b)
	}
	return req, nil
}

func evalString(m *vm.VM, p *vm.Program, env any, field string) (string, error) {
	v, err := run(m, p, env)
	if err != nil {
		return "", fmt.Errorf("evaluating %s: %w", field, err)
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("evaluating %s: got %T, want string", field, v)
	}
	return s, nil
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// ParseResponse checks the status, decodes the body, evaluates the error
// and proxies expressions and converts the result strictly.
func (a *Adapter) ParseResponse(ctx context.Context, resp upstream.Response, now time.Time) (upstream.ParseResult, error) {
	if !a.okStatus[resp.Status] {
		se := &plugin.StatusError{Status: resp.Status}
		if resp.Status == 429 || resp.Status == 503 {
			if d, ok := plugin.ParseRetryAfter(headerValue(resp.Headers, "Retry-After"), now); ok {
				se.RetryAfter = d
			}
		}
		return upstream.ParseResult{RetryAfter: se.RetryAfter}, se
	}
	if len(resp.Body) > MaxBodyBytes {
		return upstream.ParseResult{}, fmt.Errorf("response body larger than %d bytes", MaxBodyBytes)
	}
	params, _ := a.resolveParams(resp.Params, false)
	b := &budget{ctx: ctx}
	body := bytes.TrimPrefix(resp.Body, utf8BOM)
	var env any
	switch a.format {
	case FormatJSON:
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			return upstream.ParseResult{}, fmt.Errorf("decoding json body: %w", err)
		}
		env = &responseEnv[any]{Params: params, Now: now.Unix(), NowTime: now, Status: resp.Status, Headers: resp.Headers, Body: v, Budget: b}
	case FormatLines:
		lines, err := splitLines(body)
		if err != nil {
			return upstream.ParseResult{}, err
		}
		env = &responseEnv[[]string]{Params: params, Now: now.Unix(), NowTime: now, Status: resp.Status, Headers: resp.Headers, Body: lines, Budget: b}
	default:
		return upstream.ParseResult{}, fmt.Errorf("unknown format %q", a.format)
	}
	var m vm.VM
	if a.errProg != nil {
		msg, err := evalString(&m, a.errProg, env, "response.error")
		if err != nil {
			return upstream.ParseResult{}, err
		}
		if msg != "" {
			return upstream.ParseResult{}, plugin.NewVendorError(msg)
		}
	}
	v, err := run(&m, a.proxies, env)
	if err != nil {
		return upstream.ParseResult{}, fmt.Errorf("evaluating response.proxies: %w", err)
	}
	cands, err := toCandidates(v)
	if err != nil {
		return upstream.ParseResult{}, err
	}
	return upstream.ParseResult{Proxies: cands}, nil
}

func headerValue(h map[string]string, name string) string {
	if v, ok := h[name]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// splitLines returns the non-empty trimmed lines, bounded in count and
// length.
func splitLines(body []byte) ([]string, error) {
	var lines []string
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if len(line) > MaxLineBytes {
			return nil, fmt.Errorf("line %d longer than %d bytes", len(lines)+1, MaxLineBytes)
		}
		if len(lines) == MaxLines {
			return nil, fmt.Errorf("more than %d lines", MaxLines)
		}
		lines = append(lines, string(line))
	}
	return lines, nil
}
