package plugin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Bounds of a plugins directory.
const (
	// MaxFileBytes bounds one plugin file.
	MaxFileBytes = 256 << 10
	// MaxPlugins bounds the plugin files of one directory.
	MaxPlugins = 1000
	// maxNameLen bounds a plugin name (the file name without extension).
	maxNameLen = 64
	// readDirBatch is how many directory entries are read at a time, so a
	// directory flooded with other files is rejected without listing it all.
	readDirBatch = 256
	// maxDirEntries bounds the entries scanned, plugin files or not.
	maxDirEntries = 20 * MaxPlugins
)

// ErrUnknownPlugin is returned (wrapped) by Set.Adapter for a name the set
// does not hold.
var ErrUnknownPlugin = errors.New("unknown plugin")

// Set is an immutable generation of loaded plugins. The zero value and nil
// are empty sets.
type Set struct {
	plugins map[string]*entry
}

type entry struct {
	name    string
	file    string // base name, for messages
	kind    string
	digest  string
	adapter upstream.Adapter // guarded
}

var _ upstream.Provider = (*Set)(nil)

// Adapter returns the named plugin's adapter, wrapped in the host guard.
func (s *Set) Adapter(name string) (upstream.Adapter, error) {
	if s != nil {
		if e, ok := s.plugins[name]; ok {
			return e.adapter, nil
		}
	}
	return nil, fmt.Errorf("resolving plugin %q: %w", name, ErrUnknownPlugin)
}

// Names lists the plugins of the set, sorted.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	out := make([]string, 0, len(s.plugins))
	for n := range s.plugins {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Len is the number of plugins.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.plugins)
}

// Digest is the hex SHA-256 of the plugin's file, so a reload can tell which
// plugins changed and rebuild only the upstreams that use them.
func (s *Set) Digest(name string) (string, bool) {
	if s == nil {
		return "", false
	}
	e, ok := s.plugins[name]
	if !ok {
		return "", false
	}
	return e.digest, true
}

// Kind is the extension of the file the plugin was loaded from.
func (s *Set) Kind(name string) (string, bool) {
	if s == nil {
		return "", false
	}
	e, ok := s.plugins[name]
	if !ok {
		return "", false
	}
	return e.kind, true
}

// Describe returns the declared inputs of a plugin whose kind supports it.
func (s *Set) Describe(name string) (Description, bool) {
	if s == nil {
		return Description{}, false
	}
	e, ok := s.plugins[name]
	if !ok {
		return Description{}, false
	}
	g, ok := e.adapter.(*guarded)
	if !ok {
		return Description{}, false
	}
	d, ok := g.inner.(Describer)
	if !ok {
		return Description{}, false
	}
	return d.Describe(), true
}

// Describer is implemented by adapters that declare their inputs, so
// configuration checks can report an unknown or missing parameter before the
// first fetch.
type Describer interface {
	Describe() Description
}

// Description is what a plugin declares about itself.
type Description struct {
	Text    string
	Params  []Param
	Secrets []string
}

// Param is one declared parameter.
type Param struct {
	Name     string
	Required bool
	Default  string
}

// LoadResult is one load of a plugins directory: the plugins that compiled
// and, by plugin name, the error of each that did not.
type LoadResult struct {
	Set    *Set
	Errors map[string]error
}

// Err joins the per-plugin errors, sorted by name; nil when all loaded.
func (r LoadResult) Err() error {
	if len(r.Errors) == 0 {
		return nil
	}
	names := make([]string, 0, len(r.Errors))
	for n := range r.Errors {
		names = append(names, n)
	}
	sort.Strings(names)
	errs := make([]error, 0, len(names))
	for _, n := range names {
		errs = append(errs, r.Errors[n])
	}
	return errors.Join(errs...)
}

// Load compiles every plugin file of dir. Files whose extension is not a
// registered kind (README.md, backups) and hidden files are ignored. The
// returned error is for the directory itself (unreadable, too many plugin
// files); a broken plugin is reported in LoadResult.Errors and the others
// still load.
func Load(dir string) (LoadResult, error) {
	files, err := listPluginFiles(dir)
	if err != nil {
		return LoadResult{}, err
	}
	res := LoadResult{Set: &Set{plugins: map[string]*entry{}}, Errors: map[string]error{}}
	byName := map[string][]pluginFile{}
	for _, f := range files {
		byName[f.name] = append(byName[f.name], f)
	}
	for name, fs := range byName {
		if len(fs) > 1 {
			bases := make([]string, len(fs))
			for i, f := range fs {
				bases[i] = filepath.Base(f.path)
			}
			sort.Strings(bases)
			res.Errors[name] = fmt.Errorf("plugin %s: defined by several files: %s", name, strings.Join(bases, ", "))
			continue
		}
		e, err := loadFile(fs[0])
		if err != nil {
			res.Errors[name] = err
			continue
		}
		res.Set.plugins[name] = e
	}
	return res, nil
}

