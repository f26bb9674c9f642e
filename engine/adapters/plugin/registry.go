package plugin

import (
	"fmt"
	"sort"
	"sync"

	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// KindLoader compiles one plugin file of a kind. name is the file name
// without extension; data is the whole file (at most MaxFileBytes, or the
// kind's KindOptions.MaxFileBytes). It must not touch files, network or
// environment.
type KindLoader func(name string, data []byte) (upstream.Adapter, error)

// KindOptions are per-kind settings of RegisterKindOptions.
type KindOptions struct {
	// MaxFileBytes bounds one file of the kind; 0 means MaxFileBytes.
	// Compiled kinds need more than a template: a WASM module built by Go
	// weighs megabytes.
	MaxFileBytes int64
}

type kindEntry struct {
	loader   KindLoader
	maxBytes int64
}

var kinds = struct {
	sync.RWMutex
	m map[string]kindEntry
}{m: map[string]kindEntry{}}

// RegisterKind registers the loader for plugin files named NAME.ext. It is
// meant for init(); a duplicate or malformed ext panics, as a programming
// error that no configuration can fix.
func RegisterKind(ext string, loader KindLoader) {
	RegisterKindOptions(ext, loader, KindOptions{})
}

// RegisterKindOptions is RegisterKind with per-kind settings.
func RegisterKindOptions(ext string, loader KindLoader, opts KindOptions) {
	if !validExt(ext) {
		panic(fmt.Sprintf("plugin: invalid kind extension %q (want lowercase letters and digits, no dot)", ext))
	}
	if loader == nil {
		panic("plugin: nil loader for kind " + ext)
	}
	if opts.MaxFileBytes < 0 {
		panic("plugin: negative MaxFileBytes for kind " + ext)
	}
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = MaxFileBytes
	}
	kinds.Lock()
	defer kinds.Unlock()
	if _, dup := kinds.m[ext]; dup {
		panic("plugin: kind " + ext + " registered twice")
	}
	kinds.m[ext] = kindEntry{loader: loader, maxBytes: opts.MaxFileBytes}
}

// Kinds lists the registered extensions, sorted.
func Kinds() []string {
	kinds.RLock()
	defer kinds.RUnlock()
	out := make([]string, 0, len(kinds.m))
	for k := range kinds.m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func kindLoader(ext string) (kindEntry, bool) {
	kinds.RLock()
	defer kinds.RUnlock()
	k, ok := kinds.m[ext]
	return k, ok
}

func validExt(ext string) bool {
	if ext == "" || len(ext) > 16 {
		return false
	}
	for i := 0; i < len(ext); i++ {
		c := ext[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
