package plugin

import (
	"fmt"
	"sort"
	"sync"

	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// KindLoader compiles one plugin file of a kind. name is the file name
// without extension; data is the whole file (at most MaxFileBytes). It must
// not touch files, network or environment.
type KindLoader func(name string, data []byte) (upstream.Adapter, error)

var kinds = struct {
	sync.RWMutex
	m map[string]KindLoader
}{m: map[string]KindLoader{}}

// RegisterKind registers the loader for plugin files named NAME.ext. It is
// meant for init(); a duplicate or malformed ext panics, as a programming
// error that no configuration can fix.
func RegisterKind(ext string, loader KindLoader) {
	if !validExt(ext) {
		panic(fmt.Sprintf("plugin: invalid kind extension %q (want lowercase letters and digits, no dot)", ext))
	}
	if loader == nil {
		panic("plugin: nil loader for kind " + ext)
	}
	kinds.Lock()
	defer kinds.Unlock()
	if _, dup := kinds.m[ext]; dup {
		panic("plugin: kind " + ext + " registered twice")
	}
	kinds.m[ext] = loader
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

func kindLoader(ext string) (KindLoader, bool) {
	kinds.RLock()
	defer kinds.RUnlock()
	l, ok := kinds.m[ext]
	return l, ok
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
