package wasm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// The JSON documents of ABI v1, host side. They mirror sdk/wire.go; the
// compatibility kit (testdata/guests/tck) keeps the two in step.

type wireBuildInput struct {
	Params  map[string]string `json:"params"`
	Secrets map[string]string `json:"secrets"`
	Count   int               `json:"count"`
	Now     time.Time         `json:"now"`
}

type wireRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    []byte            `json:"body"`
}

type wireBuildOutput struct {
	Request *wireRequest `json:"request"`
	Error   *wireError   `json:"error"`
}

// wireResponse is the JSON input of proxypool_parse_response; the body is
// its second (ptr, len) argument.
type wireResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Params  map[string]string `json:"params"`
	Now     time.Time         `json:"now"`
}

type wireProxy struct {
	Scheme     string            `json:"scheme"`
	Host       string            `json:"host"`
	Port       int               `json:"port"`
	Username   string            `json:"username"`
	Password   string            `json:"password"`
	TTLSeconds float64           `json:"ttlSeconds"`
	ExpiresAt  string            `json:"expiresAt"`
	Region     string            `json:"region"`
	Carrier    string            `json:"carrier"`
	Tags       map[string]string `json:"tags"`
}

type wireParseOutput struct {
	Proxies           []wireProxy `json:"proxies"`
	RetryAfterSeconds float64     `json:"retryAfterSeconds"`
	Error             *wireError  `json:"error"`
}

type wireError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

type wireParam struct {
	Name        string `json:"name"`
	Required    bool   `json:"required"`
	Default     string `json:"default"`
	Description string `json:"description"`
}

type wireDescription struct {
	Description string      `json:"description"`
	Params      []wireParam `json:"params"`
	Secrets     []string    `json:"secrets"`
	Error       *wireError  `json:"error"`
}

// Bounds of decoded outputs, beyond MaxOutputBytes.
const (
	maxCredential  = 255
	maxLabel       = 128 // region, carrier
	maxTags        = 32
	maxTagKey      = 64
	maxTagValue    = 256
	maxTTL         = 366 * 24 * time.Hour
	maxMessage     = 256 // guest error messages
	maxDeclared    = 64  // params, secrets
	maxDeclName    = 64
	maxDescription = 1 << 10
	maxDefault     = 4 << 10
)

// decodeStrict decodes exactly one JSON document into v, refusing unknown
// fields and trailing data: a guest that writes something else is broken,
// and saying so beats guessing.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the json document")
	}
	return nil
}

func badOutput(export string, err error) error {
	return fmt.Errorf("%s: %w: %v", export, ErrBadOutput, err)
}

// decodeBuildOutput turns proxypool_build_request's output into a request
// or the error the plugin reported.
func decodeBuildOutput(data []byte) (upstream.Request, error) {
	var o wireBuildOutput
	if err := decodeStrict(data, &o); err != nil {
		return upstream.Request{}, badOutput(exportBuild, err)
	}
	switch {
	case o.Error != nil && o.Request != nil:
		return upstream.Request{}, badOutput(exportBuild, errors.New("both request and error set"))
	case o.Error != nil:
		return upstream.Request{}, o.Error.toError(exportBuild, 0)
	case o.Request == nil:
		return upstream.Request{}, badOutput(exportBuild, errors.New("neither request nor error set"))
	}
	r := upstream.Request{Method: o.Request.Method, URL: o.Request.URL, Headers: o.Request.Headers, Body: o.Request.Body}
	if r.Method == "" {
		r.Method = "GET"
	}
	if err := plugin.CheckRequest(r); err != nil {
		return upstream.Request{}, &GuestError{Message: "invalid request: " + err.Error()}
	}
	return r, nil
}

