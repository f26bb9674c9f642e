package packaging

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goreleaser/nfpm/v2/files"
	"go.yaml.in/yaml/v3"
)

// repoRoot is where nfpm.yaml's relative paths start: tests run in
// packaging/.
const repoRoot = ".."

func TestPackageVersion(t *testing.T) {
	tests := []struct {
		describe, want, deb, rpm string
	}{
		{"v1.2.3", "1.2.3", "1.2.3", "1.2.3-1"},
		{"1.2.3", "1.2.3", "1.2.3", "1.2.3-1"},
		{"v1.2.3-dirty", "1.2.3+dirty", "1.2.3+dirty", "1.2.3+dirty-1"},
		{"v1.2.3-4-gabc1234", "1.2.3+4.gabc1234", "1.2.3+4.gabc1234", "1.2.3+4.gabc1234-1"},
		{"v1.2.3-4-gabc1234-dirty", "1.2.3+4.gabc1234.dirty", "1.2.3+4.gabc1234.dirty", "1.2.3+4.gabc1234.dirty-1"},
		{"v1.2.3-rc.1", "1.2.3-rc.1", "1.2.3~rc.1", "1.2.3~rc.1-1"},
		{"v1.2.3-rc-1-7-gdeadbeef", "1.2.3-rc-1+7.gdeadbeef", "1.2.3~rc-1+7.gdeadbeef", "1.2.3~rc_1+7.gdeadbeef-1"},
		{"551e7f5", "0.0.0-dev+551e7f5", "0.0.0~dev+551e7f5", "0.0.0~dev+551e7f5-1"},
		{"551e7f5-dirty", "0.0.0-dev+551e7f5.dirty", "0.0.0~dev+551e7f5.dirty", "0.0.0~dev+551e7f5.dirty-1"},
		{"0.0.0-dev", "0.0.0-dev", "0.0.0~dev", "0.0.0~dev-1"},
		{" v2.0.0\n", "2.0.0", "2.0.0", "2.0.0-1"},
	}
	for _, tt := range tests {
		t.Run(tt.describe, func(t *testing.T) {
			got, err := PackageVersion(tt.describe)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("PackageVersion = %q, want %q", got, tt.want)
			}
			if d := DebVersion(got); d != tt.deb {
				t.Errorf("DebVersion = %q, want %q", d, tt.deb)
			}
			if r := RPMVersion(got); r != tt.rpm {
				t.Errorf("RPMVersion = %q, want %q", r, tt.rpm)
			}
		})
	}
	for _, bad := range []string{"", "main", "v1.2", "v01.2.3", "v1.2.3-", "v1.2.3-rc..1", "release-2024"} {
		t.Run("bad/"+bad, func(t *testing.T) {
			if v, err := PackageVersion(bad); err == nil {
				t.Errorf("PackageVersion(%q) = %q, want an error", bad, v)
			}
		})
	}
}

// The deb ordering the versions must have: a pre-release before its
// release, a release before commits after it, an untagged build before
// any release. dpkg is the oracle when present.
func TestDebVersionOrder(t *testing.T) {
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("dpkg not installed")
	}
	order := []string{"0.0.0-dev+551e7f5", "0.1.0-rc.1", "0.1.0", "0.1.0+3.gabc", "0.1.0+3.gabc.dirty", "0.2.0"}
	for i := 1; i < len(order); i++ {
		lo, hi := DebVersion(order[i-1]), DebVersion(order[i])
		t.Run(lo+"<"+hi, func(t *testing.T) {
			if err := exec.Command("dpkg", "--compare-versions", lo, "lt", hi).Run(); err != nil {
				t.Errorf("dpkg says %s is not before %s", lo, hi)
			}
		})
	}
}

