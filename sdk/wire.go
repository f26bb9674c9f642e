package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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

// wireResponse is the JSON input of proxypool_parse_response; the body
// comes raw, as the export's second buffer.
type wireResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
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

func handleParse(input, body []byte) (out []byte) {
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
	res, err := p.ParseResponse(Response{Status: in.Status, Headers: orEmpty(in.Headers), Body: body, Params: orEmpty(in.Params), Now: in.Now})
	if err != nil {
		return fail(err, res.RetryAfter)
	}
	return appendParseOutput(make([]byte, 0, 64+96*len(res.Proxies)), res)
}

// appendParseOutput writes a successful wireParseOutput without reflection:
// with 1,000 proxies, encoding/json costs the guest several times more,
// and every step it takes inside the sandbox is paid twice (see
// export_wasip1.go). The output is what json.Marshal would write, keys
// sorted within tags.
func appendParseOutput(dst []byte, res Result) []byte {
	dst = append(dst, `{"proxies":[`...)
	for i, p := range res.Proxies {
		if i > 0 {
			dst = append(dst, ',')
		}
		w := toWireProxy(p)
		dst = append(dst, '{')
		if w.Scheme != "" {
			dst = appendField(dst, "scheme", w.Scheme)
		}
		dst = appendField(dst, "host", w.Host)
		dst = append(dst, `,"port":`...)
		dst = strconv.AppendInt(dst, int64(w.Port), 10)
		for _, f := range [...]struct{ k, v string }{
			{"username", w.Username}, {"password", w.Password}, {"expiresAt", w.ExpiresAt},
			{"region", w.Region}, {"carrier", w.Carrier},
		} {
			if f.v != "" {
				dst = appendField(dst, f.k, f.v)
			}
		}
		if w.TTLSeconds != 0 {
			dst = append(dst, `,"ttlSeconds":`...)
			dst = strconv.AppendFloat(dst, w.TTLSeconds, 'f', -1, 64)
		}
		if len(w.Tags) > 0 {
			keys := make([]string, 0, len(w.Tags))
			for k := range w.Tags {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			dst = append(dst, `,"tags":{`...)
			for j, k := range keys {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = appendString(dst, k)
				dst = append(dst, ':')
				dst = appendString(dst, w.Tags[k])
			}
			dst = append(dst, '}')
		}
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if r := retrySeconds(res.RetryAfter); r != 0 {
		dst = append(dst, `,"retryAfterSeconds":`...)
		dst = strconv.AppendFloat(dst, r, 'f', -1, 64)
	}
	return append(dst, '}')
}

// appendField writes a string member, preceded by a comma unless it opens
// the object.
func appendField(dst []byte, key, value string) []byte {
	if dst[len(dst)-1] != '{' {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, key...)
	dst = append(dst, '"', ':')
	return appendString(dst, value)
}

// appendString writes s as a JSON string; invalid UTF-8 becomes U+FFFD, as
// encoding/json writes it.
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
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
