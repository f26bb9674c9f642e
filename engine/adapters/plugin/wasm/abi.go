package wasm

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// ABIVersion is the version of the ABI this host implements; a module's
// proxypool_abi_version must return it.
const ABIVersion = 1

// Exports of ABI v1.
const (
	exportInitialize = "_initialize"
	exportStart      = "_start"
	exportMemory     = "memory"
	exportABIVersion = "proxypool_abi_version"
	exportAlloc      = "proxypool_alloc"
	exportFree       = "proxypool_free"
	exportDescribe   = "proxypool_describe"
	exportBuild      = "proxypool_build_request"
	exportParse      = "proxypool_parse_response"
)

// wasiModule is the one module a guest may import from.
const wasiModule = "wasi_snapshot_preview1"

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// signature is a function type, params then results.
type signature struct {
	params, results []api.ValueType
}

// requiredExports are the functions of ABI v1 and their types.
var requiredExports = []struct {
	name string
	sig  signature
}{
	{exportInitialize, signature{nil, nil}},
	{exportABIVersion, signature{nil, []api.ValueType{i32}}},
	{exportAlloc, signature{[]api.ValueType{i32}, []api.ValueType{i32}}},
	{exportFree, signature{[]api.ValueType{i32, i32}, nil}},
	{exportDescribe, signature{nil, []api.ValueType{i64}}},
	{exportBuild, signature{[]api.ValueType{i32, i32}, []api.ValueType{i64}}},
	{exportParse, signature{[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i64}}},
}

// checkModule verifies a compiled module's shape before anything of it
// runs: its imports are WASI functions the host provides, and it exports
// the ABI's memory and functions with their types. Every problem is
// reported, not only the first.
func checkModule(cm wazero.CompiledModule, wasi map[string]api.FunctionDefinition) error {
	var errs []error
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != wasiModule {
			errs = append(errs, fmt.Errorf("imports function %s.%s: only %s functions are provided", trunc(mod), trunc(name), wasiModule))
			continue
		}
		def, ok := wasi[name]
		if !ok {
			errs = append(errs, fmt.Errorf("imports %s.%s, which this host does not provide", wasiModule, trunc(name)))
			continue
		}
		if !slices.Equal(def.ParamTypes(), f.ParamTypes()) || !slices.Equal(def.ResultTypes(), f.ResultTypes()) {
			errs = append(errs, fmt.Errorf("imports %s.%s with type %s, want %s", wasiModule, name, sigString(f), sigString(def)))
		}
	}
	for _, m := range cm.ImportedMemories() {
		mod, name, _ := m.Import()
		errs = append(errs, fmt.Errorf("imports memory %s.%s: a module must define its own memory", trunc(mod), trunc(name)))
	}
	if _, ok := cm.ExportedMemories()[exportMemory]; !ok {
		errs = append(errs, fmt.Errorf("does not export its memory as %q", exportMemory))
	}
	exports := cm.ExportedFunctions()
	if _, hasStart := exports[exportStart]; hasStart {
		if _, hasInit := exports[exportInitialize]; !hasInit {
			errs = append(errs, errors.New("is a command module (exports _start, not _initialize): build it as a reactor, with Go: go build -buildmode=c-shared"))
		}
	}
	for _, want := range requiredExports {
		f, ok := exports[want.name]
		if !ok {
			if want.name == exportInitialize {
				if _, hasStart := exports[exportStart]; hasStart {
					continue // reported above, in the terms of the likely mistake
				}
			}
			errs = append(errs, fmt.Errorf("does not export function %s", want.name))
			continue
		}
		if !slices.Equal(f.ParamTypes(), want.sig.params) || !slices.Equal(f.ResultTypes(), want.sig.results) {
			errs = append(errs, fmt.Errorf("exports %s with type %s, want %s", want.name, sigString(f), want.sig))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	sort.Strings(msgs)
	return fmt.Errorf("%w: %s", ErrABI, strings.Join(msgs, "; "))
}

func (s signature) String() string {
	return typesString(s.params) + " -> " + typesString(s.results)
}

func sigString(f api.FunctionDefinition) string {
	return signature{f.ParamTypes(), f.ResultTypes()}.String()
}

func typesString(ts []api.ValueType) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = api.ValueTypeName(t)
	}
	return "(" + strings.Join(names, ", ") + ")"
}