// goreleaser is the part of .goreleaser.yaml that must agree with
// packaging/nfpm.yaml.
type goreleaser struct {
	Builds []struct {
		ID     string   `yaml:"id"`
		Main   string   `yaml:"main"`
		Binary string   `yaml:"binary"`
		Env    []string `yaml:"env"`
		Goos   []string `yaml:"goos"`
		Goarch []string `yaml:"goarch"`
	} `yaml:"builds"`
	Nfpms []struct {
		ID           string            `yaml:"id"`
		PackageName  string            `yaml:"package_name"`
		IDs          []string          `yaml:"ids"`
		Formats      []string          `yaml:"formats"`
		Bindir       string            `yaml:"bindir"`
		Section      string            `yaml:"section"`
		Priority     string            `yaml:"priority"`
		Maintainer   string            `yaml:"maintainer"`
		Vendor       string            `yaml:"vendor"`
		Homepage     string            `yaml:"homepage"`
		Description  string            `yaml:"description"`
		License      string            `yaml:"license"`
		Dependencies []string          `yaml:"dependencies"`
		Recommends   []string          `yaml:"recommends"`
		Contents     []grContent       `yaml:"contents"`
		Scripts      map[string]string `yaml:"scripts"`
		Overrides    map[string]struct {
			Dependencies []string `yaml:"dependencies"`
			Recommends   []string `yaml:"recommends"`
		} `yaml:"overrides"`
		RPM struct {
			Group   string `yaml:"group"`
			Summary string `yaml:"summary"`
		} `yaml:"rpm"`
	} `yaml:"nfpms"`
}

type grContent struct {
	Src      string `yaml:"src"`
	Dst      string `yaml:"dst"`
	Type     string `yaml:"type"`
	Packager string `yaml:"packager"`
	FileInfo struct {
		Mode  uint32 `yaml:"mode"`
		Owner string `yaml:"owner"`
		Group string `yaml:"group"`
	} `yaml:"file_info"`
}

// entry is one content line in a form both files reduce to.
type entry struct {
	Src, Dst, Type, Packager, Owner, Group string
	Mode                                   uint32
}

func (e entry) String() string {
	return fmt.Sprintf("%s -> %s type=%q packager=%q %s:%s %04o", e.Src, e.Dst, e.Type, e.Packager, e.Owner, e.Group, e.Mode)
}

func fromNfpm(c *files.Content) entry {
	return entry{c.Source, c.Destination, c.Type, c.Packager, c.FileInfo.Owner, c.FileInfo.Group, uint32(c.FileInfo.Mode)}
}

func fromGoreleaser(c grContent) entry {
	return entry{c.Src, c.Dst, c.Type, c.Packager, c.FileInfo.Owner, c.FileInfo.Group, c.FileInfo.Mode}
}

var testEnv = map[string]string{"VERSION": "1.2.3", "ARCH": "amd64", "BINDIR": "bin/linux_amd64"}

