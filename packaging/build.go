package packaging

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

// Formats are the package formats Build makes by default.
var Formats = []string{"deb", "rpm"}

// BuildOptions says what Build packages.
type BuildOptions struct {
	Config   string    // nfpm YAML (packaging/nfpm.yaml)
	Root     string    // directory the relative paths in Config start from (the repository)
	Describe string    // `git describe` output; see PackageVersion
	Arch     string    // Go architecture: amd64, arm64
	BinDir   string    // directory holding the proxypool binary built for Arch
	OutDir   string    // where the packages go (created)
	Formats  []string  // deb, rpm; empty means Formats
	Optional []string  // content sources (globs as written in Config) that may match nothing
	MTime    time.Time // file times in the packages; zero means nfpm's (SOURCE_DATE_EPOCH or now)
}

// Artifact is one package Build wrote.
type Artifact struct {
	Format  string `json:"format"`  // deb | rpm
	Arch    string `json:"arch"`    // Go architecture
	Path    string `json:"path"`    // the file
	Version string `json:"version"` // as dpkg (Version) or rpm (VERSION-RELEASE) shows it
}

// Manifest lists what one `make package` produced; mkpkg writes it as
// manifest.json next to the packages for the tests to find them. Artifact
// paths in it are file names relative to the manifest's directory.
type Manifest struct {
	Describe  string     `json:"describe"`
	Version   string     `json:"version"` // PackageVersion(Describe)
	Artifacts []Artifact `json:"artifacts"`
}

// Build writes one package per format for o.Arch into o.OutDir.
func Build(o BuildOptions) ([]Artifact, error) {
	version, err := PackageVersion(o.Describe)
	if err != nil {
		return nil, err
	}
	formats := o.Formats
	if len(formats) == 0 {
		formats = Formats
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", o.OutDir, err)
	}
	env := map[string]string{"VERSION": version, "ARCH": o.Arch, "BINDIR": o.BinDir}
	var out []Artifact
	for _, format := range formats {
		a, err := buildOne(o, format, env)
		if err != nil {
			return out, fmt.Errorf("building %s for %s: %w", format, o.Arch, err)
		}
		a.Version = DebVersion(version)
		if format == "rpm" {
			a.Version = RPMVersion(version)
		}
		out = append(out, a)
	}
	return out, nil
}

// LoadConfig parses an nfpm config with env supplying ${NAME}; names it
// lacks expand to "".
func LoadConfig(path string, env map[string]string) (nfpm.Config, error) {
	cfg, err := nfpm.ParseFileWithEnvMapping(path, func(k string) string { return env[k] })
	if err != nil {
		return cfg, fmt.Errorf("parsing %s: %w", path, err)
	}
	return cfg, nil
}

func buildOne(o BuildOptions, format string, env map[string]string) (Artifact, error) {
	// Parsed afresh per format: nfpm's Get shares content pointers between
	// formats and packaging mutates them.
	cfg, err := LoadConfig(o.Config, env)
	if err != nil {
		return Artifact{}, err
	}
	if want, _, _ := strings.Cut(strings.SplitN(env["VERSION"], "+", 2)[0], "-"); cfg.Version != want {
		return Artifact{}, fmt.Errorf("nfpm did not read %q as a semantic version (got %q)", env["VERSION"], cfg.Version)
	}
	if !o.MTime.IsZero() {
		cfg.MTime = o.MTime
	}
	if cfg.Contents, err = resolveContents(cfg.Contents, o.Root, o.Optional); err != nil {
		return Artifact{}, err
	}
	for _, ov := range cfg.Overrides {
		if ov == nil {
			continue
		}
		if ov.Contents, err = resolveContents(ov.Contents, o.Root, o.Optional); err != nil {
			return Artifact{}, err
		}
	}
	s := &cfg.Scripts
	for _, p := range []*string{&s.PreInstall, &s.PostInstall, &s.PreRemove, &s.PostRemove} {
		*p = under(o.Root, *p)
	}

	info, err := cfg.Get(format)
	if err != nil {
		return Artifact{}, err
	}
	info = nfpm.WithDefaults(info)
	pkger, err := nfpm.Get(format)
	if err != nil {
		return Artifact{}, err
	}
	name := pkger.ConventionalFileName(info)
	target := filepath.Join(o.OutDir, name)
	tmp, err := os.CreateTemp(o.OutDir, "."+name+".*")
	if err != nil {
		return Artifact{}, err
	}
	defer os.Remove(tmp.Name())
	info.Target = target
	if err := pkger.Package(info, tmp); err != nil {
		tmp.Close()
		return Artifact{}, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return Artifact{}, err
	}
	if err := tmp.Close(); err != nil {
		return Artifact{}, err
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return Artifact{}, err
	}
	return Artifact{Format: format, Arch: o.Arch, Path: target}, nil
}

// resolveContents makes relative sources relative to root, and drops the
// optional glob sources that match nothing (nfpm would fail on them).
func resolveContents(in files.Contents, root string, optional []string) (files.Contents, error) {
	var out files.Contents
	for _, c := range in {
		if c.Source != "" && slices.Contains(optional, c.Source) {
			m, err := filepath.Glob(under(root, c.Source))
			if err != nil {
				return nil, fmt.Errorf("content %s: %w", c.Source, err)
			}
			if len(m) == 0 {
				continue
			}
		}
		if c.Source != "" {
			c.Source = under(root, c.Source)
		}
		out = append(out, c)
	}
	if len(out) == 0 && len(in) > 0 {
		return nil, errors.New("no contents left")
	}
	return out, nil
}

func under(root, p string) string {
	if p == "" || filepath.IsAbs(p) || root == "" {
		return p
	}
	return filepath.Join(root, p)
}

// WriteManifest writes m as JSON to path.
func WriteManifest(path string, m Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadManifest reads what WriteManifest wrote, with artifact paths joined
// to the manifest's directory.
func ReadManifest(path string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("reading %s: %w", path, err)
	}
	for i := range m.Artifacts {
		m.Artifacts[i].Path = filepath.Join(filepath.Dir(path), m.Artifacts[i].Path)
	}
	return m, nil
}
