package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks/sshd"
	"github.com/mythex/infra/hooks/targethealth"
	"github.com/mythex/infra/internal/needs"
	"github.com/mythex/infra/rollout"
)

// remoteStub stands in for remote-deploy on each server, behind a real
// sshd: a deploy notes its start, waits until the test lets it go on (the
// file go-on), and notes its end.
const remoteStub = `#!/usr/bin/env bash
case "$1" in
  --status) echo "release=v1 previous= verified=yes" ;;
  --rollback) echo "rolled back to $2" ;;
  *) touch "$MYTHEX_ROOT/started"; echo "deploying $1"
     # A minute at most: a failed test leaves no server waiting for ever.
     for ((i = 0; i < 1200; i++)); do [[ -e "$MYTHEX_ROOT/go-on" ]] && break; sleep 0.05; done
     touch "$MYTHEX_ROOT/finished" ;;
esac
`

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Finding 4: the bash rollout never saw the runner's cancel and went on to
// deploy the next server. The command, sent SIGINT as the runner sends it
// while the canary deploys, starts nothing new, prints its table at once,
// exits 130, and the canary's deploy runs on to its end on the server.
func TestSIGINTStartsNothingNewAndLeavesTheDeployToFinish(t *testing.T) {
	needs.Have(t, needs.SSHD)
	d, err := sshd.Start(t.TempDir(), time.Minute)
	require.NoError(t, err)
	t.Cleanup(d.Stop)
	roots := map[string]string{"s1": t.TempDir(), "s2": t.TempDir()}
	var hosts []sshd.Host
	for _, name := range []string{"s1", "s2"} {
		hosts = append(hosts, sshd.Host{Name: name, Root: roots[name], Project: name, Bind: "127.0.0.1"})
	}
	config, err := d.WriteClientConfig(t.TempDir(), d.KnownHosts(), "", hosts...)
	require.NoError(t, err)
	hooks := t.TempDir()
	for _, f := range rollout.ReleaseFiles {
		body, mode := "# "+f+"\n", os.FileMode(0o644)
		if f == "remote-deploy" {
			body, mode = remoteStub, 0o755
		}
		require.NoError(t, os.WriteFile(filepath.Join(hooks, f), []byte(body), mode))
	}
	th, err := targethealth.Start(func(targethealth.Call) (targethealth.Health, error) {
		return targethealth.Health{State: targethealth.Healthy}, nil
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = th.Close() })

	bin := filepath.Join(t.TempDir(), "rollout")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	cmd := exec.Command(bin, "-hooks", hooks, "-ssh-config", config, "-remote-releases", filepath.Join(t.TempDir(), "incoming"),
		"-remote-sudo", "", "-port", "8080", "-target-group-arn", "arn:aws:elasticloadbalancing:eu-west-1:1:targetgroup/tg/1",
		"-elb-endpoint", th.URL, "v2", "s1", "s2")
	cmd.Env = append(os.Environ(), "AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	started := filepath.Join(roots["s1"], "started")
	require.Eventually(t, func() bool { _, err := os.Stat(started); return err == nil }, time.Minute, 10*time.Millisecond,
		"the canary never started; stdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err = cmd.Wait()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exit: %v", err)
	assert.Equal(t, 130, ee.ExitCode(), "stderr:\n%s", &stderr)
	assert.Regexp(t, `s1\s+v1\s+\S+\s+\S+\s+deploy in flight when cancelled: it runs on to its end on the server`, stdout.String())
	assert.Regexp(t, `s2\s+v1\s+\S+\s+\S+\s+not started \(cancelled\)`, stdout.String())
	assert.Contains(t, stderr.String(), "stopped by interrupt")

	// The deploy in flight, held until the rollout has ended, runs on to
	// its end; nothing new started.
	require.NoError(t, os.WriteFile(filepath.Join(roots["s1"], "go-on"), nil, 0o644))
	require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(roots["s1"], "finished")); return err == nil },
		time.Minute, 10*time.Millisecond, "the canary's deploy was cut")
	_, err = os.Stat(filepath.Join(roots["s2"], "started"))
	assert.True(t, os.IsNotExist(err), "s2 was deployed after the cancel")
}
