package httpapi

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/proxypool/proxypool/engine/controller"
)

// openAPIDir is api/openapi relative to this package.
var openAPIDir = filepath.Join("..", "..", "..", "api", "openapi")

// apiDoc is an OpenAPI document decoded generically; only what the
// contract tests compare is read.
type apiDoc struct {
	name string
	root map[string]any
}

func loadDoc(t testing.TB, name string) *apiDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(openAPIDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := yaml.Unmarshal(b, &root); err != nil {
		t.Fatalf("parsing %s: %v", name, err)
	}
	if v, _ := root["openapi"].(string); !strings.HasPrefix(v, "3.0.") {
		t.Fatalf("%s: openapi = %v, want 3.0.x", name, root["openapi"])
	}
	return &apiDoc{name: name, root: root}
}

func mapAt(t testing.TB, v any, path ...string) map[string]any {
	t.Helper()
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: not a mapping", strings.Join(path, "."))
		}
		v = m[p]
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: missing or not a mapping", strings.Join(path, "."))
	}
	return m
}

// resolve follows a local $ref.
func (d *apiDoc) resolve(t testing.TB, v map[string]any) map[string]any {
	t.Helper()
	ref, ok := v["$ref"].(string)
	if !ok {
		return v
	}
	parts := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
	return d.resolve(t, mapAt(t, d.root, parts...))
}

// documented returns pattern -> status code -> media type of every
// operation ("" for a response without content).
func (d *apiDoc) documented(t testing.TB) map[string]map[int]string {
	t.Helper()
	out := map[string]map[int]string{}
	for path, item := range mapAt(t, d.root, "paths") {
		for method, op := range item.(map[string]any) {
			pattern := strings.ToUpper(method) + " " + path
			codes := map[int]string{}
			for code, resp := range mapAt(t, op, "responses") {
				n, err := strconv.Atoi(fmt.Sprint(code))
				if err != nil {
					t.Fatalf("%s %s: response %q is not a status code", d.name, pattern, code)
				}
				r := d.resolve(t, resp.(map[string]any))
				media := ""
				if c, ok := r["content"].(map[string]any); ok {
					if len(c) != 1 {
						t.Fatalf("%s %s %d: want exactly one media type", d.name, pattern, n)
					}
					for m := range c {
						media = m
					}
				}
				codes[n] = media
			}
			out[pattern] = codes
		}
	}
	return out
}

func specsAsMap(specs ...[]routeSpec) map[string][]int {
	out := map[string][]int{}
	for _, ss := range specs {
		for _, s := range ss {
			c := slices.Clone(s.Codes)
			slices.Sort(c)
			out[s.pattern()] = c
		}
	}
	return out
}

func docAsMap(doc map[string]map[int]string) map[string][]int {
	out := map[string][]int{}
	for p, codes := range doc {
		for c := range codes {
			out[p] = append(out[p], c)
		}
		slices.Sort(out[p])
	}
	return out
}

// TestRouteTablesMatchOpenAPI: the routes registered (from the tables) and
// their declared status codes are exactly those documented.
func TestRouteTablesMatchOpenAPI(t *testing.T) {
	tests := []struct {
		doc   string
		specs map[string][]int
	}{
		{"distribution.yaml", specsAsMap(specsOf(distributionRoutes))},
		{"admin.yaml", specsAsMap(specsOf(adminRoutes), specsOf(opsRoutes))},
	}
	for _, tc := range tests {
		t.Run(tc.doc, func(t *testing.T) {
			doc := docAsMap(loadDoc(t, tc.doc).documented(t))
			if !reflect.DeepEqual(doc, tc.specs) {
				t.Fatalf("route table and %s differ:\n%s", tc.doc, diffRoutes(tc.specs, doc))
			}
		})
	}
}

