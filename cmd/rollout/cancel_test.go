package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
  --status) echo "release=$(cat "$MYTHEX_ROOT/release" 2>/dev/null || echo v1) previous= verified=yes" ;;
  --rollback) echo "$2" >"$MYTHEX_ROOT/release" ;;
  *) touch "$MYTHEX_ROOT/started"; echo "deploying $1"
     # A minute at most: a failed test leaves no server waiting for ever.
     for ((i = 0; i < 1200; i++)); do [[ -e "$MYTHEX_ROOT/go-on" ]] && break; sleep 0.05; done
     echo "$1" >"$MYTHEX_ROOT/release"; touch "$MYTHEX_ROOT/finished" ;;
esac
`

// binDir holds the command, built once for the package's tests.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// built builds the command once; tests run it as CI does.
var built = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "rollout-bin")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "rollout")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w: %s", err, out)
	}
	return bin, nil
})

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

// fleetOverSSH starts a real sshd for servers s1 and s2, each with its own
// root, a describe-target-health stand-in that finds them healthy, and the
// command built; it returns the command for args, the servers' roots and
// the stand-in.
func fleetOverSSH(t *testing.T, args ...string) (*exec.Cmd, map[string]string, *targethealth.Server) {
	t.Helper()
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

	bin, err := built()
	require.NoError(t, err)

	cmd := exec.Command(bin, "-hooks", hooks, "-ssh-config", config, "-remote-releases", filepath.Join(t.TempDir(), "incoming"),
		"-remote-sudo", "", "-port", "8080", "-target-group-arn", "arn:aws:elasticloadbalancing:eu-west-1:1:targetgroup/tg/1",
		"-elb-endpoint", th.URL)
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = append(os.Environ(), "AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	return cmd, roots, th
}

// Finding 4: the bash rollout never saw the runner's cancel and went on to
// deploy the next server. The command, sent SIGINT as the runner sends it
// while the canary deploys, starts nothing new, prints its table at once,
// exits 130, and the canary's deploy runs on to its end on the server.
func TestSIGINTStartsNothingNewAndLeavesTheDeployToFinish(t *testing.T) {
	cmd, roots, _ := fleetOverSSH(t, "v2", "s1", "s2")
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	started := filepath.Join(roots["s1"], "started")
	require.Eventually(t, func() bool { _, err := os.Stat(started); return err == nil }, time.Minute, 10*time.Millisecond,
		"the canary never started; stdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err := cmd.Wait()
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

// A sound rollout through the command: ssh to each server, the SDK's
// DescribeTargetHealth to the stand-in, the table and the -json report.
func TestSoundRolloutOverSSH(t *testing.T) {
	report := filepath.Join(t.TempDir(), "report.json")
	cmd, roots, th := fleetOverSSH(t, "-json", report, "v2", "s1", "s2")
	for _, root := range roots {
		require.NoError(t, os.WriteFile(filepath.Join(root, "go-on"), nil, 0o644))
	}
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	assert.Regexp(t, `s1\s+v1\s+v2\s+yes\s+deploy: verified and back in service`, stdout.String())
	assert.Regexp(t, `s2\s+v1\s+v2\s+yes\s+deploy: verified and back in service`, stdout.String())
	b, err := os.ReadFile(report)
	require.NoError(t, err)
	var rep rollout.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	assert.Equal(t, rollout.Deployed, rep.Outcome)
	assert.Len(t, rep.Servers, 2)
	var ids []string
	for _, c := range th.Calls() {
		assert.Equal(t, 8080, c.Port)
		ids = append(ids, c.ID)
	}
	assert.ElementsMatch(t, []string{"s1", "s2"}, ids, "one DescribeTargetHealth per server, each healthy at once")
}
