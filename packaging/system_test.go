package packaging

// System tests, run by `make package-test` (PROXYPOOL_PACKAGE_TEST=1): they
// inspect the packages `make package` built, run the binary under socket
// activation and a notify socket this test owns, and install the .deb on
// this machine (root, Debian, no systemd as PID 1). Plain `go test ./...`
// skips them.

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	gateEnv     = "PROXYPOOL_PACKAGE_TEST"
	stepTimeout = 30 * time.Second // any single wait: startup, a reload, a request
)

func requireSystem(t *testing.T) {
	t.Helper()
	if os.Getenv(gateEnv) != "1" {
		t.Skipf("system test: set %s=1 (make package-test)", gateEnv)
	}
}

func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (make package-test installs it)", tool)
		}
	}
}

// manifest is what `make package` built: PROXYPOOL_DIST or ../dist.
func manifest(t *testing.T) Manifest {
	t.Helper()
	dir := os.Getenv("PROXYPOOL_DIST")
	if dir == "" {
		dir = filepath.Join(repoRoot, "dist")
	}
	m, err := ReadManifest(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatalf("run make package first: %v", err)
	}
	if len(m.Artifacts) == 0 {
		t.Fatal("manifest lists no package")
	}
	return m
}

// binary is the proxypool built for arch by `make package`.
func binary(t *testing.T, arch string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join(repoRoot, "bin", "linux_"+arch, "proxypool"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("run make package first: %v", err)
	}
	return p
}

