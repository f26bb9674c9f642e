package plugin

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// ResolveParams applies a plugin's declared params to the upstream's: each
// declared param takes the given value or its default. With strict, a
// param the plugin does not declare, or a missing required one, is an
// error; parsing (not strict) only fills defaults. Every kind uses it, so
// templates and modules read params the same way.
func ResolveParams(declared []Param, in map[string]string, strict bool) (map[string]string, error) {
	out := make(map[string]string, len(declared))
	if strict {
		var unknown []string
		for k := range in {
			if !slices.ContainsFunc(declared, func(p Param) bool { return p.Name == k }) {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return nil, fmt.Errorf("params not declared by the plugin: %s", strings.Join(unknown, ", "))
		}
	}
	for _, p := range declared {
		v, ok := in[p.Name]
		switch {
		case ok:
			out[p.Name] = v
		case p.Required && strict:
			return nil, fmt.Errorf("param %s is required", p.Name)
		default:
			out[p.Name] = p.Default
		}
	}
	return out, nil
}

// ResolveSecrets maps every declared secret, "" when not supplied: many
// vendors authenticate by caller IP instead, and the plugin decides. A
// secret the plugin does not declare is an error.
func ResolveSecrets(declared []string, in map[string]string) (map[string]string, error) {
	var unknown []string
	for k := range in {
		if !slices.Contains(declared, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("secrets not declared by the plugin: %s", strings.Join(unknown, ", "))
	}
	out := make(map[string]string, len(declared))
	for _, s := range declared {
		out[s] = in[s]
	}
	return out, nil
}
