package hooks

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks/sshd"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/needs"
	"github.com/mythex/infra/rollout"
)

// These tests run the Go rollout (package rollout, in process, as
// cmd/rollout runs it) with its ssh transport against Debian's sshd on
// loopback: real ssh, real tar on the server, real remote-deploy, bootstrap
// and deploy on a real Docker engine. Each simulated server is a Host entry
// of an ssh configuration (what production has for each instance id), all
// served by one sshd through a TCP relay the tests can cut. Re-entry is
// taken as given (inService): the wait has tests of its own (rollout.ELB's,
// against the describe-target-health stand-in).
//
// Production's defaults stay as they are; the tests set only what
// cmd/rollout takes as -ssh-config (the test's Host entries),
// -remote-releases (a temporary directory) and -remote-sudo (empty: the ssh
// user, root here, runs the commands). A server's own settings
// (MYTHEX_ROOT, MYTHEX_PROJECT, MYTHEX_SYSTEMD_DIR, MYTHEX_BIND) reach its
// session through ssh's SetEnv and sshd's AcceptEnv.

// startSSHD starts sshd for the test, failing at once when it is missing.
func startSSHD(t *testing.T) *sshd.Server {
	t.Helper()
	needs.Have(t, needs.SSHD)
	_, err := sshd.Find()
	require.NoError(t, err, "these tests need OpenSSH")
	s, err := sshd.Start(t.TempDir(), time.Minute)
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	return s
}

// simServer is one server as the rollout sees it: an ssh Host entry, with
// its own root and compose project on this machine.
type simServer struct {
	name string
	Server
}

func (s simServer) host() sshd.Host {
	return sshd.Host{Name: s.name, Root: s.Root, Project: s.Project, Bind: s.Bind}
}

// clientConfig writes the ssh configuration the rollout is given.
func clientConfig(t *testing.T, d *sshd.Server, knownHosts []byte, extra string, servers ...simServer) string {
	t.Helper()
	var hosts []sshd.Host
	for _, s := range servers {
		hosts = append(hosts, s.host())
	}
	path, err := d.WriteClientConfig(t.TempDir(), knownHosts, extra, hosts...)
	require.NoError(t, err)
	return path
}

// releaseHooks is a copy of hooks/ whose generated files are rendered from
// tm, owned by someone else (uid 4242, when the tests run as root) and
// writable by all: what the rollout ships must be root's anyway.
func releaseHooks(t *testing.T, tm infra.Timing) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"remote-deploy", "deploy", "bootstrap", "watchdog", "lib.sh", "mythex-watchdog.service"} {
		data := mustRead(t, name)
		// The checkout's mode, as the rollout ships it: a script the
		// repository does not mark executable fails here as on a server.
		fi, err := os.Stat(name)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, fi.Mode().Perm()))
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

// overSSH is how a test's rollouts reach its servers: the Go rollout's
// ssh transport, shipping the release in hooks.
type overSSH struct {
	hooks, config, releases string
	appPort                 int
	// timing is the release's contract: the rollout's bounds and ssh's.
	timing infra.Timing
}

// run rolls version out to servers, one at a time (MaxUnavailable 1), as
// cmd/rollout does: the rollout's progress and the servers' output go to
// stdout, the servers' errors to stderr, each server's lines after its
// name. Both must be safe for concurrent use.
func (o overSSH) run(t *testing.T, version string, stdout, stderr io.Writer, servers ...simServer) rollout.Report {
	t.Helper()
	var names []string
	for _, s := range servers {
		names = append(names, s.name)
	}
	tr := rollout.SSH{HooksDir: o.hooks, Version: version, Config: o.config, RemoteReleases: o.releases,
		AppPort: o.appPort, ImagePrefix: DefaultImagePrefix, Timing: o.timing, Stdout: stdout, Stderr: stderr}
	c := rollout.Config{Version: version, Servers: names, MaxUnavailable: 1, Timing: o.timing,
		Transport: tr, Balancer: inService{}, Log: stdout}
	require.NoError(t, c.Check())
	return rollout.Run(context.Background(), c)
}

// output is what a rollout printed, its servers' lines written side by
// side.
type output struct {
	stdout, stderr syncBuffer
}