// LoadFile compiles one plugin file, wherever it lives (plugin test).
func LoadFile(path string) (*Set, error) {
	f, ok, err := classify(path, filepath.Base(path))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("loading plugin %s: extension is not a registered kind (have %s)", path, strings.Join(Kinds(), ", "))
	}
	e, err := loadFile(f)
	if err != nil {
		return nil, err
	}
	return &Set{plugins: map[string]*entry{e.name: e}}, nil
}

// Merge builds the generation to run after a reload: every plugin that
// loaded now, plus the previous version of each plugin that failed now (a
// broken edit keeps the old adapter running). Plugins absent from next — the
// file was removed — are dropped.
func Merge(previous *Set, next LoadResult) *Set {
	out := &Set{plugins: map[string]*entry{}}
	if next.Set != nil {
		for n, e := range next.Set.plugins {
			out.plugins[n] = e
		}
	}
	for n := range next.Errors {
		if _, ok := out.plugins[n]; ok {
			continue
		}
		if previous != nil {
			if e, ok := previous.plugins[n]; ok {
				out.plugins[n] = e
			}
		}
	}
	return out
}

type pluginFile struct {
	path, name, kind string
	loader           KindLoader
	maxBytes         int64
}

func listPluginFiles(dir string) ([]pluginFile, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("reading plugins directory: %w", err)
	}
	defer d.Close()
	var files []pluginFile
	scanned := 0
	for {
		ents, err := d.ReadDir(readDirBatch)
		for _, de := range ents {
			scanned++
			if scanned > maxDirEntries {
				return nil, fmt.Errorf("reading plugins directory %s: more than %d entries", dir, maxDirEntries)
			}
			if de.IsDir() {
				continue
			}
			f, ok, cerr := classify(filepath.Join(dir, de.Name()), de.Name())
			if cerr != nil || !ok {
				continue // name errors surface when the file is a plugin; see below
			}
			files = append(files, f)
			if len(files) > MaxPlugins {
				return nil, fmt.Errorf("reading plugins directory %s: more than %d plugin files", dir, MaxPlugins)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading plugins directory %s: %w", dir, err)
		}
		if len(ents) == 0 {
			break
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	return files, nil
}

// classify maps a file name to its kind. ok is false for files that are not
// plugins (hidden, unregistered extension). A plugin file with a bad name is
// still returned so the error reaches the operator.
func classify(path, base string) (pluginFile, bool, error) {
	if strings.HasPrefix(base, ".") {
		return pluginFile{}, false, nil
	}
	dot := strings.LastIndexByte(base, '.')
	if dot < 0 {
		return pluginFile{}, false, nil
	}
	ext := base[dot+1:]
	k, ok := kindLoader(ext)
	if !ok {
		return pluginFile{}, false, nil
	}
	return pluginFile{path: path, name: base[:dot], kind: ext, loader: k.loader, maxBytes: k.maxBytes}, true, nil
}

func loadFile(f pluginFile) (*entry, error) {
	base := filepath.Base(f.path)
	wrap := func(err error) error { return fmt.Errorf("plugin %s (%s): %w", f.name, base, err) }
	if err := ValidName(f.name); err != nil {
		return nil, wrap(err)
	}
	data, err := readBounded(f.path, f.maxBytes)
	if err != nil {
		return nil, wrap(err)
	}
	a, err := compileGuarded(f.loader, f.name, data)
	if err != nil {
		return nil, wrap(err)
	}
	sum := sha256.Sum256(data)
	return &entry{name: f.name, file: base, kind: f.kind, digest: hex.EncodeToString(sum[:]), adapter: &guarded{name: f.name, inner: a}}, nil
}

// compileGuarded runs a kind's loader, turning a panic in it into an error:
// one hostile file must not take the reload down.
func compileGuarded(l KindLoader, name string, data []byte) (a upstream.Adapter, err error) {
	defer func() {
		if r := recover(); r != nil {
			a, err = nil, fmt.Errorf("compiling: loader panicked: %v", r)
		}
	}()
	a, err = l(name, data)
	if err == nil && a == nil {
		err = errors.New("compiling: loader returned no adapter")
	}
	return a, err
}

func readBounded(path string, limit int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("reading: not a regular file")
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("reading: larger than %d bytes", limit)
	}
	data, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("reading: larger than %d bytes", limit)
	}
	return data, nil
}

// ValidName reports whether name can name a plugin: 1 to 64 of lowercase
// letters, digits, '-' and '_', starting with a letter or digit. Names are
// referenced from configuration, so they stay plain.
func ValidName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("invalid plugin name %q: want 1 to %d characters", name, maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '_') && i > 0:
		default:
			return fmt.Errorf("invalid plugin name %q: want lowercase letters, digits, '-' and '_'", name)
		}
	}
	return nil
}
