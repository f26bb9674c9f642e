// Command mkpkg builds the proxypool .deb and .rpm for each architecture
// from packaging/nfpm.yaml, and writes manifest.json beside them. It is
// `make package`'s wiring; the work is in package packaging.
//
//	mkpkg -version "$(git describe --tags --always --dirty)" -arch "amd64 arm64" \
//	      -bindir bin -out dist -optional 'plugins/*.wasm'
//
// The binary for ARCH is read from BINDIR/linux_ARCH/proxypool.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/proxypool/proxypool/packaging"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var (
		config   = flag.String("config", "packaging/nfpm.yaml", "nfpm configuration")
		root     = flag.String("root", ".", "repository root (relative paths in the configuration start here)")
		describe = flag.String("version", "0.0.0-dev", "`git describe` output")
		arches   = flag.String("arch", "amd64", "Go architectures, space or comma separated")
		bindir   = flag.String("bindir", "bin", "holds linux_ARCH/proxypool")
		out      = flag.String("out", "dist", "output directory")
		formats  = flag.String("formats", "deb,rpm", "package formats")
		optional list
	)
	flag.Var(&optional, "optional", "content source glob that may match nothing (repeatable)")
	flag.Parse()

	version, err := packaging.PackageVersion(*describe)
	if err != nil {
		fail(err)
	}
	m := packaging.Manifest{Describe: *describe, Version: version}
	for _, arch := range fields(*arches) {
		arts, err := packaging.Build(packaging.BuildOptions{
			Config:   *config,
			Root:     *root,
			Describe: *describe,
			Arch:     arch,
			BinDir:   filepath.Join(*bindir, "linux_"+arch),
			OutDir:   *out,
			Formats:  fields(*formats),
			Optional: optional,
		})
		if err != nil {
			fail(err)
		}
		for _, a := range arts {
			fmt.Printf("%s %s %s\n", a.Format, a.Arch, a.Path)
			a.Path = filepath.Base(a.Path) // the manifest sits beside the packages
			m.Artifacts = append(m.Artifacts, a)
		}
	}
	if err := packaging.WriteManifest(filepath.Join(*out, "manifest.json"), m); err != nil {
		fail(err)
	}
}

func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mkpkg:", err)
	os.Exit(1)
}
