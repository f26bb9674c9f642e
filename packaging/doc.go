// Package packaging builds the proxypool .deb and .rpm from
// packaging/nfpm.yaml with the nfpm library, and turns `git describe`
// output into package versions. packaging/cmd/mkpkg is its command-line
// wiring (`make package`).
//
// The package owns the package definition (nfpm.yaml, the systemd units,
// sysusers.d/tmpfiles.d entries and maintainer scripts beside it); its
// tests check that .goreleaser.yaml describes the same packages and, with
// PROXYPOOL_PACKAGE_TEST=1 (`make package-test`, root, Debian), build,
// inspect, socket-activate and install them.
//
// It must never import engine/ or cmd/: it packages the binary, it does
// not link it.
//
// nfpm stays at v2.45.x: from v2.46 its packages and tests import
// go.digitalxero.dev modules that the Go module proxy refuses to serve,
// which makes `go mod tidy` (and so `make lint`) fail for everyone.
package packaging
