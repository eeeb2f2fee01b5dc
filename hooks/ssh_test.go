package hooks

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// These tests run hooks/rollout with its default deploy command, ssh_deploy,
// against Debian's sshd on loopback: real ssh, real tar, real remote-deploy,
// bootstrap and deploy on a real Docker engine. Each simulated server is a
// Host entry of an ssh configuration (what production has for each instance
// id), all served by one sshd through a TCP relay the tests can cut.
//
// Production's defaults stay as they are; the tests change them through the
// rollout's named settings only: MYTHEX_SSH_CONFIG (the test's Host
// entries), MYTHEX_REMOTE_RELEASES (a temporary directory) and
// MYTHEX_REMOTE_SUDO (empty: the ssh user, root here, runs the commands).
// A server's own settings (MYTHEX_ROOT, MYTHEX_PROJECT, MYTHEX_SYSTEMD_DIR,
// MYTHEX_BIND) reach its session through ssh's SetEnv and sshd's AcceptEnv.

const sshdInstall = "apt-get install openssh-server"

// sshd is one sshd on loopback, reached through a relay.
type sshd struct {
	dir, user  string
	hostPub    []byte // the host key's public half, as known_hosts holds it
	userKey    string
	relay      *relay
	stderr     *bytes.Buffer
	configFile string
}

// lookSSH finds the OpenSSH commands, failing at once with the install
// command when one is missing.
func lookSSH(t *testing.T) (sshdPath string) {
	t.Helper()
	sshdPath, err := exec.LookPath("sshd")
	if err != nil {
		sshdPath = "/usr/sbin/sshd" // not on a non-root PATH
		_, err = os.Stat(sshdPath)
	}
	require.NoError(t, err, "these tests need OpenSSH's server: %s", sshdInstall)
	for _, c := range []string{"ssh", "ssh-keygen"} {
		_, err := exec.LookPath(c)
		require.NoError(t, err, "these tests need OpenSSH's client: apt-get install openssh-client")
	}
	return sshdPath
}

func keygen(t *testing.T, path string) []byte {
	t.Helper()
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path).CombinedOutput()
	require.NoError(t, err, "ssh-keygen: %s", out)
	pub, err := os.ReadFile(path + ".pub")
	require.NoError(t, err)
	return bytes.TrimSpace(pub)
}

// startSSHD starts sshd on a free loopback port with a throwaway host key,
// accepting one throwaway user key, and a relay in front of it.
func startSSHD(t *testing.T) *sshd {
	t.Helper()
	sshdPath := lookSSH(t)
	u, err := user.Current()
	require.NoError(t, err)
	if os.Geteuid() == 0 {
		// sshd running as root needs its privilege separation directory,
		// which Debian's sshd.service creates (RuntimeDirectory=sshd).
		require.NoError(t, os.MkdirAll("/run/sshd", 0o755))
	}
	dir := t.TempDir()
	s := &sshd{dir: dir, user: u.Username, userKey: filepath.Join(dir, "user_key"), stderr: &bytes.Buffer{}}
	s.hostPub = keygen(t, filepath.Join(dir, "host_key"))
	userPub := keygen(t, s.userKey)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "authorized_keys"), append(userPub, '\n'), 0o600))
	port := freePort(t)
	config := fmt.Sprintf(`ListenAddress 127.0.0.1:%d
HostKey %s
PidFile %s
AuthorizedKeysFile %s
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
AcceptEnv MYTHEX_*
LogLevel VERBOSE
`, port, filepath.Join(dir, "host_key"), filepath.Join(dir, "sshd.pid"), filepath.Join(dir, "authorized_keys"))
	s.configFile = filepath.Join(dir, "sshd_config")
	require.NoError(t, os.WriteFile(s.configFile, []byte(config), 0o600))

	cmd := exec.Command(sshdPath, "-D", "-e", "-f", s.configFile)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	// Ready once it says it listens; everything it says is kept for failures.
	ready := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			s.stderr.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.Contains(sc.Text(), "Server listening on 127.0.0.1 port "+strconv.Itoa(port)) {
				once.Do(func() { close(ready) })
			}
		}
		once.Do(func() { close(ready) })
	}()
	<-ready
	mu.Lock()
	log := s.stderr.String()
	mu.Unlock()
	require.Contains(t, log, "Server listening", "sshd did not start:\n%s", log)
	s.relay = startRelay(t, "127.0.0.1:"+strconv.Itoa(port))
	return s
}

// simServer is one server as the rollout sees it: an ssh Host entry, with
// its own root and compose project on this machine.
type simServer struct {
	name string
	Server
}

