// Package version carries the build version, set by the linker from
// `git describe` (see the Makefile).
package version

// Version is overwritten at link time.
var Version = "0.0.0-dev"