func diffRoutes(code, doc map[string][]int) string {
	var lines []string
	for p, c := range code {
		if d, ok := doc[p]; !ok {
			lines = append(lines, fmt.Sprintf("  %s: served, not documented", p))
		} else if !slices.Equal(c, d) {
			lines = append(lines, fmt.Sprintf("  %s: served codes %v, documented %v", p, c, d))
		}
	}
	for p := range doc {
		if _, ok := code[p]; !ok {
			lines = append(lines, fmt.Sprintf("  %s: documented, not served", p))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// jsonFields returns the JSON member names of a struct type and which of
// them are always present (no omitempty).
func jsonFields(t reflect.Type) (all, always []string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") {
			always = append(always, name)
		}
	}
	sort.Strings(all)
	sort.Strings(always)
	return all, always
}

// TestSchemasMatchGoTypes: every documented schema has exactly the JSON
// members of the Go type that produces or consumes it, and a response
// schema requires exactly the members that are always written.
func TestSchemasMatchGoTypes(t *testing.T) {
	type binding struct {
		typ      any
		response bool
	}
	tests := []struct {
		doc      string
		bindings map[string]binding
		scalars  []string // schemas that are not objects
	}{
		{"distribution.yaml", map[string]binding{
			"ExtractRequest":  {extractBody{}, false},
			"ExtractFilters":  {extractFilters{}, false},
			"ExtractResponse": {extractResponse{}, true},
			"ExtractedProxy":  {proxyJSON{}, true},
			"Problem":         {problem{}, true},
			"FieldError":      {fieldError{}, true},
		}, nil},
		{"admin.yaml", map[string]binding{
			"Ack":                {ack{}, true},
			"SwitchRequest":      {switchBody{}, false},
			"Status":             {controller.Status{}, true},
			"SnapshotStatus":     {controller.SnapshotStatus{}, true},
			"ExtractionCounters": {controller.ExtractionCounters{}, true},
			"WorkerStatus":       {controller.WorkerStatus{}, true},
			"WorkerHeartbeat":    {controller.WorkerHeartbeat{}, true},
			"ReloadStatus":       {controller.ReloadStatus{}, true},
			"StorageStatus":      {controller.StorageStatus{}, true},
			"StoreStatus":        {controller.StoreStatus{}, true},
			"UpstreamList":       {upstreamsResponse{}, true},
			"UpstreamStatus":     {controller.UpstreamStatus{}, true},
			"FetchStatus":        {controller.FetchStatus{}, true},
			"RoutingList":        {routingsResponse{}, true},
			"RoutingStatus":      {controller.RoutingStatus{}, true},
			"ProxyList":          {proxiesResponse{}, true},
			"ProxyView":          {controller.ProxyView{}, true},
			"AuditList":          {auditResponse{}, true},
			"AuditEntry":         {auditJSON{}, true},
			"Problem":            {problem{}, true},
			"FieldError":         {fieldError{}, true},
		}, []string{"Name", "ProxyState"}},
	}
	for _, tc := range tests {
		t.Run(tc.doc, func(t *testing.T) {
			d := loadDoc(t, tc.doc)
			schemas := mapAt(t, d.root, "components", "schemas")
			for name := range schemas {
				if _, ok := tc.bindings[name]; !ok && !slices.Contains(tc.scalars, name) {
					t.Errorf("schema %s is bound to no Go type", name)
				}
			}
			for name, b := range tc.bindings {
				t.Run(name, func(t *testing.T) {
					s, ok := schemas[name].(map[string]any)
					if !ok {
						t.Fatalf("schema %s missing", name)
					}
					var props []string
					for p := range mapAt(t, s, "properties") {
						props = append(props, p)
					}
					sort.Strings(props)
					all, always := jsonFields(reflect.TypeOf(b.typ))
					if !slices.Equal(props, all) {
						t.Errorf("properties %v, Go type has %v", props, all)
					}
					if !b.response {
						return
					}
					var req []string
					if r, ok := s["required"].([]any); ok {
						for _, v := range r {
							req = append(req, v.(string))
						}
					}
					sort.Strings(req)
					if !slices.Equal(req, always) {
						t.Errorf("required %v, Go type always writes %v", req, always)
					}
				})
			}
		})
	}
}