func TestGoreleaserAgreesWithNfpm(t *testing.T) {
	cfg, err := LoadConfig("nfpm.yaml", testEnv)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var gr goreleaser
	if err := yaml.Unmarshal(b, &gr); err != nil {
		t.Fatalf("parsing .goreleaser.yaml: %v", err)
	}
	if len(gr.Nfpms) != 1 || len(gr.Builds) != 1 {
		t.Fatalf("want one build and one nfpm in .goreleaser.yaml, got %d and %d", len(gr.Builds), len(gr.Nfpms))
	}
	build, np := gr.Builds[0], gr.Nfpms[0]

	t.Run("binary", func(t *testing.T) {
		var bin *files.Content
		for _, c := range cfg.Contents {
			if c.Destination == "/usr/bin/proxypool" {
				bin = c
			}
		}
		if bin == nil {
			t.Fatal("nfpm.yaml does not install /usr/bin/proxypool")
		}
		if bin.FileInfo.Mode != 0o755 || bin.Source != "bin/linux_amd64/proxypool" {
			t.Errorf("nfpm binary entry: src %q mode %o", bin.Source, bin.FileInfo.Mode)
		}
		if np.Bindir+"/"+build.Binary != bin.Destination {
			t.Errorf("goreleaser installs %s/%s, nfpm %s", np.Bindir, build.Binary, bin.Destination)
		}
		if build.Main != "./cmd/proxypool" || !slices.Contains(build.Env, "CGO_ENABLED=0") {
			t.Errorf("goreleaser build: main %q env %v", build.Main, build.Env)
		}
		if !slices.Equal(build.Goos, []string{"linux"}) || !slices.Equal(build.Goarch, []string{"amd64", "arm64"}) {
			t.Errorf("goreleaser targets %v/%v, want linux/[amd64 arm64]", build.Goos, build.Goarch)
		}
		if !slices.Equal(np.IDs, []string{build.ID}) {
			t.Errorf("nfpm ids %v, want [%s]", np.IDs, build.ID)
		}
	})

	t.Run("contents", func(t *testing.T) {
		var want, got []entry
		for _, c := range cfg.Contents {
			if c.Destination != "/usr/bin/proxypool" { // goreleaser adds the binary itself
				want = append(want, fromNfpm(c))
			}
		}
		for _, c := range np.Contents {
			got = append(got, fromGoreleaser(c))
		}
		for _, e := range want {
			if !slices.Contains(got, e) {
				t.Errorf("in nfpm.yaml, not in .goreleaser.yaml: %v", e)
			}
		}
		for _, e := range got {
			if !slices.Contains(want, e) {
				t.Errorf("in .goreleaser.yaml, not in nfpm.yaml: %v", e)
			}
		}
	})

	t.Run("scripts", func(t *testing.T) {
		want := map[string]string{
			"preinstall": cfg.Scripts.PreInstall, "postinstall": cfg.Scripts.PostInstall,
			"preremove": cfg.Scripts.PreRemove, "postremove": cfg.Scripts.PostRemove,
		}
		for k, v := range want {
			if v == "" || np.Scripts[k] != v {
				t.Errorf("%s: nfpm %q, goreleaser %q", k, v, np.Scripts[k])
			}
		}
		if len(np.Scripts) != len(want) {
			t.Errorf("goreleaser scripts %v, want exactly %v", np.Scripts, want)
		}
	})

	t.Run("dependencies", func(t *testing.T) {
		if !slices.Equal(np.Formats, Formats) {
			t.Errorf("goreleaser formats %v, want %v", np.Formats, Formats)
		}
		for _, format := range Formats {
			info, err := cfg.Get(format)
			if err != nil {
				t.Fatal(err)
			}
			deps, recs := np.Dependencies, np.Recommends
			if o, ok := np.Overrides[format]; ok {
				if o.Dependencies != nil {
					deps = o.Dependencies
				}
				if o.Recommends != nil {
					recs = o.Recommends
				}
			}
			if !slices.Equal(info.Depends, deps) || len(deps) == 0 {
				t.Errorf("%s depends: nfpm %v, goreleaser %v", format, info.Depends, deps)
			}
			if !slices.Equal(info.Recommends, recs) {
				t.Errorf("%s recommends: nfpm %v, goreleaser %v", format, info.Recommends, recs)
			}
		}
	})

	t.Run("metadata", func(t *testing.T) {
		pairs := [][3]string{
			{"name", cfg.Name, np.PackageName},
			{"section", cfg.Section, np.Section},
			{"priority", cfg.Priority, np.Priority},
			{"maintainer", cfg.Maintainer, np.Maintainer},
			{"vendor", cfg.Vendor, np.Vendor},
			{"homepage", cfg.Homepage, np.Homepage},
			{"description", cfg.Description, np.Description},
			{"license", cfg.License, np.License},
			{"rpm.group", cfg.RPM.Group, np.RPM.Group},
			{"rpm.summary", cfg.RPM.Summary, np.RPM.Summary},
		}
		for _, p := range pairs {
			if p[1] != p[2] {
				t.Errorf("%s: nfpm %q, goreleaser %q", p[0], p[1], p[2])
			}
		}
	})
}

