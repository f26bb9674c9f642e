package packaging

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	coreRE     = regexp.MustCompile(`^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
	ident      = regexp.MustCompile(`^[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*$`)
	shaRE      = regexp.MustCompile(`^[0-9a-f]{4,40}$`)
	distanceRE = regexp.MustCompile(`^(.*)-([0-9]+)-g([0-9a-f]{4,40})$`)
)

// PackageVersion turns `git describe --tags --always [--dirty]` output into
// a semantic version that nfpm maps onto valid, correctly ordered deb and
// rpm versions:
//
//	v1.2.3                 1.2.3
//	v1.2.3-4-gabc1234      1.2.3+4.gabc1234            (after 1.2.3)
//	v1.2.3-rc.1            1.2.3-rc.1                  (deb/rpm 1.2.3~rc.1, before 1.2.3)
//	abc1234-dirty          0.0.0-dev+abc1234.dirty     (no tag yet)
//	0.0.0-dev              0.0.0-dev                   (the Makefile's fallback)
func PackageVersion(describe string) (string, error) {
	d := strings.TrimSpace(describe)
	var meta []string
	if rest, ok := strings.CutSuffix(d, "-dirty"); ok {
		d, meta = rest, []string{"dirty"}
	}
	if shaRE.MatchString(d) {
		return "0.0.0-dev+" + strings.Join(append([]string{d}, meta...), "."), nil
	}
	if m := distanceRE.FindStringSubmatch(d); m != nil {
		d = m[1]
		meta = append([]string{m[2], "g" + m[3]}, meta...)
	}
	core, pre, hasPre := strings.Cut(d, "-")
	if !coreRE.MatchString(core) {
		return "", fmt.Errorf("package version from %q: %q is not MAJOR.MINOR.PATCH", describe, core)
	}
	v := strings.TrimPrefix(core, "v")
	if hasPre {
		if !ident.MatchString(pre) {
			return "", fmt.Errorf("package version from %q: bad pre-release %q", describe, pre)
		}
		v += "-" + pre
	}
	if len(meta) > 0 {
		v += "+" + strings.Join(meta, ".")
	}
	return v, nil
}

// DebVersion is the Version field dpkg shows for a package built from the
// semantic version v (PackageVersion's output), as nfpm writes it.
func DebVersion(v string) string {
	core, meta, _ := strings.Cut(v, "+")
	core, pre, _ := strings.Cut(core, "-")
	out := core
	if pre != "" {
		out += "~" + pre
	}
	if meta != "" {
		out += "+" + meta
	}
	return out
}

// RPMVersion is the VERSION-RELEASE rpm shows for the semantic version v,
// as nfpm writes it (release 1; '-' is not allowed in an rpm version).
func RPMVersion(v string) string {
	core, meta, _ := strings.Cut(v, "+")
	core, pre, _ := strings.Cut(core, "-")
	out := core
	if pre != "" {
		out += "~" + strings.ReplaceAll(pre, "-", "_")
	}
	if meta != "" {
		out += "+" + meta
	}
	return out + "-1"
}
