package expr

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Bounds of a template's declarations.
const (
	maxParams      = 64
	maxSecrets     = 16
	maxHeaders     = 32
	maxOKStatus    = 16
	maxDescription = 1 << 10
	maxIdentLen    = 64
)

// Response body formats.
const (
	FormatJSON  = "json"
	FormatLines = "lines"
)

// template is the YAML document, decoded strictly.
type template struct {
	ABI         int                  `yaml:"abi"`
	Name        string               `yaml:"name"`
	Description string               `yaml:"description"`
	Params      map[string]paramSpec `yaml:"params"`
	Secrets     []string             `yaml:"secrets"`
	Request     requestSpec          `yaml:"request"`
	Response    responseSpec         `yaml:"response"`
}

type paramSpec struct {
	Required    bool    `yaml:"required"`
	Default     *string `yaml:"default"`
	Description string  `yaml:"description"`
}

type requestSpec struct {
	Method  string            `yaml:"method"`
	URL     source            `yaml:"url"`
	Headers map[string]source `yaml:"headers"`
	Body    source            `yaml:"body"`
}

type responseSpec struct {
	Format   string `yaml:"format"`
	OKStatus []int  `yaml:"okStatus"`
	Error    source `yaml:"error"`
	Proxies  source `yaml:"proxies"`
}

// source is an expression with the YAML line it came from, so compile errors
// point into the file.
type source struct {
	Src  string
	Line int
}

func (s *source) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: expression must be a string", n.Line)
	}
	s.Src, s.Line = n.Value, n.Line
	return nil
}

func (s source) empty() bool { return strings.TrimSpace(s.Src) == "" }

// decodeTemplate decodes strictly (unknown fields are errors with their
// line) and checks the declarations; expressions are compiled later.
func decodeTemplate(name string, data []byte) (*template, error) {
	var t template
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&t); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("decoding template: empty file")
		}
		return nil, fmt.Errorf("decoding template: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("decoding template: more than one yaml document")
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if t.ABI != upstream.ABIVersion {
		bad("abi: %d is not supported (this host implements abi %d)", t.ABI, upstream.ABIVersion)
	}
	if t.Name != name {
		bad("name: %q must equal the file name %q", t.Name, name)
	}
	if len(t.Description) > maxDescription {
		bad("description: longer than %d bytes", maxDescription)
	}
	if len(t.Params) > maxParams {
		bad("params: more than %d", maxParams)
	}
	for _, p := range sortedKeys(t.Params) {
		spec := t.Params[p]
		if !validIdent(p) {
			bad("params.%s: name must be an identifier ([A-Za-z_][A-Za-z0-9_]*, at most %d)", p, maxIdentLen)
		}
		if spec.Required == (spec.Default != nil) {
			bad("params.%s: declare exactly one of required: true or a default", p)
		}
	}
	if len(t.Secrets) > maxSecrets {
		bad("secrets: more than %d", maxSecrets)
	}
	seen := map[string]bool{}
	for _, s := range t.Secrets {
		if !validIdent(s) {
			bad("secrets: %q must be an identifier", s)
		}
		if seen[s] {
			bad("secrets: %q declared twice", s)
		}
		seen[s] = true
	}
	switch t.Request.Method {
	case "":
		t.Request.Method = http.MethodGet
	case http.MethodGet, http.MethodPost:
	default:
		bad("request.method: %q, want GET or POST", t.Request.Method)
	}
	if t.Request.URL.empty() {
		bad("request.url: is required")
	}
	if len(t.Request.Headers) > maxHeaders {
		bad("request.headers: more than %d", maxHeaders)
	}
	for _, h := range sortedKeys(t.Request.Headers) {
		if !validHeaderName(h) {
			bad("request.headers.%s: invalid header name", h)
		}
		switch http.CanonicalHeaderKey(h) {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Upgrade":
			bad("request.headers.%s: set by the host, not by templates", h)
		}
		if t.Request.Headers[h].empty() {
			bad("request.headers.%s: empty expression", h)
		}
	}
	switch t.Response.Format {
	case FormatJSON, FormatLines:
	default:
		bad("response.format: %q, want %s or %s", t.Response.Format, FormatJSON, FormatLines)
	}
	if len(t.Response.OKStatus) == 0 {
		t.Response.OKStatus = []int{http.StatusOK}
	}
	if len(t.Response.OKStatus) > maxOKStatus {
		bad("response.okStatus: more than %d", maxOKStatus)
	}
	for _, s := range t.Response.OKStatus {
		if s < 100 || s > 599 {
			bad("response.okStatus: %d is not an http status", s)
		}
	}
	if t.Response.Proxies.empty() {
		bad("response.proxies: is required")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &t, nil
}

func validIdent(s string) bool {
	if s == "" || len(s) > maxIdentLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