// Every shipped unit is packaged, every source exists, and /etc is config.
func TestContentsComplete(t *testing.T) {
	cfg, err := LoadConfig("nfpm.yaml", testEnv)
	if err != nil {
		t.Fatal(err)
	}
	dsts := map[string]*files.Content{}
	for _, c := range cfg.Contents {
		dsts[c.Destination] = c
		switch {
		case c.Source == "", strings.HasPrefix(c.Source, "bin/"), c.Source == "plugins/*.wasm":
		default:
			m, err := filepath.Glob(filepath.Join(repoRoot, c.Source))
			if err != nil || len(m) == 0 {
				t.Errorf("content source %s matches nothing", c.Source)
			}
		}
		if strings.HasPrefix(c.Destination, "/etc/") && c.Type != files.TypeConfigNoReplace && c.Type != files.TypeDir {
			t.Errorf("%s: type %q, want config|noreplace", c.Destination, c.Type)
		}
	}
	units, _ := filepath.Glob("systemd/*.service")
	sockets, _ := filepath.Glob("systemd/*.socket")
	for _, u := range append(units, sockets...) {
		if _, ok := dsts["/usr/lib/systemd/system/"+filepath.Base(u)]; !ok {
			t.Errorf("%s is not packaged", u)
		}
	}
	for _, d := range []string{"/etc/proxypool/proxypool.yaml", "/etc/proxypool/plugins", "/etc/proxypool/plugins/README.md",
		"/usr/lib/sysusers.d/proxypool.conf", "/usr/lib/tmpfiles.d/proxypool.conf", "/usr/share/proxypool/plugins/"} {
		if _, ok := dsts[d]; !ok {
			t.Errorf("%s is not packaged", d)
		}
	}
	if c := dsts["/etc/proxypool/proxypool.yaml"]; c != nil && (c.FileInfo.Mode != 0o640 || c.FileInfo.Group != "proxypool") {
		t.Errorf("proxypool.yaml: mode %o group %q, want 0640 proxypool", c.FileInfo.Mode, c.FileInfo.Group)
	}
}

// The preinstall script creates the account from a copy of the sysusers.d
// line (the file is not on disk yet when it runs).
func TestSysusersLineMatchesPreinstall(t *testing.T) {
	conf := activeLines(t, "sysusers.d/proxypool.conf")
	if len(conf) != 1 {
		t.Fatalf("sysusers.d/proxypool.conf: want one entry, got %q", conf)
	}
	script, err := os.ReadFile("scripts/preinstall.sh")
	if err != nil {
		t.Fatal(err)
	}
	if want := "SYSUSERS_LINE='" + conf[0] + "'"; !strings.Contains(string(script), want) {
		t.Errorf("preinstall.sh lacks %s", want)
	}
	if tmp := activeLines(t, "tmpfiles.d/proxypool.conf"); !slices.Equal(tmp, []string{"d /var/lib/proxypool 0750 proxypool proxypool -"}) {
		t.Errorf("tmpfiles.d/proxypool.conf: %q", tmp)
	}
}

func activeLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// unit is a parsed systemd unit file: section -> key -> values in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || section == "" {
				t.Fatalf("%s: bad line %q", path, l)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// The contract the binary relies on (notify, reload by SIGHUP, named