func artifacts(t *testing.T, format string) []Artifact {
	var out []Artifact
	for _, a := range manifest(t).Artifacts {
		if a.Format == format {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s in the manifest", format)
	}
	return out
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// wantFile is one payload file both packages must carry.
type wantFile struct {
	path, perm, owner, group string
	config                   bool
}

// payload lists the package contents, from the repository as it is now
// (plugins/*.wasm only if `make plugins` built some).
func payload(t *testing.T) []wantFile {
	w := []wantFile{
		{"/usr/bin/proxypool", "-rwxr-xr-x", "root", "root", false},
		{"/usr/lib/systemd/system/proxypool.service", "-rw-r--r--", "root", "root", false},
		{"/usr/lib/systemd/system/proxypool-gateway.socket", "-rw-r--r--", "root", "root", false},
		{"/usr/lib/systemd/system/proxypool-distribution.socket", "-rw-r--r--", "root", "root", false},
		{"/usr/lib/systemd/system/proxypool-admin.socket", "-rw-r--r--", "root", "root", false},
		{"/usr/lib/sysusers.d/proxypool.conf", "-rw-r--r--", "root", "root", false},
		{"/usr/lib/tmpfiles.d/proxypool.conf", "-rw-r--r--", "root", "root", false},
		{"/etc/proxypool", "drwxr-xr-x", "root", "root", false},
		{"/etc/proxypool/proxypool.yaml", "-rw-r-----", "root", "proxypool", true},
		{"/etc/proxypool/plugins", "drwxr-xr-x", "root", "root", false},
		{"/etc/proxypool/plugins/README.md", "-rw-r--r--", "root", "root", true},
		{"/usr/share/proxypool/plugins/README.md", "-rw-r--r--", "root", "root", false},
		{"/usr/share/doc/proxypool/operations.md", "-rw-r--r--", "root", "root", false},
		{"/usr/share/doc/proxypool/examples/proxypool.yaml", "-rw-r--r--", "root", "root", false},
	}
	for _, pat := range []string{"*.yaml", "*.wasm"} {
		m, _ := filepath.Glob(filepath.Join(repoRoot, "plugins", pat))
		for _, p := range m {
			w = append(w, wantFile{"/usr/share/proxypool/plugins/" + filepath.Base(p), "-rw-r--r--", "root", "root", false})
		}
	}
	return w
}

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func checkELF(t *testing.T, path, arch string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != elfMachine[arch] {
		t.Errorf("%s: ELF machine %v, want %v", path, f.Machine, elfMachine[arch])
	}
}

func fileSum(t *testing.T, path string, h func([]byte) string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return h(b)
}

func md5hex(b []byte) string    { s := md5.Sum(b); return hex.EncodeToString(s[:]) }
func sha256hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestDebPackages(t *testing.T) {
	requireSystem(t)
	requireTools(t, "dpkg-deb")
	for _, a := range artifacts(t, "deb") {
		t.Run(a.Arch, func(t *testing.T) {
			checkELF(t, binary(t, a.Arch), a.Arch)
			fields := map[string]string{
				"Package": "proxypool", "Version": a.Version, "Architecture": a.Arch,
				"Depends": "ca-certificates, passwd", "Recommends": "systemd", "Section": "net",
			}
			for k, want := range fields {
				if got := strings.TrimSpace(run(t, "dpkg-deb", "-f", a.Path, k)); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			info := run(t, "dpkg-deb", "-I", a.Path)
			for _, member := range []string{"conffiles", "control", "md5sums", "preinst", "postinst", "prerm", "postrm"} {
				if !strings.Contains(info, " "+member+" ") {
					t.Errorf("control member %s missing:\n%s", member, info)
				}
			}

			ctrl := t.TempDir()
			run(t, "dpkg-deb", "-e", a.Path, ctrl)
			var wantConf []string
			for _, w := range payload(t) {
				if w.config {
					wantConf = append(wantConf, w.path)
				}
			}
			gotConf := strings.Fields(readFile(t, filepath.Join(ctrl, "conffiles")))
			slices.Sort(gotConf)
			slices.Sort(wantConf)
			if !slices.Equal(gotConf, wantConf) {
				t.Errorf("conffiles %v, want %v", gotConf, wantConf)
			}
			for deb, src := range map[string]string{"preinst": "preinstall", "postinst": "postinstall", "prerm": "preremove", "postrm": "postremove"} {
				if readFile(t, filepath.Join(ctrl, deb)) != readFile(t, filepath.Join("scripts", src+".sh")) {
					t.Errorf("%s differs from scripts/%s.sh", deb, src)
				}
				if st, err := os.Stat(filepath.Join(ctrl, deb)); err != nil || st.Mode().Perm()&0o111 == 0 {
					t.Errorf("%s is not executable", deb)
				}
			}
			if sums := readFile(t, filepath.Join(ctrl, "md5sums")); !strings.Contains(sums, fileSum(t, binary(t, a.Arch), md5hex)+"  usr/bin/proxypool") {
				t.Errorf("the packaged /usr/bin/proxypool is not bin/linux_%s/proxypool", a.Arch)
			}

			listing := map[string][2]string{} // path -> perm, owner/group
			for _, l := range strings.Split(strings.TrimSpace(run(t, "dpkg-deb", "-c", a.Path)), "\n") {
				f := strings.Fields(l)
				if len(f) < 6 {
					t.Fatalf("dpkg-deb -c line %q", l)
				}
				p := strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")
				listing[p] = [2]string{f[0], f[1]}
				if strings.HasPrefix(p, "/var/") {
					t.Errorf("%s is in the payload: state is made by tmpfiles.d, not owned by dpkg", p)
				}
			}
			for _, w := range payload(t) {
				if got, ok := listing[w.path]; !ok {
					t.Errorf("%s missing", w.path)
				} else if got != [2]string{w.perm, w.owner + "/" + w.group} {
					t.Errorf("%s: %v, want %s %s/%s", w.path, got, w.perm, w.owner, w.group)
				}
			}
		})
	}
}

func TestRPMPackages(t *testing.T) {
	requireSystem(t)
	requireTools(t, "rpm")
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}
	for _, a := range artifacts(t, "rpm") {
		t.Run(a.Arch, func(t *testing.T) {
			got := strings.TrimSpace(run(t, "rpm", "-qp", "--qf", "%{NAME}|%{VERSION}-%{RELEASE}|%{ARCH}|%{GROUP}", a.Path))
			if want := "proxypool|" + a.Version + "|" + rpmArch[a.Arch] + "|System Environment/Daemons"; got != want {
				t.Errorf("rpm header %q, want %q", got, want)
			}
			if info := run(t, "rpm", "-qpi", a.Path); !strings.Contains(info, "Vendor      : Proxy Pool") {
				t.Errorf("rpm -qpi:\n%s", info)
			}
			if req := run(t, "rpm", "-qpR", a.Path); !strings.Contains(req, "ca-certificates") || !strings.Contains(req, "shadow-utils") {
				t.Errorf("requires:\n%s", req)
			}
			if rec := strings.TrimSpace(run(t, "rpm", "-qp", "--recommends", a.Path)); rec != "systemd" {
				t.Errorf("recommends %q, want systemd", rec)
			}

			scripts := run(t, "rpm", "-qp", "--scripts", a.Path)
			for header, src := range map[string]string{"preinstall": "preinstall", "postinstall": "postinstall", "preuninstall": "preremove", "postuninstall": "postremove"} {
				body := strings.TrimSpace(readFile(t, filepath.Join("scripts", src+".sh")))
				if !strings.Contains(scripts, header+" scriptlet (using /bin/sh):\n"+body) {
					t.Errorf("%s scriptlet is not scripts/%s.sh", header, src)
				}
			}

			type rpmFile struct{ perm, owner, group, flags, digest string }
			files := map[string]rpmFile{}
			out := run(t, "rpm", "-qp", "--qf", "[%{FILEMODES:perms} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILEFLAGS:fflags}. %{FILEDIGESTS}. %{FILENAMES}\n]", a.Path)
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(l)
				if len(f) != 6 {
					t.Fatalf("rpm file line %q", l)
				}
				files[f[5]] = rpmFile{f[0], f[1], f[2], strings.TrimSuffix(f[3], "."), strings.TrimSuffix(f[4], ".")}
			}
			for _, w := range payload(t) {
				got, ok := files[w.path]
				if !ok {
					t.Errorf("%s missing", w.path)
					continue
				}
				if got.perm != w.perm || got.owner != w.owner || got.group != w.group {
					t.Errorf("%s: %s %s/%s, want %s %s/%s", w.path, got.perm, got.owner, got.group, w.perm, w.owner, w.group)
				}
				if isConf := strings.Contains(got.flags, "c"); isConf != w.config || (w.config && !strings.Contains(got.flags, "n")) {
					t.Errorf("%s: flags %q, config(noreplace) %v", w.path, got.flags, w.config)
				}
			}
			if got := files["/usr/bin/proxypool"].digest; got != fileSum(t, binary(t, a.Arch), sha256hex) {
				t.Errorf("the packaged /usr/bin/proxypool is not bin/linux_%s/proxypool", a.Arch)
			}
			if list := run(t, "rpm", "-qpl", a.Path); strings.Contains(list, "/var/") {
				t.Errorf("state is in the payload:\n%s", list)
			}
		})
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestUnitsVerify runs systemd-analyze verify on the shipped units and the
// per-process templates, with their binaries pointed at the built one
// (verify insists that ExecStart exists). TestDebInstall verifies the
// installed units as they are.
func TestUnitsVerify(t *testing.T) {
	requireSystem(t)
	requireTools(t, "systemd-analyze")
	bin := binary(t, runtime.GOARCH)
	dir := t.TempDir()
	srcs, _ := filepath.Glob("systemd/*.service")
	sockets, _ := filepath.Glob("systemd/*.socket")
	templates, _ := filepath.Glob("systemd/templates/*.in")
	var names []string
	for _, src := range slices.Concat(srcs, sockets, templates) {
		text := readFile(t, src)
		for _, b := range []string{"/usr/bin/proxypool ", "/usr/bin/proxy-controller ", "/usr/bin/proxy-gateway ", "/usr/bin/proxy-checker "} {
			text = strings.ReplaceAll(text, b, bin+" ")
		}
		name := strings.TrimSuffix(filepath.Base(src), ".in")
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Join(dir, name))
	}
	if len(templates) < 5 {
		t.Errorf("templates: %v", templates)
	}
	verify(t, names...)
}

func verify(t *testing.T, units ...string) {
	t.Helper()
	out, err := exec.Command("systemd-analyze", append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a child process the test stops before it ends.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

func startProc(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	return startProcAs(t, nil, env, name, args...)
}

// startProcAs starts name with credentials cred (nil: the test's own).
func startProcAs(t *testing.T, cred *syscall.Credential, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(name, args...), out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	if cred != nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

func (p *proc) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// exit waits for the process and returns its exit code.
func (p *proc) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(stepTimeout):
		t.Fatalf("process did not exit; output:\n%s", p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// notifySocket is a NOTIFY_SOCKET this test owns, as systemd would.
type notifySocket struct {
	path      string
	msgs      chan string
	watchdogs int
}

func listenNotify(t *testing.T, worldWritable bool) *notifySocket {
	t.Helper()
	// Short path: sun_path holds 108 bytes.
	dir, err := os.MkdirTemp("", "ppn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &notifySocket{path: filepath.Join(dir, "notify"), msgs: make(chan string, 4096)}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if worldWritable {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(n.path, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		defer close(n.msgs)
		buf := make([]byte, 4096)
		for {
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			n.msgs <- string(buf[:k])
		}
	}()
	return n
}

// next returns the next message other than WATCHDOG=1 (which it counts)
// and STATUS= (free text for systemctl status).
func (n *notifySocket) next(t *testing.T) string {
	t.Helper()
	deadline := time.After(stepTimeout)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatal("notify socket closed")
			}
			if m == "WATCHDOG=1" {
				n.watchdogs++
				continue
			}
			if strings.HasPrefix(m, "STATUS=") && !strings.Contains(m, "\n") {
				continue
			}
			return m
		case <-deadline:
			t.Fatal("no sd_notify message in time")
		}
	}
}

func (n *notifySocket) expect(t *testing.T, want string) {
	t.Helper()
	if got := n.next(t); got != want {
		t.Fatalf("sd_notify %q, want %q", got, want)
	}
}

func (n *notifySocket) awaitWatchdog(t *testing.T) {
	t.Helper()
	deadline := time.After(stepTimeout)
	for n.watchdogs == 0 {
		select {
		case m := <-n.msgs:
			if m == "WATCHDOG=1" {
				n.watchdogs++
			} else if !strings.HasPrefix(m, "STATUS=") {
				t.Fatalf("unexpected sd_notify %q while waiting for WATCHDOG=1", m)
			}
		case <-deadline:
			t.Fatal("no WATCHDOG=1")
		}
	}
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var lns []net.Listener
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// writeConfig writes a config without upstreams: the appliance is ready at
// once, the gateway answers 503 no-route. extra is appended verbatim.
func writeConfig(t *testing.T, path, state string, ports []int, extra string) {
	t.Helper()
	c := fmt.Sprintf(`listeners:
  gateway: %s
  distribution: %s
  admin: %s
  metrics: %s
stateDir: %s
pluginsDir: %s
shutdownTimeout: 5s
`, addr(ports[0]), addr(ports[1]), addr(ports[2]), addr(ports[3]), state, filepath.Join(filepath.Dir(path), "plugins"))
	if err := os.WriteFile(path, []byte(c+extra), 0o644); err != nil {
		t.Fatal(err)
	}
}

var direct = &http.Client{Timeout: stepTimeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp, string(b)
}

// waitListening polls until something accepts TCP connections on a.
func waitListening(t *testing.T, a string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", a)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("nothing listens on %s: %v", a, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// surfaces checks each listener through the given addresses: admin,
// metrics, distribution answer, and the gateway refuses with 503 no-route
// (no upstream). 192.0.2.1 is never dialled: there is no route to try.
func surfaces(t *testing.T, gateway, distribution, admin, metrics string) {
	t.Helper()
	if resp, body := get(t, direct, "http://"+admin+"/healthz"); resp.StatusCode != http.StatusOK {
		t.Errorf("admin /healthz: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(t, direct, "http://"+metrics+"/metrics"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "proxypool_") {
		t.Errorf("metrics: %d", resp.StatusCode)
	}
	resp, err := direct.Post("http://"+distribution+"/v1/extract", "application/json", strings.NewReader(`{"count":1}`))
	if err != nil {
		t.Fatalf("distribution: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("distribution /v1/extract: %d", resp.StatusCode)
	}
	viaGateway := &http.Client{Timeout: stepTimeout, Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: gateway}), DisableKeepAlives: true,
	}}
	if resp, body := get(t, viaGateway, "http://192.0.2.1/"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Proxypool-Reason") != "no-route" {
		t.Errorf("gateway: %d %q %s", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"), body)
	}
}

func refused(t *testing.T, a string) {
	t.Helper()
	if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
		c.Close()
		t.Errorf("%s (from the config) accepts connections: the activated sockets were not used instead", a)
	}
}

// socketActivate starts bin under systemd-socket-activate with one named
// listener per name, as the .socket units would pass them; as the account
// runAs when set (systemd-socket-activate execs bin: the pid stays the
// same, so signals and LISTEN_PID reach proxypool).
func socketActivate(t *testing.T, runAs string, notify *notifySocket, names []string, ports []int, bin string, args ...string) *proc {
	t.Helper()
	var argv []string
	for _, p := range ports {
		argv = append(argv, "-l", addr(p))
	}
	argv = append(argv, "--fdname="+strings.Join(names, ":"), "-E", "NOTIFY_SOCKET="+notify.path, "-E", "WATCHDOG_USEC=1000000", bin)
	argv = append(argv, args...)
	var cred *syscall.Credential
	if runAs != "" {
		u, err := user.Lookup(runAs)
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	p := startProcAs(t, cred, []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, "systemd-socket-activate", argv...)
	for _, port := range ports {
		waitListening(t, addr(port))
	}
	return p
}

func TestSocketActivation(t *testing.T) {
	requireSystem(t)
	requireTools(t, "systemd-socket-activate")
	bin := binary(t, runtime.GOARCH)
	dir := t.TempDir()
	ports := freePorts(t, 8)
	activated, configured := ports[:4], ports[4:]
	cfg := filepath.Join(dir, "proxypool.yaml")
	writeConfig(t, cfg, filepath.Join(dir, "state"), configured, "")

	notify := listenNotify(t, false)
	names := []string{"gateway", "distribution", "admin", "metrics"}
	p := socketActivate(t, "", notify, names, activated, bin, "run", "--config", cfg)
	notify.expect(t, "READY=1")

	surfaces(t, addr(activated[0]), addr(activated[1]), addr(activated[2]), addr(activated[3]))
	for _, port := range configured {
		refused(t, addr(port))
	}
	notify.awaitWatchdog(t)

	p.signal(t, syscall.SIGTERM)
	notify.expect(t, "STOPPING=1")
	if code := p.exit(t); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}

type status struct {
	ConfigLoadedAt time.Time `json:"configLoadedAt"`
	Ready          bool      `json:"ready"`
}

func adminStatus(t *testing.T, admin string) status {
	t.Helper()
	resp, body := get(t, direct, "http://"+admin+"/v1/admin/status")
	var s status
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &s) != nil {
		t.Fatalf("admin status: %d %s", resp.StatusCode, body)
	}
	return s
}

func monotonicUsec(t *testing.T) int64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano() / 1000
}

// expectReloading checks RELOADING=1 with a MONOTONIC_USEC taken after
// notBefore and not after now.
func (n *notifySocket) expectReloading(t *testing.T, notBefore int64) {
	t.Helper()
	m := n.next(t)
	lines := strings.Split(m, "\n")
	if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
		t.Fatalf("sd_notify %q, want RELOADING=1 and MONOTONIC_USEC", m)
	}
	us, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
	if err != nil || us < notBefore || us > monotonicUsec(t) {
		t.Errorf("MONOTONIC_USEC %q outside [%d, now]", lines[1], notBefore)
	}
}

func TestNotifyReload(t *testing.T) {
	requireSystem(t)
	bin := binary(t, runtime.GOARCH)
	dir := t.TempDir()
	ports := freePorts(t, 4)
	cfg, state := filepath.Join(dir, "proxypool.yaml"), filepath.Join(dir, "state")
	writeConfig(t, cfg, state, ports, "")
	notify := listenNotify(t, false)
	p := startProc(t, []string{"NOTIFY_SOCKET=" + notify.path, "WATCHDOG_USEC=1000000"}, bin, "run", "--config", cfg)
	notify.expect(t, "READY=1")
	admin := addr(ports[2])
	before := adminStatus(t, admin)
	if !before.Ready {
		t.Error("status not ready after READY=1")
	}

	t.Run("valid", func(t *testing.T) {
		writeConfig(t, cfg, state, ports, "extraction:\n  maxCount: 50\n")
		sent := monotonicUsec(t)
		p.signal(t, syscall.SIGHUP)
		notify.expectReloading(t, sent)
		notify.expect(t, "READY=1")
		after := adminStatus(t, admin)
		if !after.ConfigLoadedAt.After(before.ConfigLoadedAt) {
			t.Errorf("configLoadedAt %v not after %v: the new config was not loaded", after.ConfigLoadedAt, before.ConfigLoadedAt)
		}
		before = after
	})

	t.Run("invalid", func(t *testing.T) {
		writeConfig(t, cfg, state, ports, "log:\n  level: shouting\nextraction:\n  maxCount: -1\n")
		sent := monotonicUsec(t)
		p.signal(t, syscall.SIGHUP)
		notify.expectReloading(t, sent)
		notify.expect(t, "READY=1")
		after := adminStatus(t, admin)
		if !after.ConfigLoadedAt.Equal(before.ConfigLoadedAt) {
			t.Errorf("configLoadedAt moved to %v: a broken config replaced the running one", after.ConfigLoadedAt)
		}
		surfaces(t, addr(ports[0]), addr(ports[1]), admin, addr(ports[3]))
		logs := p.out.String()
		for _, want := range []string{"reload failed", "log.level", "extraction.maxCount"} {
			if !strings.Contains(logs, want) {
				t.Errorf("log lacks %q (every error must be reported)", want)
			}
		}
	})

	notify.awaitWatchdog(t)
	p.signal(t, syscall.SIGTERM)
	notify.expect(t, "STOPPING=1")
	if code := p.exit(t); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}

// hostDeb is the .deb for this machine's architecture.
func hostDeb(t *testing.T) Artifact {
	t.Helper()
	for _, a := range artifacts(t, "deb") {
		if a.Arch == runtime.GOARCH {
			return a
		}
	}
	t.Fatalf("no deb for %s", runtime.GOARCH)
	return Artifact{}
}

type pathState struct {
	perm         os.FileMode
	dir          bool
	owner, group string
}

func statOwner(t *testing.T, path string) (pathState, bool) {
	t.Helper()
	st, err := os.Stat(path)
	if os.IsNotExist(err) {
		return pathState{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return pathState{st.Mode().Perm(), st.IsDir(), lookupName(t, "passwd", sys.Uid), lookupName(t, "group", sys.Gid)}, true
}

func lookupName(t *testing.T, db string, id uint32) string {
	t.Helper()
	out, err := exec.Command("getent", db, strconv.FormatUint(uint64(id), 10)).Output()
	if err != nil {
		return strconv.FormatUint(uint64(id), 10)
	}
	return strings.SplitN(string(out), ":", 2)[0]
}

func getent(db, key string) (string, bool) {
	out, err := exec.Command("getent", db, key).Output()
	return strings.TrimSpace(string(out)), err == nil
}

func dpkgStatus(pkg string) string {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Abbrev}|${Version}", pkg).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func dpkg(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("dpkg", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestDebInstall installs the .deb on this machine, checks what it put
// where, runs the installed service as the proxypool user, upgrades it,
// removes it (config and state stay) and purges it (all gone), and leaves
// the machine as it found it.
func TestDebInstall(t *testing.T) {
	requireSystem(t)
	requireTools(t, "dpkg", "dpkg-query", "getent", "runuser", "systemctl", "systemd-analyze", "systemd-socket-activate")
	if os.Geteuid() != 0 {
		t.Fatal("installing a package needs root")
	}
	deb := hostDeb(t)
	if s := dpkgStatus("proxypool"); s != "" {
		t.Fatalf("dpkg already knows proxypool (%s): refusing to touch it; `dpkg --purge proxypool` if it is a leftover", s)
	}
	if _, ok := getent("passwd", "proxypool"); ok {
		t.Fatal("a proxypool user exists without the package: refusing to touch it")
	}
	for _, p := range []string{"/etc/proxypool", "/var/lib/proxypool"} {
		if _, err := os.Lstat(p); err == nil {
			t.Fatalf("%s exists without the package: refusing to touch it", p)
		}
	}
	enabledLinks := []string{
		"/etc/systemd/system/multi-user.target.wants/proxypool.service",
		"/etc/systemd/system/sockets.target.wants/proxypool-gateway.socket",
	}
	t.Cleanup(func() {
		// Whatever happened, leave the machine as it was.
		exec.Command("systemctl", "--no-reload", "disable", "proxypool.service", "proxypool-gateway.socket").Run()
		exec.Command("dpkg", "--purge", "proxypool").Run()
		if _, ok := getent("passwd", "proxypool"); ok {
			exec.Command("userdel", "proxypool").Run()
		}
		if _, ok := getent("group", "proxypool"); ok {
			exec.Command("groupdel", "proxypool").Run()
		}
		os.RemoveAll("/etc/proxypool")
		os.RemoveAll("/var/lib/proxypool")
		for _, l := range enabledLinks {
			os.Remove(l)
		}
	})

	dpkg(t, "-i", deb.Path)
	if s := dpkgStatus("proxypool"); s != "ii |"+deb.Version {
		t.Fatalf("dpkg status %q after install", s)
	}

	t.Run("files", func(t *testing.T) {
		want := map[string]pathState{
			"/usr/bin/proxypool":                        {0o755, false, "root", "root"},
			"/etc/proxypool":                            {0o755, true, "root", "root"},
			"/etc/proxypool/proxypool.yaml":             {0o640, false, "root", "proxypool"},
			"/etc/proxypool/plugins":                    {0o755, true, "root", "root"},
			"/etc/proxypool/plugins/README.md":          {0o644, false, "root", "root"},
			"/usr/lib/systemd/system/proxypool.service": {0o644, false, "root", "root"},
			"/usr/lib/sysusers.d/proxypool.conf":        {0o644, false, "root", "root"},
			"/usr/lib/tmpfiles.d/proxypool.conf":        {0o644, false, "root", "root"},
			"/usr/share/proxypool/plugins/README.md":    {0o644, false, "root", "root"},
			"/var/lib/proxypool":                        {0o750, true, "proxypool", "proxypool"},
		}
		for path, w := range want {
			got, ok := statOwner(t, path)
			if !ok || got != w {
				t.Errorf("%s: %+v (exists %v), want %+v", path, got, ok, w)
			}
		}
		conf := run(t, "dpkg-query", "-W", "-f", "${Conffiles}", "proxypool")
		for _, c := range []string{"/etc/proxypool/proxypool.yaml", "/etc/proxypool/plugins/README.md"} {
			if !strings.Contains(conf, " "+c+" ") {
				t.Errorf("%s is not a conffile:\n%s", c, conf)
			}
		}
	})

	t.Run("user", func(t *testing.T) {
		pw, _ := getent("passwd", "proxypool")
		f := strings.Split(pw, ":")
		if len(f) != 7 {
			t.Fatalf("passwd entry %q", pw)
		}
		uid, _ := strconv.Atoi(f[2])
		if uid <= 0 || uid >= 1000 || f[5] != "/var/lib/proxypool" || !strings.HasSuffix(f[6], "nologin") {
			t.Errorf("passwd entry %q: want a system uid, home /var/lib/proxypool, nologin", pw)
		}
		if _, ok := getent("group", "proxypool"); !ok {
			t.Error("no proxypool group")
		}
	})

	t.Run("verify", func(t *testing.T) {
		verify(t, "/usr/lib/systemd/system/proxypool.service", "/usr/lib/systemd/system/proxypool-gateway.socket",
			"/usr/lib/systemd/system/proxypool-distribution.socket", "/usr/lib/systemd/system/proxypool-admin.socket")
	})

	// The installed binary, config, state directory and account work
	// together: as proxypool, through activated sockets as the .socket
	// units pass them (the shipped config's own ports may be taken here).
	t.Run("service", func(t *testing.T) {
		if out, err := exec.Command("runuser", "-u", "proxypool", "--", "/usr/bin/proxypool", "config", "check", "/etc/proxypool/proxypool.yaml").CombinedOutput(); err != nil {
			t.Fatalf("config check as proxypool: %v\n%s", err, out)
		}
		notify := listenNotify(t, true)
		ports := freePorts(t, 3)
		p := socketActivate(t, "proxypool", notify, []string{"gateway", "distribution", "admin"}, ports,
			"/usr/bin/proxypool", "run", "--config", "/etc/proxypool/proxypool.yaml")
		notify.expect(t, "READY=1")
		surfaces(t, addr(ports[0]), addr(ports[1]), addr(ports[2]), addr(ports[2]))
		p.signal(t, syscall.SIGTERM)
		notify.expect(t, "STOPPING=1")
		if code := p.exit(t); code != 0 {
			t.Errorf("exit code %d", code)
		}
		entries, err := os.ReadDir("/var/lib/proxypool")
		if err != nil || len(entries) == 0 {
			t.Errorf("the service wrote no state in /var/lib/proxypool (%v)", err)
		}
	})

	// Operator changes that upgrade and remove must keep.
	edited := readFile(t, "/etc/proxypool/proxypool.yaml") + "# local edit\n"
	if err := os.WriteFile("/etc/proxypool/proxypool.yaml", []byte(edited), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/etc/proxypool/plugins/custom.yaml", []byte("# operator plugin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "systemctl", "enable", "proxypool.service", "proxypool-gateway.socket")
	for _, l := range enabledLinks {
		if _, err := os.Lstat(l); err != nil {
			t.Fatalf("systemctl enable did not link %s", l)
		}
	}
	pwBefore, _ := getent("passwd", "proxypool")

	t.Run("upgrade", func(t *testing.T) {
		up, err := Build(BuildOptions{
			Config: "nfpm.yaml", Root: repoRoot, Describe: "v99.0.0", Arch: runtime.GOARCH,
			BinDir: filepath.Dir(binary(t, runtime.GOARCH)), OutDir: t.TempDir(), Formats: []string{"deb"},
			Optional: []string{"plugins/*.wasm"},
		})
		if err != nil {
			t.Fatal(err)
		}
		dpkg(t, "-i", up[0].Path)
		if s := dpkgStatus("proxypool"); s != "ii |99.0.0" {
			t.Errorf("dpkg status %q after upgrade", s)
		}
		if readFile(t, "/etc/proxypool/proxypool.yaml") != edited {
			t.Error("the upgrade replaced the edited configuration")
		}
		if pw, _ := getent("passwd", "proxypool"); pw != pwBefore {
			t.Errorf("account changed: %q -> %q", pwBefore, pw)
		}
	})

	t.Run("remove", func(t *testing.T) {
		dpkg(t, "-r", "proxypool")
		if s := dpkgStatus("proxypool"); !strings.HasPrefix(s, "rc ") {
			t.Errorf("dpkg status %q after remove, want rc", s)
		}
		for _, gone := range append([]string{"/usr/bin/proxypool", "/usr/lib/systemd/system/proxypool.service"}, enabledLinks...) {
			if _, err := os.Lstat(gone); err == nil {
				t.Errorf("%s survived remove", gone)
			}
		}
		if readFile(t, "/etc/proxypool/proxypool.yaml") != edited {
			t.Error("remove lost the configuration")
		}
		for _, kept := range []string{"/etc/proxypool/plugins/custom.yaml", "/var/lib/proxypool"} {
			if _, err := os.Stat(kept); err != nil {
				t.Errorf("remove deleted %s", kept)
			}
		}
		if _, ok := getent("passwd", "proxypool"); !ok {
			t.Error("remove deleted the account")
		}
	})

	t.Run("purge", func(t *testing.T) {
		dpkg(t, "--purge", "proxypool")
		if s := dpkgStatus("proxypool"); s != "" && !strings.HasPrefix(s, "un ") && !strings.HasPrefix(s, "pn ") {
			t.Errorf("dpkg status %q after purge", s)
		}
		for _, gone := range []string{"/etc/proxypool", "/var/lib/proxypool"} {
			if _, err := os.Lstat(gone); err == nil {
				t.Errorf("%s survived purge", gone)
			}
		}
		if _, ok := getent("passwd", "proxypool"); ok {
			t.Error("purge kept the proxypool user")
		}
		if _, ok := getent("group", "proxypool"); ok {
			t.Error("purge kept the proxypool group")
		}
	})
}