func (o *output) String() string {
	return "stdout:\n" + o.stdout.String() + "\nstderr:\n" + o.stderr.String()
}

// syncBuffer is a buffer written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

// table is the report as cmd/rollout prints it, for a failure's message.
func table(rep rollout.Report) string {
	var b strings.Builder
	_ = rep.WriteTable(&b)
	return b.String()
}

// serverLine matches a line the server printed, relayed after its name.
func serverLine(s simServer, text string) string {
	return `(?m)^\[` + regexp.QuoteMeta(s.name) + `\] .*` + regexp.QuoteMeta(text)
}

// serverState is what a server is left with: the version its current
// release names and, per service, its containers' image and health.
func serverState(t *testing.T, s simServer) (deployed string, services map[string]string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(s.Root, "current", "deployed.env")); err == nil {
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
	assert.Equal(t, version, deployed, "%s: current/deployed.env", s.name)
	for _, role := range Roles {
		got := services[role]
		assert.True(t, strings.HasPrefix(got, ImageName(DefaultImagePrefix, role, version)+" Up") && strings.HasSuffix(got, "(healthy)"),
			"%s: %s runs %q, want one healthy %s", s.name, role, got, ImageName(DefaultImagePrefix, role, version))
	}
}

func TestRolloutOverSSH(t *testing.T) {
	// s1 and s2 run at once.
	parallel(t, 2)
	tag := images(t)
	ssh := startSSHD(t)
	tm := infra.Prod().Scaled(0.2)
	releases := filepath.Join(t.TempDir(), "releases")
	s1, s2 := newSimServer(t, 1), newSimServer(t, 2)
	config := clientConfig(t, ssh, ssh.KnownHosts(), "", s1, s2)
	require.NoError(t, sshd.CheckSession(config, s1.host()))
	ro := overSSH{hooks: releaseHooks(t, tm), config: config, releases: releases, appPort: freePort(t), timing: tm}

	t.Run("success", func(t *testing.T) {
		out := &output{}
		rep := ro.run(t, tag, &out.stdout, &out.stderr, s1, s2)
		require.Equal(t, rollout.Deployed, rep.Outcome, "%s%s\nsshd:\n%s", table(rep), out, ssh.Log())
		require.Len(t, rep.Servers, 2)
		for i, s := range []simServer{s1, s2} {
			sr := rep.Servers[i]
			assert.Equal(t, []string{s.name, "", tag, "yes"}, []string{sr.Server, sr.Before, sr.Now, sr.Verified})
			assert.Equal(t, []string{"deploy: verified and back in service"}, sr.What, s.name)
			assert.Regexp(t, serverLine(s, "installed hooks into "+s.Root+"/hooks"), out.stdout.String(), "bootstrap ran on %s", s.name)
			assert.Regexp(t, serverLine(s, "deployed "+tag+" in"), out.stdout.String(), "%s's log streams back", s.name)
			requireAt(t, s, tag)
		}
		assert.Equal(t, 2, strings.Count(out.stdout.String(), "deployed "+tag+" in"), "each server's log streams back:\n%s", out)
		// One server at a time: s1's deploy ended before s2's began.
		s1Done := regexp.MustCompile(serverLine(s1, "deployed "+tag+" in")).FindStringIndex(out.stdout.String())
		require.NotNil(t, s1Done, "%s", out)
		assert.Less(t, s1Done[0], strings.Index(out.stdout.String(), "deploying "+tag+" to [s2]"), "one server at a time:\n%s", out)
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
		for _, s := range []simServer{s1, s2} {
			require.NoError(t, s.Remove(context.Background()), "remove %s's containers", s.name)
		}
	})

	t.Run("failed deploy", func(t *testing.T) {
		// No image has this tag and none can be pulled: deploy exits 1 on
		// the server, and ssh carries it back.
		missing := "nosuchtag-" + randomHex(3)
		s3, s4 := newSimServer(t, 3), newSimServer(t, 4)
		ro := ro
		ro.config = clientConfig(t, ssh, ssh.KnownHosts(), "", s3, s4)
		out := &output{}
		rep := ro.run(t, missing, &out.stdout, &out.stderr, s3, s4)
		assert.Equal(t, rollout.Failed, rep.Outcome, "%s%s", table(rep), out)
		assert.Regexp(t, serverLine(s3, "cannot pull "+ImageName(DefaultImagePrefix, Roles[0], missing)), out.stdout.String())
		assert.Regexp(t, serverLine(s3, "ended with exit status 1"), out.stderr.String())
		require.Len(t, rep.Servers, 2)
		// s3 ran nothing before: there is no release to go back to.
		assert.Equal(t, []string{"deploy FAILED: s3 " + missing + ": exit status 1",
			"no release before this rollout: nothing to roll back to"}, rep.Servers[0].What, "%s", table(rep))
		s4r := rep.Servers[1]
		assert.Equal(t, []string{"s4", "", "", "no"}, []string{s4r.Server, s4r.Before, s4r.Now, s4r.Verified})
		assert.Equal(t, []string{"not started"}, s4r.What)
		assert.NoDirExists(t, s4.Root, "s4 never touched: asking what it runs created nothing")
	})

	t.Run("exit status through ssh", func(t *testing.T) {
		// The server's lock is held (a watchdog restart, say) past the lock
		// wait: remote-deploy's 75 comes back as 75, within the rollout's
		// own bound on --status. A short timing keeps the wait short;
		// compose still gets whole seconds.
		short := scaledWithoutContainers(0.1)
		s5 := newSimServer(t, 5)
		ro := ro
		ro.hooks = releaseHooks(t, short)
		ro.timing = short
		ro.config = clientConfig(t, ssh, ssh.KnownHosts(), "", s5)
		require.NoError(t, os.MkdirAll(s5.Root, 0o755))
		lock, err := os.OpenFile(filepath.Join(s5.Root, "mythex.lock"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		require.NoError(t, err)
		defer lock.Close()
		require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
		out := &output{}
		rep := ro.run(t, tag, &out.stdout, &out.stderr, s5)
		assert.Equal(t, rollout.Failed, rep.Outcome, "%s%s", table(rep), out)
		assert.Regexp(t, serverLine(s5, "gave up after "+seconds(short.LockWait)+"s waiting for the server lock"), out.stderr.String())
		require.Len(t, rep.Servers, 1)
		// Nothing deployed: the rollout stops at what it could not ask.
		sr := rep.Servers[0]
		assert.Equal(t, []string{"?", "?", "unknown"}, []string{sr.Before, sr.Now, sr.Verified})
		assert.Equal(t, []string{"cannot tell what it runs: s5 --status: exit status 75"}, sr.What)
		assert.NoDirExists(t, filepath.Join(s5.Root, "hooks"), "bootstrap never ran without the lock")
	})

	t.Run("host key mismatch", func(t *testing.T) {
		other, err := sshd.Keygen(filepath.Join(t.TempDir(), "other_host_key"))
		require.NoError(t, err)
		for name, kh := range map[string][]byte{
			"changed key": []byte(sshd.HostKeyAlias + " " + string(other) + "\n"),
			// Unknown, with a configuration that would accept it: the
			// rollout insists on a known key.
			"unknown key": nil,
		} {
			t.Run(name, func(t *testing.T) {
				s6 := newSimServer(t, 6)
				rel := filepath.Join(t.TempDir(), "releases")
				ro := ro
				ro.releases = rel
				ro.config = clientConfig(t, ssh, kh, "  StrictHostKeyChecking accept-new", s6)
				out := &output{}
				rep := ro.run(t, tag, &out.stdout, &out.stderr, s6)
				assert.Equal(t, rollout.Failed, rep.Outcome, "%s%s", table(rep), out)
				assert.Regexp(t, serverLine(s6, "Host key verification failed"), out.stderr.String())
				require.Len(t, rep.Servers, 1)
				sr := rep.Servers[0]
				assert.Equal(t, []string{"?", "?", "unknown"}, []string{sr.Before, sr.Now, sr.Verified})
				assert.Equal(t, []string{"cannot tell what it runs: s6 --status: ssh failed or the connection dropped (exit 255)"}, sr.What)
				assert.NoDirExists(t, rel, "nothing shipped")
				assert.NoDirExists(t, s6.Root, "nothing run")
			})
		}
	})
}

// seconds writes d as the fractional seconds flock and the scripts print.
func seconds(d time.Duration) string {
	ms := d.Milliseconds()
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}

// A release whose api never becomes healthy, rolled out over ssh to two
// servers: the canary's deploy fails, the rollout sends it back through
// remote-deploy --rollback to the release it ran before (kept on the
// server), verified, and never touches the other server. The broken release
// ships hooks of its own (another timing: other numbers, another watchdog
// timer): the rollback puts back the hooks, numbers and units of the
// release before too, not just its containers. The good release's rollout
// run again finds both servers on it and skips them.
func TestRolloutRollsBackOverSSH(t *testing.T) {
	parallel(t, 2)
	tag := images(t)
	bad := tag + "-noapi"
	buildVersion(t, bad)
	tagImage(t, unhealthyImage(), ImageName(DefaultImagePrefix, "api", bad))
	ssh := startSSHD(t)
	s8, s9 := newSimServer(t, 8), newSimServer(t, 9)
	good := infra.Prod().Scaled(0.2)
	ro := overSSH{
		hooks:    releaseHooks(t, good),
		config:   clientConfig(t, ssh, ssh.KnownHosts(), "", s8, s9),
		releases: filepath.Join(t.TempDir(), "releases"),
		appPort:  freePort(t),
		timing:   good,
	}
	out := &output{}
	rep := ro.run(t, tag, &out.stdout, &out.stderr, s8, s9)
	require.Equal(t, rollout.Deployed, rep.Outcome, "%s%s", table(rep), out)
	good8, good9 := installedHooks(t, s8.Server), installedHooks(t, s9.Server)

	other := good
	other.WatchdogInterval += time.Second
	broken := ro
	broken.hooks = releaseHooks(t, other)
	broken.timing = other
	out = &output{}
	rep = broken.run(t, bad, &out.stdout, &out.stderr, s8, s9)
	assert.Equal(t, rollout.Failed, rep.Outcome, "%s%s", table(rep), out)
	require.Len(t, rep.Servers, 2)
	// s8, the canary, failed (deploy's exit 1 through ssh) and went back
	// to the release before, verified; s9 was never touched.
	assert.Equal(t, rollout.ServerReport{Server: "s8", Before: tag, Now: tag, Verified: "yes",
		What: []string{"deploy FAILED: s8 " + bad + ": exit status 1", "rollback: verified and back in service"}}, rep.Servers[0], "%s", table(rep))
	assert.Equal(t, rollout.ServerReport{Server: "s9", Before: tag, Now: tag, Verified: "yes",
		What: []string{"not started"}}, rep.Servers[1], "%s", table(rep))
	assert.Regexp(t, serverLine(s8, "api: container health is"), out.stdout.String())
	assert.Regexp(t, serverLine(s8, "rolling back to "+tag+" (release "+tag+"-"), out.stdout.String())
	assert.Regexp(t, serverLine(s8, "with the hooks that deployed it (hook-releases/"), out.stdout.String())
	assert.NotContains(t, out.stdout.String(), "deploying "+bad+" to [s9]")
	requireAt(t, s8, tag)
	requireAt(t, s9, tag)
	// The broken release's bootstrap had installed its hooks, numbers and
	// timer on s8; the rollback put the good release's back, byte for byte.
	assert.Regexp(t, serverLine(s8, "installed hooks into "+s8.Root+"/hooks"), out.stdout.String(), "the broken release's bootstrap ran on s8")
	for _, name := range []string{TimingEnvFile, TimerFile} {
		assert.NotEqual(t, mustRead(t, filepath.Join(ro.hooks, name)), mustRead(t, filepath.Join(broken.hooks, name)), "the releases' %s differ", name)
	}
	assert.Equal(t, good8, installedHooks(t, s8.Server), "s8 runs the hooks, numbers and units of the release before")
	assert.Equal(t, good9, installedHooks(t, s9.Server), "s9 untouched")

	out = &output{}
	rep = ro.run(t, tag, &out.stdout, &out.stderr, s8, s9)
	require.Equal(t, rollout.Deployed, rep.Outcome, "%s%s", table(rep), out)
	for i, s := range []string{"s8", "s9"} {
		assert.Equal(t, rollout.ServerReport{Server: s, Before: tag, Now: tag, Verified: "yes",
			What: []string{"skipped: already on " + tag}}, rep.Servers[i])
	}
	assert.NotContains(t, out.stdout.String(), "deploying "+tag+" to", "nothing deployed again")
}

// installedHooks is what a server runs its hooks and watchdog with: every
// file the hooks link names, and the units bootstrap installed, by name.
func installedHooks(t *testing.T, s Server) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range []string{"deploy", "watchdog", "bootstrap", "lib.sh", TimingEnvFile} {
		out["hooks/"+name] = string(mustRead(t, filepath.Join(s.Root, "hooks", name)))
	}
	for _, name := range []string{ServiceFile, TimerFile} {
		out["systemd/"+name] = string(mustRead(t, filepath.Join(s.Root, "systemd", name)))
	}
	return out
}

// lineCutter relays the rollout's output and cuts the ssh relay the first
// time a line holds match: the connection drops at that moment of the
// deploy.
type lineCutter struct {
	mu    sync.Mutex
	out   strings.Builder
	match string
	cut   func()
	done  bool
}

func (c *lineCutter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out.Write(p)
	if !c.done && strings.Contains(c.out.String(), c.match) {
		c.done = true
		c.cut()
	}
	return len(p), nil
}

func (c *lineCutter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// inService stands in for the balancer: re-entry has tests of its own.
type inService struct{}

func (inService) WaitInService(context.Context, string) error { return nil }

// Finding 9: the bash rollout took a dropped connection for a failed
// deploy and rolled back over the deploy that ran on, detached. The Go
// rollout re-attaches: with the relay cut while deploy replaces the
// containers (the moment a killed deploy would leave services missing), it
// reconnects, waits through remote-deploy --attach for that deploy, which
// went on without its caller, to end, and reports the server deployed,
// verified, with no rollback.
func TestGoRolloutReattachesAfterADrop(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	ssh := startSSHD(t)
	tm := infra.Prod().Scaled(0.2)
	s := newSimServer(t, 10)
	ro := overSSH{hooks: releaseHooks(t, tm), config: clientConfig(t, ssh, ssh.KnownHosts(), "", s),
		releases: filepath.Join(t.TempDir(), "releases"), appPort: freePort(t), timing: tm}
	first := &lineCutter{cut: func() {}}
	rep := ro.run(t, tag, first, first, s)
	require.Equal(t, rollout.Deployed, rep.Outcome, "%s", first)

	v2 := "v2-" + tag
	buildVersion(t, v2)
	// Cut the connection once deploy is replacing the containers.
	out := &lineCutter{match: "running container(s) with " + v2, cut: ssh.Relay.Cut}
	rep = ro.run(t, v2, out, out, s)
	require.Equal(t, rollout.Deployed, rep.Outcome, "%s", out)
	assert.Contains(t, out.String(), "ssh failed or the connection dropped (exit 255); re-attaching", "the connection dropped mid-deploy")
	require.Len(t, rep.Servers, 1)
	what := rep.Servers[0].What
	require.NotEmpty(t, what, "%s", out)
	assert.Regexp(t, `^ssh dropped; re-attached: on `+regexp.QuoteMeta(v2)+`, verified \(its record: \S+ `+regexp.QuoteMeta(v2)+`: deployed and verified\)$`, what[0])
	assert.NotContains(t, out.String(), "rolling back", "no rollback")
	assert.Equal(t, v2, rep.Servers[0].Now)
	assert.Equal(t, "yes", rep.Servers[0].Verified)
	requireAt(t, s, v2)
	// The deploy's own log, on the server, says how it ended.
	logs, err := filepath.Glob(filepath.Join(ro.releases, v2, "remote-deploy.*.log"))
	require.NoError(t, err)
	require.Len(t, logs, 1)
	assert.Contains(t, string(mustRead(t, logs[0])), "deployed "+v2+" in", "the server's log says how it ended")
}
