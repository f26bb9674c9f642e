package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The JSON documents of ABI v1 (docs/plugins.md, "ABI reference"). The host
// decodes the outputs strictly: a field added here must be added there, in
// the same change, with a new ABI version if old hosts would refuse it.

type wireBuildInput struct {
	Params  map[string]string `json:"params"`
	Secrets map[string]string `json:"secrets"`
	Count   int               `json:"count"`
	Now     time.Time         `json:"now"`
}

type wireRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
}

type wireBuildOutput struct {
	Request *wireRequest `json:"request,omitempty"`
	Error   *wireError   `json:"error,omitempty"`
}

type wireResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    []byte            `json:"body"`
	Params  map[string]string `json:"params"`
	Now     time.Time         `json:"now"`
}

type wireProxy struct {
	Scheme     string            `json:"scheme,omitempty"`
	Host       string            `json:"host"`
	Port       int               `json:"port"`
	Username   string            `json:"username,omitempty"`
	Password   string            `json:"password,omitempty"`
	TTLSeconds float64           `json:"ttlSeconds,omitempty"`
	ExpiresAt  string            `json:"expiresAt,omitempty"`
	Region     string            `json:"region,omitempty"`
	Carrier    string            `json:"carrier,omitempty"`
	Tags       map[string]string `json:"tags,omitempty"`
}

type wireParseOutput struct {
	Proxies           []wireProxy `json:"proxies"`
	RetryAfterSeconds float64     `json:"retryAfterSeconds,omitempty"`
	Error             *wireError  `json:"error,omitempty"`
}

// Error kinds of wireError.
const (
	kindPlugin = "plugin"
	kindVendor = "vendor"
	kindStatus = "status"
)

type wireError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Status  int    `json:"status,omitempty"`
}

type wireParam struct {
	Name        string `json:"name"`
	Required    bool   `json:"required,omitempty"`
	Default     string `json:"default,omitempty"`
	Description string `json:"description,omitempty"`
}

type wireDescription struct {
	Description string      `json:"description,omitempty"`
	Params      []wireParam `json:"params"`
	Secrets     []string    `json:"secrets"`
}

// handleDescribe, handleBuild and handleParse are the bodies of the
// exports: bytes in, bytes out, never a panic. They are plain Go so tests
// run them on the host.

func handleDescribe() []byte {
	p, err := current()
	if err != nil {
		// The host refuses a module it cannot describe; say why.
		return mustMarshal(struct {
			Error *wireError `json:"error"`
		}{&wireError{Kind: kindPlugin, Message: err.Error()}})
	}
	d := wireDescription{Description: p.Description, Params: []wireParam{}, Secrets: []string{}}
	for _, prm := range p.Params {
		d.Params = append(d.Params, wireParam(prm))
	}
	d.Secrets = append(d.Secrets, p.Secrets...)
	return mustMarshal(d)
}

func handleBuild(input []byte) (out []byte) {
	defer func() {
		if r := recover(); r != nil {
			out = mustMarshal(wireBuildOutput{Error: &wireError{Kind: kindPlugin, Message: fmt.Sprintf("building request: plugin panicked: %v", r)}})
		}
	}()
	fail := func(err error) []byte { return mustMarshal(wireBuildOutput{Error: toWireError(err)}) }
	p, err := current()
	if err != nil {
		return fail(err)
	}
	var in wireBuildInput
	if err := json.Unmarshal(input, &in); err != nil {
		return fail(fmt.Errorf("decoding host input: %w", err))
	}
	req, err := p.BuildRequest(BuildInput{Params: orEmpty(in.Params), Secrets: orEmpty(in.Secrets), Count: in.Count, Now: in.Now})
	if err != nil {
		return fail(err)
	}
	if req.Method == "" {
		req.Method = "GET"
	}
	return mustMarshal(wireBuildOutput{Request: &wireRequest{Method: req.Method, URL: req.URL, Headers: req.Headers, Body: req.Body}})
}

func handleParse(input []byte) (out []byte) {
	defer func() {
		if r := recover(); r != nil {
			out = mustMarshal(wireParseOutput{Proxies: []wireProxy{}, Error: &wireError{Kind: kindPlugin, Message: fmt.Sprintf("parsing response: plugin panicked: %v", r)}})
		}
	}()
	fail := func(err error, retry time.Duration) []byte {
		o := wireParseOutput{Proxies: []wireProxy{}, Error: toWireError(err)}
		var se *StatusError
		if errors.As(err, &se) {
			retry = max(retry, se.RetryAfter)
		}
		o.RetryAfterSeconds = retrySeconds(retry)
		return mustMarshal(o)
	}
	p, err := current()
	if err != nil {
		return fail(err, 0)
	}
	var in wireResponse
	if err := json.Unmarshal(input, &in); err != nil {
		return fail(fmt.Errorf("decoding host input: %w", err), 0)
	}
	res, err := p.ParseResponse(Response{Status: in.Status, Headers: orEmpty(in.Headers), Body: in.Body, Params: orEmpty(in.Params), Now: in.Now})
	if err != nil {
		return fail(err, res.RetryAfter)
	}
	o := wireParseOutput{Proxies: make([]wireProxy, len(res.Proxies)), RetryAfterSeconds: retrySeconds(res.RetryAfter)}
	for i, px := range res.Proxies {
		o.Proxies[i] = toWireProxy(px)
	}
	return mustMarshal(o)
}

func toWireProxy(p Proxy) wireProxy {
	w := wireProxy{
		Scheme: strings.ToLower(p.Scheme), Host: p.Host, Port: p.Port,
		Username: p.Username, Password: p.Password,
		TTLSeconds: p.TTL.Seconds(), Region: p.Region, Carrier: p.Carrier, Tags: p.Tags,
	}
	if len(w.Host) > 2 && w.Host[0] == '[' && w.Host[len(w.Host)-1] == ']' {
		w.Host = w.Host[1 : len(w.Host)-1]
	}
	if !p.ExpiresAt.IsZero() {
		w.ExpiresAt = p.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	return w
}

func retrySeconds(d time.Duration) float64 {
	return min(max(d, 0), MaxRetryAfter).Seconds()
}

func toWireError(err error) *wireError {
	var se *StatusError
	if errors.As(err, &se) {
		return &wireError{Kind: kindStatus, Message: err.Error(), Status: se.Status}
	}
	var ve *VendorError
	if errors.As(err, &ve) {
		return &wireError{Kind: kindVendor, Message: ve.Message}
	}
	return &wireError{Kind: kindPlugin, Message: err.Error()}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// mustMarshal encodes the wire documents, which hold only strings, numbers,
// maps of strings and byte slices: the one failure left is an invalid
// float (a NaN TTL), reported as a plugin error rather than a panic.
func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(struct {
			Error *wireError `json:"error"`
		}{&wireError{Kind: kindPlugin, Message: "encoding output: " + err.Error()}})
	}
	return b
}