// sockets) and the hardening operators are promised in docs/operations.md.
func TestUnitDirectives(t *testing.T) {
	svc := parseUnit(t, "systemd/proxypool.service")["Service"]
	want := map[string]string{
		"Type":                    "notify",
		"NotifyAccess":            "main",
		"ExecStart":               "/usr/bin/proxypool run --config /etc/proxypool/proxypool.yaml",
		"Restart":                 "on-failure",
		"WatchdogSec":             "30s",
		"User":                    "proxypool",
		"StateDirectory":          "proxypool",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ReadWritePaths":          "/var/lib/proxypool",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"CapabilityBoundingSet":   "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"SystemCallFilter":        "@system-service",
		"LockPersonality":         "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectKernelModules":    "yes",
		"ProtectKernelLogs":       "yes",
		"ProtectControlGroups":    "yes",
		"RestrictNamespaces":      "yes",
		"RestrictRealtime":        "yes",
		"RestrictSUIDSGID":        "yes",
		"LimitNOFILE":             "1048576",
	}
	for k, v := range want {
		t.Run(k, func(t *testing.T) {
			if got := svc[k]; !slices.Equal(got, []string{v}) {
				t.Errorf("%s = %q, want %q", k, got, v)
			}
		})
	}
	t.Run("ExecReload", func(t *testing.T) {
		got := svc["ExecReload"]
		if len(got) == 0 || got[len(got)-1] != "/bin/kill -HUP $MAINPID" {
			t.Errorf("ExecReload = %q, want it to end with SIGHUP to $MAINPID", got)
		}
	})
	t.Run("MemoryDenyWriteExecute", func(t *testing.T) {
		// wazero's compiler needs executable mappings: see docs/operations.md.
		if v, ok := svc["MemoryDenyWriteExecute"]; ok {
			t.Errorf("MemoryDenyWriteExecute=%v breaks WASM plugins", v)
		}
	})
	for _, name := range []string{"gateway", "distribution", "admin"} {
		t.Run("socket/"+name, func(t *testing.T) {
			s := parseUnit(t, "systemd/proxypool-"+name+".socket")["Socket"]
			if !slices.Equal(s["FileDescriptorName"], []string{name}) || !slices.Equal(s["Service"], []string{"proxypool.service"}) {
				t.Errorf("FileDescriptorName=%q Service=%q", s["FileDescriptorName"], s["Service"])
			}
			if len(s["ListenStream"]) != 1 {
				t.Errorf("ListenStream=%q", s["ListenStream"])
			}
		})
	}
}

// scriptStub stands in for every command the maintainer scripts run. It
// uses shell builtins only, since PATH holds nothing but the stubs.
const scriptStub = `#!/bin/sh
name=${0##*/}
line=$name
for a in "$@"; do line="$line $a"; done
printf '%s\n' "$line" >> "$STUB_LOG"
case "$name" in
systemd-sysusers)
	for a in "$@"; do
		if [ "$a" = - ]; then
			while IFS= read -r l; do printf 'stdin: %s\n' "$l" >> "$STUB_LOG"; done
		fi
	done ;;
getent)
	[ -z "$STUB_NO_USER" ] || exit 2 ;;
esac
exit 0
`

var stubbed = []string{"systemd-sysusers", "systemd-tmpfiles", "getent", "groupadd", "useradd", "userdel", "groupdel", "install", "systemctl", "rm"}

