package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/rollout"
)

// sshStub stands in for ssh, so the command runs with no server: "fail"
// is ssh's own failure at once; "hang" says it started (a line to a FIFO)
// and waits to be killed by the call's context.
const sshStub = `#!/bin/sh
case "$ROLLOUT_TEST_SSH" in
  fail) echo "ssh: connect to host: Connection refused" >&2; exit 255 ;;
  *) echo started >"$ROLLOUT_TEST_SSH_STARTED"; exec sleep 60 ;;
esac
`

// offline sets the command up to run with ssh stubbed (mode: fail or
// hang) and AWS's configuration from the environment alone; it returns
// the arguments of a rollout of v2 to s1 and s2, and the channel that
// ends when the stub has started.
func offline(t *testing.T, mode string) ([]string, <-chan struct{}) {
	t.Helper()
	hooks := t.TempDir()
	for _, f := range rollout.ReleaseFiles {
		require.NoError(t, os.WriteFile(filepath.Join(hooks, f), []byte("# "+f+"\n"), 0o755))
	}
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "ssh"), []byte(sshStub), 0o755))
	fifo := filepath.Join(t.TempDir(), "started")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	// Read and write: opening never waits for the stub, and closing ends
	// the read if no stub ever writes.
	f, err := os.OpenFile(fifo, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	started := make(chan struct{})
	go func() {
		if _, err := f.Read(make([]byte, 1)); err == nil {
			close(started)
		}
	}()
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("ROLLOUT_TEST_SSH", mode)
	t.Setenv("ROLLOUT_TEST_SSH_STARTED", fifo)
	for k, v := range map[string]string{"AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"} {
		t.Setenv(k, v)
	}
	return []string{"-hooks", hooks, "-port", "8080", "-target-group-arn", "arn:aws:elasticloadbalancing:eu-west-1:1:targetgroup/tg/1",
		"-max-unavailable", "1", "v2", "s1", "s2"}, started
}

// A cancelled rollout exits 128+N for the signal that cancelled it,
// however soon after the cancel it ends: the signal is recorded before the
// context is cancelled (as cancelOnSignal does), and the exit status reads
// that record. The worst case is a context cancelled before the rollout
// starts: with the signal read from a second channel the runtime had not
// fed yet, it exited 1.
func TestExitStatusNamesTheSignalThatCancelled(t *testing.T) {
	const (
		never  = "never"
		before = "before the rollout starts"
		during = "while the servers are asked what they run"
	)
	for _, tc := range []struct {
		name   string
		sig    syscall.Signal // 0: none
		cancel string
		want   int
	}{
		{"SIGINT, " + before, syscall.SIGINT, before, 130},
		{"SIGTERM, " + before, syscall.SIGTERM, before, 143},
		{"SIGINT, " + during, syscall.SIGINT, during, 130},
		{"SIGTERM, " + during, syscall.SIGTERM, during, 143},
		{"no signal, cancelled " + before, 0, before, 1},
		{"no signal, cancelled " + during, 0, during, 1},
		{"no signal, a plain failure", 0, never, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode := "hang"
			if tc.cancel == never {
				mode = "fail"
			}
			args, started := offline(t, mode)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stoppedBy := &stopSignal{}
			// What the signal's handler does: the record first, then the cancel.
			stop := func() {
				if tc.sig != 0 {
					stoppedBy.set(tc.sig)
				}
				cancel()
			}
			if tc.cancel == before {
				stop()
			}
			if tc.cancel == during {
				go func() {
					select {
					case <-started:
						stop()
					case <-ctx.Done():
					}
				}()
			}
			var out, errOut bytes.Buffer
			code := run(ctx, args, &out, &errOut, stoppedBy)
			assert.Equal(t, tc.want, code, "stdout:\n%s\nstderr:\n%s", &out, &errOut)
			if tc.sig != 0 {
				assert.Contains(t, errOut.String(), "rollout: stopped by "+tc.sig.String())
			} else {
				assert.NotContains(t, errOut.String(), "stopped by")
			}
			if tc.cancel == during {
				select {
				case <-started:
				default:
					t.Error("the rollout ended before ssh started: the cancel was not during it")
				}
			}
		})
	}
}

// The handler main installs records the signal before it cancels: each
// of many real signals to this process is found in the record the moment
// the context ends. The order reversed (cancel, then record) fails here in
// most runs.
func TestTheSignalIsRecordedBeforeTheCancel(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		for i := range 2000 {
			ctx, stoppedBy, stop := cancelOnSignal(context.Background(), os.Interrupt, syscall.SIGTERM)
			require.NoError(t, syscall.Kill(os.Getpid(), sig))
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				stop()
				t.Fatalf("%v: no cancel 10s after the signal", sig)
			}
			got, ok := stoppedBy.get()
			stop()
			require.True(t, ok, "%v, signal %d: the context ended with no signal recorded", sig, i)
			require.Equal(t, sig, got, "signal %d", i)
		}
	}
}
