// Package expr is the "yaml" plugin kind: provider adapters written as
// templates whose request and parse steps are github.com/expr-lang/expr
// expressions (seed 000 §8, §15; SPEC §9). The format is described in
// plugins/README.md.
//
// Safety model. Every expression is compiled at load time against a typed
// environment; the language's builtins are all disabled and only a vetted
// list of pure ones is enabled back (no now(), date(), env, JSON encoding,
// string repetition or accumulation); custom helpers are pure functions.
// Bounds: MaxExprBytes of source and MaxNodes AST nodes per expression, a
// VM memory budget per call, and an iteration budget: every predicate body
// (map, filter, all…) is patched to tick a per-call counter that also checks
// the caller's context, so a runaway template stops at the context deadline
// or after maxTicks iterations, whichever comes first. Inputs are bounded
// too: MaxLines lines of at most MaxLineBytes, and plugin.MaxProxies proxies.
// Not budgeted: the bytes of strings built with "+" inside a loop. With a
// reasonable template they are a few bytes per entry; a template written to
// exhaust memory that way is a hostile file in /etc/proxypool/plugins, which
// these bounds limit (MaxNodes, MaxLines, the iteration budget) but do not
// claim to stop. Vendor data alone cannot amplify a template's output.
//
// Invalid entries: one proxy entry that cannot be converted (bad port, bad
// host, unknown field, wrong type) fails the whole parse with an *EntryError
// naming the index and the field, which the controller counts as Error.
// Skipping would hide a template or vendor fault behind a smaller batch, and
// Error, unlike Empty, does not advance a sequential routing. A template
// that expects junk lines filters them explicitly.
//
// This package must never import the controller or storage, and never do
// I/O: no files, network, environment or clock (the host passes "now").
package expr
