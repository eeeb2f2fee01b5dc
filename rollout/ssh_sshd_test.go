package rollout_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks/sshd"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/needs"
	"github.com/mythex/infra/rollout"
)

// remoteStub stands in for remote-deploy on the far side of a real ssh: the
// transport, the release's shipping and ssh's own bounds are what is tested.
const remoteStub = `#!/usr/bin/env bash
case "$1" in
  --status) echo "checking" >&2; echo "release=v1 previous=v0 verified=yes" ;;
  --rollback) echo "rolled back to $2" ;;
  --attach) echo "waited" >&2; echo "release=$2 previous=v1 verified=yes"; echo "last-deploy 2026-12-07T04:00:00Z $2: deployed and verified" ;;
  hang) echo "started"; exec sleep 10 ;;
  *) echo "deployed $1 from $(dirname "$0")"; echo "on stderr" >&2 ;;
esac
`

// syncBuffer is a bytes.Buffer safe for the transport's writers and a
// test's reads at once.
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

// overSSH is the ssh transport to one server, s1, a real sshd on loopback.
func overSSH(t *testing.T) (rollout.SSH, *sshd.Server, *syncBuffer, *syncBuffer) {
	t.Helper()
	needs.Have(t, needs.SSHD)
	d, err := sshd.Start(t.TempDir(), time.Minute)
	require.NoError(t, err)
	t.Cleanup(d.Stop)
	root := t.TempDir()
	config, err := d.WriteClientConfig(t.TempDir(), d.KnownHosts(), "", sshd.Host{Name: "s1", Root: root, Project: "p", Bind: "127.0.0.1"})
	require.NoError(t, err)
	hooks := t.TempDir()
	for _, f := range rollout.ReleaseFiles {
		body, mode := "# "+f+"\n", os.FileMode(0o644)
		if f == "remote-deploy" {
			body, mode = remoteStub, 0o755
		}
		require.NoError(t, os.WriteFile(filepath.Join(hooks, f), []byte(body), mode))
	}
	var out, errOut syncBuffer
	s := rollout.SSH{HooksDir: hooks, Version: "v2", Config: config, RemoteReleases: filepath.Join(root, "incoming"),
		AppPort: 8080, ImagePrefix: "mythex", Timing: infra.Prod(), Stdout: &out, Stderr: &errOut}
	return s, d, &out, &errOut
}

func TestSSHShipsTheReleaseAndRunsRemoteDeploy(t *testing.T) {
	s, _, out, errOut := overSSH(t)
	ctx := context.Background()
	st, err := s.Status(ctx, "s1")
	require.NoError(t, err, "stderr: %s", errOut)
	assert.Equal(t, rollout.Status{Release: "v1", Previous: "v0", Verified: true}, st)
	assert.Contains(t, errOut.String(), "[s1] checking")

	require.NoError(t, s.Deploy(ctx, "s1", "v2"), "stderr: %s", errOut)
	assert.Contains(t, out.String(), "[s1] deployed v2 from "+filepath.Join(s.RemoteReleases, "v2"))
	assert.Contains(t, errOut.String(), "[s1] on stderr")
	for _, f := range rollout.ReleaseFiles {
		fi, err := os.Stat(filepath.Join(s.RemoteReleases, "v2", f))
		require.NoError(t, err, f)
		assert.Zero(t, fi.Mode().Perm()&0o022, "%s: no group or other write", f)
	}
	require.NoError(t, s.Rollback(ctx, "s1", "v1"))
	assert.Contains(t, out.String(), "[s1] rolled back to v1")

	st, err = s.Attach(ctx, "s1", "v2")
	require.NoError(t, err, "stderr: %s", errOut)
	assert.Equal(t, rollout.Status{Release: "v2", Previous: "v1", Verified: true, Last: "2026-12-07T04:00:00Z v2: deployed and verified"}, st)
	assert.Contains(t, errOut.String(), "[s1] waited")
}

// Finding 1: a bash deploy that slept 20 s under a 2 s bound ended after
// 20.9 s. Here a remote call ends at its context's deadline.
func TestSSHCallEndsAtItsBound(t *testing.T) {
	s, _, out, _ := overSSH(t)
	bound := 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	err := s.Deploy(ctx, "s1", "hang")
	took := time.Since(start)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no end within its bound")
	assert.Contains(t, out.String(), "[s1] started")
	// The bound, and the second the transport gives ssh to go after it.
	assert.Less(t, took, bound+5*time.Second)
}

// A dropped connection is ssh's own failure, told apart from the remote
// command's.
func TestSSHDropIsSSHsFailure(t *testing.T) {
	s, d, out, _ := overSSH(t)
	done := make(chan error, 1)
	go func() { done <- s.Deploy(context.Background(), "s1", "hang") }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "[s1] started") }, time.Minute, 10*time.Millisecond)
	d.Relay.Cut()
	select {
	case err := <-done:
		require.ErrorIs(t, err, rollout.ErrSSH)
	case <-time.After(time.Minute):
		t.Fatal("the transport did not end after its connection dropped")
	}
}

// stallProxy forwards loopback connections to target until Stall, after
// which it passes nothing either way and closes nothing: a network path
// that went silent, which only keep-alives notice.
type stallProxy struct {
	port    int
	stalled chan struct{}
	once    sync.Once
}

func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{port: l.Addr().(*net.TCPAddr).Port, stalled: make(chan struct{})}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-p.stalled:
				return // drop it, close nothing
			default:
			}
			if err != nil {
				_ = dst.Close()
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
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
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	return p
}

func (p *stallProxy) Stall() { p.once.Do(func() { close(p.stalled) }) }

// Finding 1: a stalled ssh connection held the bash rollout until the
// job's timeout. Here ssh's keep-alives, paced by the contract, end it
// long before the call's own bound.
func TestSSHStalledConnectionEndsByKeepAlives(t *testing.T) {
	s, d, out, _ := overSSH(t)
	// The contract's keep-alive pace, quickened for the test: the
	// balancer's check interval is what it derives from.
	s.Timing.HealthCheckInterval = time.Second
	proxy := startStallProxy(t, "127.0.0.1:"+strconv.Itoa(d.Relay.Port))
	b, err := os.ReadFile(s.Config)
	require.NoError(t, err)
	cfg := strings.ReplaceAll(string(b), "Port "+strconv.Itoa(d.Relay.Port), "Port "+strconv.Itoa(proxy.port))
	require.NoError(t, os.WriteFile(s.Config, []byte(cfg), 0o600))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Deploy(ctx, "s1", "hang") }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "[s1] started") }, time.Minute, 10*time.Millisecond)
	proxy.Stall()
	stalled := time.Now()
	// ssh gives up after ServerAliveCountMax unanswered keep-alives, one
	// per ServerAliveInterval; twice that leaves a busy machine room.
	patience := time.Duration(s.Timing.SSHAliveCountMax()+1) * s.Timing.SSHAliveInterval()
	select {
	case err := <-done:
		require.ErrorIs(t, err, rollout.ErrSSH)
		assert.Less(t, time.Since(stalled), 2*patience+5*time.Second)
	case <-time.After(time.Minute):
		t.Fatal("a stalled connection held the call past its keep-alives")
	}
}