// decodeParseOutput turns proxypool_parse_response's output into a result.
// A structural fault (bad JSON, a field of the wrong type) is ErrBadOutput;
// a well-formed entry with an unusable value is an *EntryError, like the
// other kinds report it.
func decodeParseOutput(data []byte) (upstream.ParseResult, error) {
	var o wireParseOutput
	if err := decodeStrict(data, &o); err != nil {
		return upstream.ParseResult{}, badOutput(exportParse, locateFault(data, err))
	}
	if math.IsNaN(o.RetryAfterSeconds) || o.RetryAfterSeconds < 0 {
		return upstream.ParseResult{}, badOutput(exportParse, fmt.Errorf("retryAfterSeconds %v", o.RetryAfterSeconds))
	}
	retry := plugin.MaxRetryAfter
	if o.RetryAfterSeconds < plugin.MaxRetryAfter.Seconds() {
		retry = time.Duration(o.RetryAfterSeconds * float64(time.Second))
	}
	res := upstream.ParseResult{RetryAfter: retry}
	if o.Error != nil {
		return res, o.Error.toError(exportParse, retry)
	}
	if len(o.Proxies) > plugin.MaxProxies {
		return res, fmt.Errorf("%d proxies, more than %d", len(o.Proxies), plugin.MaxProxies)
	}
	if len(o.Proxies) == 0 {
		return res, nil
	}
	res.Proxies = make([]proxy.Candidate, len(o.Proxies))
	for i := range o.Proxies {
		if err := o.Proxies[i].toCandidate(i, &res.Proxies[i]); err != nil {
			return upstream.ParseResult{RetryAfter: retry}, err
		}
	}
	return res, nil
}

// locateFault names the proxy entry a decoding error is about, decoding
// the entries one by one: the slow path, for broken outputs only.
func locateFault(data []byte, err error) error {
	var o struct {
		Proxies []json.RawMessage `json:"proxies"`
	}
	if json.Unmarshal(data, &o) != nil {
		return err
	}
	for i, r := range o.Proxies {
		var w wireProxy
		if perr := decodeStrict(r, &w); perr != nil {
			return fmt.Errorf("proxy %d: %w", i, perr)
		}
	}
	return err
}

func (e *wireError) toError(export string, retry time.Duration) error {
	msg := e.Message
	switch e.Kind {
	case kindVendor:
		return plugin.NewVendorError(msg)
	case kindStatus:
		if e.Status < 100 || e.Status > 599 {
			return badOutput(export, fmt.Errorf("status error with status %d", e.Status))
		}
		return &plugin.StatusError{Status: e.Status, RetryAfter: retry}
	case kindPlugin, "":
		return &GuestError{Message: sanitize(msg, maxMessage)}
	}
	return badOutput(export, fmt.Errorf("unknown error kind %q", trunc(e.Kind)))
}

func (w *wireProxy) toCandidate(i int, c *proxy.Candidate) error {
	fail := func(field string, err error) error { return &EntryError{Index: i, Field: field, Err: err} }
	c.Scheme = proxy.SchemeHTTP
	if w.Scheme != "" {
		c.Scheme = proxy.Scheme(strings.ToLower(w.Scheme))
		if !c.Scheme.Valid() {
			return fail("scheme", fmt.Errorf("%q, want http, https or socks5", trunc(w.Scheme)))
		}
	}
	host := w.Host
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if host == "" {
		return fail("host", errors.New("is required"))
	}
	if err := plugin.CheckHost(host); err != nil {
		return fail("host", err)
	}
	c.Host = host
	if w.Port < 1 || w.Port > 65535 {
		return fail("port", fmt.Errorf("%d is not a port in 1..65535", w.Port))
	}
	c.Port = uint16(w.Port)
	var err error
	if c.Username, err = checkString(w.Username, maxCredential); err != nil {
		return fail("username", err)
	}
	if c.Password, err = checkString(w.Password, maxCredential); err != nil {
		return fail("password", err)
	}
	if w.TTLSeconds < 0 || w.TTLSeconds > maxTTL.Seconds() {
		return fail("ttlSeconds", fmt.Errorf("%v out of range 0..%v", w.TTLSeconds, maxTTL.Seconds()))
	}
	c.TTL = time.Duration(w.TTLSeconds * float64(time.Second))
	if w.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339Nano, w.ExpiresAt)
		if err != nil {
			return fail("expiresAt", fmt.Errorf("%q is not RFC 3339", trunc(w.ExpiresAt)))
		}
		c.ExpiresAt = t.UTC()
	}
	if c.Region, err = checkString(w.Region, maxLabel); err != nil {
		return fail("region", err)
	}
	if c.Carrier, err = checkString(w.Carrier, maxLabel); err != nil {
		return fail("carrier", err)
	}
	if len(w.Tags) > maxTags {
		return fail("tags", fmt.Errorf("more than %d tags", maxTags))
	}
	if len(w.Tags) > 0 {
		c.Tags = make(map[string]string, len(w.Tags))
		for k, v := range w.Tags {
			if k == "" || len(k) > maxTagKey {
				return fail("tags", fmt.Errorf("tag key must be 1 to %d bytes", maxTagKey))
			}
			if _, err := checkString(v, maxTagValue); err != nil {
				return fail("tags", fmt.Errorf("tag %s: %w", trunc(k), err))
			}
			c.Tags[k] = v
		}
	}
	return plugin.CheckCandidate(c)
}

