// Package plugin is the provider plugin host (seed 000 §8, §15; SPEC §9).
//
// It owns the registry of plugin kinds, the loading of a plugins directory
// into an immutable Set, the keep-the-previous-version merge used on reload,
// and the guard every adapter is wrapped in: panics are turned into errors,
// requests are checked for header injection, and returned candidates are
// validated and counted against MaxProxies whatever kind produced them.
//
// Kinds register themselves by file extension from init()
// (RegisterKind("yaml", …) in subpackage expr, RegisterKindOptions("wasm",
// …) with a larger file bound in subpackage wasm), so the set of kinds a
// binary supports is the set of kind packages it imports.
//
// Load semantics: every file is compiled; a broken file is reported in
// LoadResult.Errors under its plugin name and never stops the others. On
// reload, Merge(previous, next) keeps the previous version of a plugin that
// now fails to load, takes every plugin that loaded, and drops plugins whose
// file is gone.
//
// The host performs all I/O of a fetch; an adapter only turns inputs into a
// Request and a Response into candidates. This package must never import the
// controller, a storage adapter, or a kind package (kinds import it).
//
// Metrics: none; the controller counts reloads and fetch outcomes.
package plugin