// clientConfig writes the ssh configuration the rollout is given: one Host
// entry per server, reached through the relay, its host key checked against
// knownHosts. extra goes into every entry.
func (s *sshd) clientConfig(t *testing.T, knownHosts []byte, extra string, servers ...simServer) string {
	t.Helper()
	dir := t.TempDir()
	kh := filepath.Join(dir, "known_hosts")
	require.NoError(t, os.WriteFile(kh, knownHosts, 0o600))
	var b strings.Builder
	for _, srv := range servers {
		fmt.Fprintf(&b, `Host %s
  HostName 127.0.0.1
  Port %d
  User %s
  IdentityFile %s
  IdentitiesOnly yes
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  HostKeyAlias mythex-test-sshd
  LogLevel ERROR
  SetEnv MYTHEX_ROOT=%s MYTHEX_PROJECT=%s MYTHEX_SYSTEMD_DIR=%s MYTHEX_BIND=%s
%s
`, srv.name, s.relay.port, s.user, s.userKey, kh, srv.Root, srv.Project, filepath.Join(srv.Root, "systemd"), srv.Bind, extra)
	}
	path := filepath.Join(dir, "ssh_config")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// knownHosts is the known_hosts line of s's host key.
func (s *sshd) knownHosts() []byte {
	return append([]byte("mythex-test-sshd "), append(s.hostPub, '\n')...)
}

// relay forwards loopback connections to sshd and can cut them all, as a
// network that drops the connection.
type relay struct {
	port  int
	mu    sync.Mutex
	conns []net.Conn
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &relay{port: l.Addr().(*net.TCPAddr).Port}
	t.Cleanup(func() {
		_ = l.Close()
		r.cut()
	})
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, in, out)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return r
}

// cut drops every connection through the relay.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// releaseHooks is a copy of hooks/ whose generated files are rendered from
// tm, owned by someone else (uid 4242, when the tests run as root) and
// writable by all: what the rollout ships must be root's anyway.
func releaseHooks(t *testing.T, tm infra.Timing) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"rollout", "remote-deploy", "deploy", "bootstrap", "watchdog", "lib.sh", "mythex-watchdog.service"} {
		data := mustRead(t, name)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o755))
	}
	files, err := Generated(tm)
	require.NoError(t, err)
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Stat(p)
		require.NoError(t, err)
		require.NoError(t, os.Chmod(p, fi.Mode().Perm()|0o022))
		if os.Geteuid() == 0 {
			require.NoError(t, os.Chown(p, foreignUID, foreignUID))
		}
	}
	return dir
}

const foreignUID = 4242

// newSimServer makes server sN. Each publishes api on its own loopback
// address (127.0.0.N), so one rollout gives every server the same app
// port, as production does.
func newSimServer(t *testing.T, n int) simServer {
	t.Helper()
	name := "s" + strconv.Itoa(n)
	root := filepath.Join(t.TempDir(), name)
	s := simServer{name: name, Server: Server{Root: root, Project: "hookssh" + randomHex(4), Bind: "127.0.0." + strconv.Itoa(n)}}
	t.Cleanup(func() {
		if err := s.Remove(context.Background()); err != nil {
			t.Errorf("clean up %s: %v", s.Project, err)
		}
	})
	return s
}

// sshRollout is one run of the rollout with its default deploy command.
type sshRollout struct {
	hooks, config, releases string
	appPort                 int
	// onLine sees each line the rollout prints, as it prints it.
	onLine func(string)
}