func checkString(s string, limit int) (string, error) {
	if len(s) > limit {
		return "", fmt.Errorf("longer than %d bytes", limit)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return "", errors.New("contains control characters")
		}
	}
	return s, nil
}

// decodeDescription reads proxypool_describe's output into the plugin's
// declaration.
func decodeDescription(data []byte) (plugin.Description, error) {
	var o wireDescription
	if err := decodeStrict(data, &o); err != nil {
		return plugin.Description{}, badOutput(exportDescribe, err)
	}
	if o.Error != nil {
		return plugin.Description{}, fmt.Errorf("%s: plugin reported: %s", exportDescribe, sanitize(o.Error.Message, maxMessage))
	}
	if len(o.Description) > maxDescription {
		return plugin.Description{}, badOutput(exportDescribe, fmt.Errorf("description longer than %d bytes", maxDescription))
	}
	if len(o.Params) > maxDeclared || len(o.Secrets) > maxDeclared {
		return plugin.Description{}, badOutput(exportDescribe, fmt.Errorf("more than %d params or secrets", maxDeclared))
	}
	d := plugin.Description{Text: sanitize(o.Description, maxDescription)}
	seen := map[string]bool{}
	for _, p := range o.Params {
		if err := checkDeclName(p.Name); err != nil {
			return plugin.Description{}, badOutput(exportDescribe, fmt.Errorf("param: %w", err))
		}
		if seen[p.Name] {
			return plugin.Description{}, badOutput(exportDescribe, fmt.Errorf("param %s declared twice", p.Name))
		}
		seen[p.Name] = true
		if len(p.Default) > maxDefault || len(p.Description) > maxDescription {
			return plugin.Description{}, badOutput(exportDescribe, fmt.Errorf("param %s: default or description too long", p.Name))
		}
		d.Params = append(d.Params, plugin.Param{Name: p.Name, Required: p.Required, Default: p.Default})
	}
	seen = map[string]bool{}
	for _, s := range o.Secrets {
		if err := checkDeclName(s); err != nil {
			return plugin.Description{}, badOutput(exportDescribe, fmt.Errorf("secret: %w", err))
		}
		if seen[s] {
			return plugin.Description{}, badOutput(exportDescribe, fmt.Errorf("secret %s declared twice", s))
		}
		seen[s] = true
		d.Secrets = append(d.Secrets, s)
	}
	return d, nil
}

// checkDeclName is the SDK's rule for param and secret names.
func checkDeclName(n string) error {
	if n == "" || len(n) > maxDeclName {
		return fmt.Errorf("name %q: want 1 to %d characters", trunc(n), maxDeclName)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case (c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') && i > 0:
		default:
			return fmt.Errorf("name %q: want letters, digits, '_', '-' and '.', starting with a letter", trunc(n))
		}
	}
	return nil
}

// sanitize bounds a guest-provided text and drops control characters, so it
// can be logged and shown.
func sanitize(s string, limit int) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= limit {
			b.WriteString("…")
			break
		}
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			r = ' '
		}
		b.WriteRune(r)
	}
	return b.String()
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