// TestMaintainerScripts runs each script with the arguments dpkg and rpm
// pass, against stub commands, and checks what it would do. The deb
// arguments are also exercised for real by TestDebInstall; this is the only
// test of the rpm ones (numbers) on a Debian machine.
func TestMaintainerScripts(t *testing.T) {
	stubs := t.TempDir()
	for _, n := range stubbed {
		if err := os.WriteFile(filepath.Join(stubs, n), []byte(scriptStub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const units = "proxypool.service proxypool-gateway.socket proxypool-distribution.socket proxypool-admin.socket"
	sysusers := activeLines(t, "sysusers.d/proxypool.conf")[0]
	tests := []struct {
		script string
		args   []string
		noUser bool
		want   []string // lines that must be logged
		never  []string // prefixes that must not be
	}{
		{"preinstall", []string{"install"}, false, []string{"systemd-sysusers --replace=/usr/lib/sysusers.d/proxypool.conf -", "stdin: " + sysusers}, []string{"useradd"}},
		{"preinstall", []string{"1"}, true, []string{"stdin: " + sysusers, "groupadd --system proxypool", "useradd --system --gid proxypool --home-dir /var/lib/proxypool --no-create-home --shell /usr/sbin/nologin --comment Proxy Pool proxypool"}, nil},
		{"preinstall", []string{"upgrade", "0.9.0"}, false, []string{"getent passwd proxypool"}, nil},
		{"preinstall", []string{"2"}, false, []string{"getent passwd proxypool"}, nil},
		{"preinstall", []string{"abort-upgrade", "1.0.0"}, false, nil, []string{"systemd-sysusers", "getent", "useradd"}},
		{"postinstall", []string{"configure", ""}, false, []string{"systemd-sysusers /usr/lib/sysusers.d/proxypool.conf", "systemd-tmpfiles --create /usr/lib/tmpfiles.d/proxypool.conf"}, []string{"systemctl enable", "systemctl start", "systemctl try-restart"}},
		{"postinstall", []string{"1"}, false, []string{"systemd-tmpfiles --create /usr/lib/tmpfiles.d/proxypool.conf"}, []string{"systemctl enable", "systemctl start", "systemctl try-restart"}},
		{"postinstall", []string{"2"}, false, []string{"systemd-tmpfiles --create /usr/lib/tmpfiles.d/proxypool.conf"}, []string{"systemctl enable", "systemctl start", "systemctl try-restart"}},
		{"postinstall", []string{"abort-upgrade", "1.0.0"}, false, nil, []string{"systemd-sysusers", "systemd-tmpfiles", "systemctl"}},
		{"preremove", []string{"remove"}, false, []string{"systemctl --no-reload disable " + units}, nil},
		{"preremove", []string{"0"}, false, []string{"systemctl --no-reload disable " + units}, nil},
		{"preremove", []string{"upgrade", "1.1.0"}, false, nil, []string{"systemctl"}},
		{"preremove", []string{"1"}, false, nil, []string{"systemctl"}},
		{"preremove", []string{"deconfigure", "in-favour", "x", "1.0"}, false, nil, []string{"systemctl"}},
		{"postremove", []string{"remove"}, false, nil, []string{"rm", "userdel", "groupdel"}},
		{"postremove", []string{"0"}, false, nil, []string{"rm", "userdel", "groupdel"}},
		{"postremove", []string{"1"}, false, nil, []string{"rm", "userdel", "groupdel"}},
		{"postremove", []string{"upgrade", "1.1.0"}, false, nil, []string{"rm", "userdel", "groupdel", "systemctl"}},
		{"postremove", []string{"purge"}, false, []string{"rm -rf /var/lib/proxypool /etc/proxypool", "userdel proxypool", "groupdel proxypool"}, nil},
		{"postremove", []string{"purge"}, true, []string{"rm -rf /var/lib/proxypool /etc/proxypool"}, []string{"userdel", "groupdel"}},
	}
	for _, tt := range tests {
		t.Run(tt.script+"/"+strings.Join(tt.args, "_"), func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "log")
			cmd := exec.Command("/bin/sh", append([]string{filepath.Join("scripts", tt.script+".sh")}, tt.args...)...)
			cmd.Env = []string{"PATH=" + stubs, "STUB_LOG=" + log}
			if tt.noUser {
				cmd.Env = append(cmd.Env, "STUB_NO_USER=1")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			b, err := os.ReadFile(log)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			for _, w := range tt.want {
				if !slices.Contains(lines, w) {
					t.Errorf("missing %q in:\n%s", w, b)
				}
			}
			for _, n := range tt.never {
				for _, l := range lines {
					if l == n || strings.HasPrefix(l, n+" ") {
						t.Errorf("ran %q", l)
					}
				}
			}
		})
	}
}