func (r sshRollout) run(t *testing.T, version string, servers ...simServer) result {
	t.Helper()
	args := []string{version}
	for _, s := range servers {
		args = append(args, s.name)
	}
	cmd := exec.Command(filepath.Join(r.hooks, "rollout"), args...)
	cmd.Env = append(environWithout("MYTHEX_"),
		"MYTHEX_SSH_CONFIG="+r.config,
		"MYTHEX_REMOTE_RELEASES="+r.releases,
		"MYTHEX_REMOTE_SUDO=",
		"MYTHEX_APP_PORT="+strconv.Itoa(r.appPort),
		"MYTHEX_WAIT_IN_SERVICE=true", // the wait has tests of its own
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var stdout strings.Builder
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		stdout.WriteString(sc.Text() + "\n")
		if r.onLine != nil {
			r.onLine(sc.Text())
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// serverState is what a server is left with: the version its state names
// and, per service, its containers' image and health.
func serverState(t *testing.T, s simServer) (deployed string, services map[string]string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(s.Root, "state", "deployed.env")); err == nil {
		for _, l := range lines(string(b)) {
			if v, ok := strings.CutPrefix(l, EnvVersion+"="); ok {
				deployed = v
			}
		}
	}
	services = map[string]string{}
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=com.docker.compose.project="+s.Project,
		"--format", `{{.Label "com.docker.compose.service"}} {{.Image}} {{.Status}}`).Output()
	require.NoError(t, err)
	for _, l := range lines(string(out)) {
		svc, rest, _ := strings.Cut(l, " ")
		if services[svc] != "" {
			services[svc] += "; "
		}
		services[svc] += rest
	}
	return deployed, services
}

// requireAt asserts the server runs version, every service one healthy
// container of it.
func requireAt(t *testing.T, s simServer, version string) {
	t.Helper()
	deployed, services := serverState(t, s)
	assert.Equal(t, version, deployed, "%s: state/deployed.env", s.name)
	for _, role := range Roles {
		got := services[role]
		assert.True(t, strings.HasPrefix(got, ImageName(DefaultImagePrefix, role, version)+" Up") && strings.HasSuffix(got, "(healthy)"),
			"%s: %s runs %q, want one healthy %s", s.name, role, got, ImageName(DefaultImagePrefix, role, version))
	}
}

// checkSessionEnv makes sure a server's settings reach its ssh session
// before anything runs there with production's defaults.
func checkSessionEnv(t *testing.T, config string, s simServer) {
	t.Helper()
	out, err := exec.Command("ssh", "-F", config, "-o", "BatchMode=yes", "--", s.name, "printenv MYTHEX_ROOT").CombinedOutput()
	require.NoError(t, err, "ssh %s: %s", s.name, out)
	require.Equal(t, s.Root, strings.TrimSpace(string(out)), "MYTHEX_ROOT must reach the session (SetEnv/AcceptEnv)")
}

func TestRolloutOverSSH(t *testing.T) {
	tag := images(t)
	sshd := startSSHD(t)
	tm := infra.Prod().Scaled(0.2)
	hooksDir := releaseHooks(t, tm)
	releases := filepath.Join(t.TempDir(), "releases")
	s1, s2 := newSimServer(t, 1), newSimServer(t, 2)
	config := sshd.clientConfig(t, sshd.knownHosts(), "", s1, s2)
	checkSessionEnv(t, config, s1)
	ro := sshRollout{hooks: hooksDir, config: config, releases: releases, appPort: freePort(t)}

	t.Run("success", func(t *testing.T) {
		res := ro.run(t, tag, s1, s2)
		require.Equal(t, 0, res.code, "%s\nsshd:\n%s", res, sshd.stderr)
		for _, s := range []simServer{s1, s2} {
			assert.Contains(t, res.stdout, "installed hooks into "+s.Root+"/hooks", "bootstrap ran on %s", s.name)
			requireAt(t, s, tag)
		}
		assert.Equal(t, 2, strings.Count(res.stdout, "deployed "+tag+" in"), "each server's log streams back:\n%s", res.stdout)
		assert.Less(t, strings.Index(res.stdout, "installed hooks into "+s1.Root), strings.Index(res.stdout, "[2/2] deploying "+tag+" to s2"),
			"one server at a time")
		assert.Contains(t, res.stdout, "deployed "+tag+" to all 2 server(s): s1 s2")
		// The release on the server is root's, with no group or other
		// write, whoever owned the files that were shipped.
		entries, err := os.ReadDir(filepath.Join(releases, tag))
		require.NoError(t, err)
		require.NotEmpty(t, entries)
		for _, e := range entries {
			fi, err := os.Stat(filepath.Join(releases, tag, e.Name()))
			require.NoError(t, err)
			st := fi.Sys().(*syscall.Stat_t)
			assert.Equal(t, uint32(os.Geteuid()), st.Uid, "%s owner", e.Name())
			assert.Zero(t, fi.Mode().Perm()&0o022, "%s mode %v", e.Name(), fi.Mode().Perm())
		}
	})

	t.Run("failed deploy", func(t *testing.T) {
		// No image has this tag and none can be pulled: deploy exits 1 on
		// the server, and ssh carries it back.
		missing := "nosuchtag-" + randomHex(3)
		s3, s4 := newSimServer(t, 3), newSimServer(t, 4)
		ro := ro
		ro.config = sshd.clientConfig(t, sshd.knownHosts(), "", s3, s4)
		res := ro.run(t, missing, s3, s4)
		assert.Equal(t, 1, res.code, "%s", res)
		assert.Contains(t, res.stdout, "cannot pull "+ImageName(DefaultImagePrefix, Roles[0], missing))
		assert.Contains(t, res.stderr, "deploy of "+missing+" to s3 FAILED (exit 1); stopping here. Not deployed: s4")
		assert.Contains(t, res.stderr, "ended with exit status 1")
		assert.NoDirExists(t, s4.Root, "s4 never touched")
	})

	t.Run("exit status through ssh", func(t *testing.T) {
		// The server's lock is held (a watchdog restart, say) past the lock
		// wait: deploy's 75 comes back as 75. A short timing keeps the wait
		// short; compose still gets whole seconds.
		short := infra.Prod().Scaled(0.1)
		s5 := newSimServer(t, 5)
		ro := ro
		ro.hooks = releaseHooks(t, short)
		ro.config = sshd.clientConfig(t, sshd.knownHosts(), "", s5)
		require.NoError(t, os.MkdirAll(s5.Root, 0o755))
		lock, err := os.OpenFile(filepath.Join(s5.Root, "mythex.lock"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		require.NoError(t, err)
		defer lock.Close()
		require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
		res := ro.run(t, tag, s5)
		assert.Equal(t, 1, res.code, "%s", res)
		assert.Contains(t, res.stdout, "gave up after "+seconds(short.LockWait)+"s waiting for the server lock")
		assert.Contains(t, res.stderr, "deploy of "+tag+" to s5 FAILED (exit 75)")
		assert.NoDirExists(t, filepath.Join(s5.Root, "hooks"), "bootstrap never ran without the lock")
	})

	t.Run("host key mismatch", func(t *testing.T) {
		other := keygen(t, filepath.Join(t.TempDir(), "other_host_key"))
		for name, kh := range map[string][]byte{
			"changed key": append([]byte("mythex-test-sshd "), append(other, '\n')...),
			// Unknown, with a configuration that would accept it: the
			// rollout insists on a known key.
			"unknown key": nil,
		} {
			t.Run(name, func(t *testing.T) {
				s6 := newSimServer(t, 6)
				rel := filepath.Join(t.TempDir(), "releases")
				ro := ro
				ro.releases = rel
				ro.config = sshd.clientConfig(t, kh, "  StrictHostKeyChecking accept-new", s6)
				res := ro.run(t, tag, s6)
				assert.Equal(t, 1, res.code, "%s", res)
				assert.Contains(t, res.stderr, "Host key verification failed")
				assert.Contains(t, res.stderr, "ssh to s6 failed or the connection dropped (exit 255)")
				assert.NoDirExists(t, rel, "nothing shipped")
				assert.NoDirExists(t, s6.Root, "nothing run")
			})
		}
	})

	t.Run("connection dropped mid-deploy", func(t *testing.T) {
		ro := ro
		s7 := newSimServer(t, 7)
		ro.config = sshd.clientConfig(t, sshd.knownHosts(), "", s7)
		res := ro.run(t, tag, s7)
		require.Equal(t, 0, res.code, "%s", res)
		v2 := "v2-" + tag
		for _, role := range Roles {
			tagImage(t, ImageName(DefaultImagePrefix, role, tag), ImageName(DefaultImagePrefix, role, v2))
		}
		// Cut the connection once deploy is replacing the containers: the
		// moment a killed deploy would leave services missing.
		ro.onLine = func(l string) {
			if strings.Contains(l, "running container(s) with "+v2) {
				sshd.relay.cut()
			}
		}
		res = ro.run(t, v2, s7)
		assert.Equal(t, 1, res.code, "%s", res)
		assert.Contains(t, res.stderr, "ssh to s7 failed or the connection dropped (exit 255)")
		assert.NotContains(t, res.stdout, "deployed "+v2+" in", "the rollout saw the connection drop before the end")
		// The deploy goes on without its caller; once it lets go of the
		// server lock, the server is at the new release, verified.
		out, err := exec.Command("flock", "-w", seconds(tm.ServerDeployMax()), filepath.Join(s7.Root, "mythex.lock"), "true").CombinedOutput()
		require.NoError(t, err, "the server lock stayed held: %s", out)
		requireAt(t, s7, v2)
		logs, err := filepath.Glob(filepath.Join(ro.releases, v2, "remote-deploy.*.log"))
		require.NoError(t, err)
		require.Len(t, logs, 1)
		assert.Contains(t, string(mustRead(t, logs[0])), "deployed "+v2+" in", "the server's log says how it ended")
	})
}

// seconds writes d as the fractional seconds flock and the scripts print.
func seconds(d time.Duration) string {
	ms := d.Milliseconds()
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}
