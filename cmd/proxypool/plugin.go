package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	_ "github.com/proxypool/proxypool/engine/adapters/plugin/expr" // the expr template kind
	_ "github.com/proxypool/proxypool/engine/adapters/plugin/wasm" // the WASM module kind
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// maxResponseFile bounds a recorded response read by `plugin test`.
const maxResponseFile = 64 << 20

// kv collects repeated --param k=v flags.
type kv map[string]string

func (m kv) String() string { return "" }
func (m kv) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	m[k] = v
	return nil
}

func pluginCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "list":
		fs := flag.NewFlagSet("plugin list", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dir := fs.String("dir", config.DefaultPluginsDir, "plugins directory")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		return pluginList(*dir, stdout, stderr)
	case "test":
		return pluginTest(args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return 2
}

func pluginList(dir string, stdout, stderr io.Writer) int {
	res, err := plugin.Load(dir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	for _, name := range res.Set.Names() {
		kind, _ := res.Set.Kind(name)
		d, _ := res.Set.Describe(name)
		fmt.Fprintf(stdout, "%-24s %-5s %s\n", name, kind, d.Text)
	}
	failed := make([]string, 0, len(res.Errors))
	for name := range res.Errors {
		failed = append(failed, name)
	}
	sort.Strings(failed)
	for _, name := range failed {
		fmt.Fprintf(stdout, "%-24s BROKEN %v\n", name, res.Errors[name])
	}
	if len(failed) > 0 {
		return 1
	}
	return 0
}

// pluginTest dry-runs one plugin: the request it would send for the given
// params, then what it parses out of a recorded response.
func pluginTest(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plugin test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", config.DefaultPluginsDir, "plugins directory (ignored when NAME is a file path)")
	response := fs.String("response", "", "file holding a recorded response body")
	status := fs.Int("status", 200, "HTTP status of the recorded response")
	count := fs.Int("count", 10, "how many proxies to ask for")
	params, secrets := kv{}, kv{}
	fs.Var(params, "param", "k=v plugin parameter (repeatable)")
	fs.Var(secrets, "secret", "k=env:NAME or k=file:/path secret reference (repeatable)")
	// The name may come before or after the flags.
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	}
	if name == "" {
		fmt.Fprintln(stderr, "plugin test: NAME is required")
		return 2
	}
	adapter, err := resolvePlugin(name, *dir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	resolved := map[string]string{}
	for k, ref := range secrets {
		s, err := config.ParseSecretRef(ref)
		if err == nil {
			err = s.Resolve()
		}
		if err != nil {
			fmt.Fprintf(stderr, "secret %s: %v\n", k, err)
			return 1
		}
		resolved[k] = s.Value()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	req, err := adapter.BuildRequest(ctx, upstream.BuildInput{Params: params, Secrets: resolved, Count: *count, Now: now})
	if err != nil {
		fmt.Fprintln(stderr, "build request:", err)
		return 1
	}
	fmt.Fprintln(stdout, "request:")
	fmt.Fprintln(stdout, redactValues("  "+req.Method+" "+req.URL, resolved))
	keys := make([]string, 0, len(req.Headers))
	for k := range req.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintln(stdout, redactValues("  "+k+": "+req.Headers[k], resolved))
	}
	if len(req.Body) > 0 {
		fmt.Fprintln(stdout, redactValues("  body: "+string(req.Body), resolved))
	}
	if *response == "" {
		return 0
	}
	body, err := readBounded(*response, maxResponseFile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	res, err := adapter.ParseResponse(ctx, upstream.Response{Status: *status, Headers: map[string]string{}, Body: body, Params: params}, now)
	if err != nil {
		fmt.Fprintln(stdout, "parse: error:", err)
		return 1
	}
	type row struct {
		Scheme    string    `json:"scheme"`
		Host      string    `json:"host"`
		Port      uint16    `json:"port"`
		Username  string    `json:"username,omitempty"`
		Password  string    `json:"password,omitempty"`
		ExpiresAt time.Time `json:"expiresAt"`
		Region    string    `json:"region,omitempty"`
		Carrier   string    `json:"carrier,omitempty"`
	}
	rows := make([]row, 0, len(res.Proxies))
	for _, c := range res.Proxies {
		r := row{Scheme: string(c.Scheme), Host: c.Host, Port: c.Port, Username: c.Username, ExpiresAt: c.Expiry(now, config.DefaultProxyTTL).UTC(), Region: c.Region, Carrier: c.Carrier}
		if c.Password != "" {
			r.Password = "REDACTED"
		}
		rows = append(rows, r)
	}
	fmt.Fprintf(stdout, "parsed %d proxies", len(rows))
	if res.RetryAfter > 0 {
		fmt.Fprintf(stdout, " (retry after %s)", res.RetryAfter)
	}
	fmt.Fprintln(stdout, ":")
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rows); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// resolvePlugin loads NAME from dir, or the file NAME when it is a path.
func resolvePlugin(name, dir string) (upstream.Adapter, error) {
	if strings.ContainsRune(name, filepath.Separator) || filepath.Ext(name) != "" {
		set, err := plugin.LoadFile(name)
		if err != nil {
			return nil, err
		}
		names := set.Names()
		if len(names) != 1 {
			return nil, fmt.Errorf("plugin file %s: no plugin loaded", name)
		}
		return set.Adapter(names[0])
	}
	res, err := plugin.Load(dir)
	if err != nil {
		return nil, err
	}
	if e, ok := res.Errors[name]; ok {
		return nil, fmt.Errorf("plugin %s is broken: %w", name, e)
	}
	return res.Set.Adapter(name)
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("reading %s: larger than %d bytes", path, limit)
	}
	return b, nil
}

func redactValues(s string, secrets map[string]string) string {
	for _, v := range secrets {
		if v != "" {
			s = strings.ReplaceAll(s, v, "REDACTED")
		}
	}
	return s
}

// checkPlugins verifies, for config check, that every plugin the config
// references exists, loads, and gets the params it declares.
func checkPlugins(c *config.Config) error {
	res, err := loadPlugins(c)
	if err != nil {
		return err
	}
	var errs config.Errors
	for i, u := range c.Upstreams {
		if e, ok := res.Errors[u.Provider.Plugin]; ok {
			errs = append(errs, config.FieldError{Path: fmt.Sprintf("upstreams[%d].provider.plugin", i), Msg: fmt.Sprintf("plugin %q does not load: %v", u.Provider.Plugin, e)})
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return validatePlugins(c, res.Set)
}

// loadPlugins loads the plugins directory. A config without upstreams
// needs no plugin, so a missing directory is then not an error.
func loadPlugins(c *config.Config) (plugin.LoadResult, error) {
	if len(c.Upstreams) == 0 {
		if _, err := os.Stat(c.PluginsDir); errors.Is(err, fs.ErrNotExist) {
			return plugin.LoadResult{Set: &plugin.Set{}}, nil
		}
	}
	res, err := plugin.Load(c.PluginsDir)
	if err != nil {
		return res, fmt.Errorf("plugins: %w", err)
	}
	return res, nil
}

// validatePlugins checks the config against a loaded set. On reload the set
// is the merge of the new load with the previous one, so a plugin broken on
// disk keeps its running version, while a plugin removed from disk that the
// config still names fails here.
func validatePlugins(c *config.Config, set *plugin.Set) error {
	var errs config.Errors
	for i, u := range c.Upstreams {
		path := fmt.Sprintf("upstreams[%d].provider.plugin", i)
		name := u.Provider.Plugin
		d, ok := set.Describe(name)
		if _, err := set.Adapter(name); err != nil {
			errs = append(errs, config.FieldError{Path: path, Msg: fmt.Sprintf("plugin %q not found in %s", name, c.PluginsDir)})
			continue
		}
		if !ok {
			continue
		}
		for _, p := range d.Params {
			if _, set := u.Provider.Params[p.Name]; p.Required && !set {
				errs = append(errs, config.FieldError{Path: fmt.Sprintf("upstreams[%d].provider.params.%s", i, p.Name), Msg: fmt.Sprintf("required by plugin %q", name)})
			}
		}
		declared := map[string]bool{}
		for _, p := range d.Params {
			declared[p.Name] = true
		}
		for k := range u.Provider.Params {
			if !declared[k] {
				errs = append(errs, config.FieldError{Path: fmt.Sprintf("upstreams[%d].provider.params.%s", i, k), Msg: fmt.Sprintf("not declared by plugin %q", name)})
			}
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}
