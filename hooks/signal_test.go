package hooks

import (
	"bytes"
	"os"
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

// watchWriter collects what is written and closes seen once want has
// appeared in it.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(w.buf.String(), w.want)
	n, err := w.buf.Write(p)
	if !had && strings.Contains(w.buf.String(), w.want) {
		close(w.seen)
	}
	return n, err
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// childRunning reports whether a process named comm is a child of pid.
func childRunning(pid int, comm string) bool {
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(s[close+1:])
		if len(f) < 2 || s[open+1:close] != comm {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil && ppid == pid {
			return true
		}
	}
	return false
}

// A signal that reaches deploy while bash is reading a command
// substitution's text ran the trap inside bash 5.2's parser, which then
// failed ("unexpected EOF while looking for matching `)'") and ended the
// deploy with status 2, its message lost in whatever stderr was redirected
// to at that moment: after COMMITTED, a half-replaced server with no word
// of why. Here deploy waits for the lock, is sent SIGTERM without pause
// from then until it says it stopped, and must end the way one SIGTERM
// ends it before any step: status 1, saying so, every time. (The storm
// ends there: bash restores the default dispositions as it exits, and a
// signal in that last instant ends the process as SIGTERM does.)
func TestDeployStopsCleanlyUnderASignalStorm(t *testing.T) {
	const stormGap = 200 * time.Microsecond
	const runs = 20
	s := newServer(t, infra.Prod().Scaled(0.2))
	for i := range runs {
		release := holdLock(t, s)
		cmd := s.Command(t.Context(), "deploy", "v1")
		var stdout bytes.Buffer
		stderr := &watchWriter{want: "stopped by SIGTERM", seen: make(chan struct{})}
		cmd.Stdout, cmd.Stderr = &stdout, stderr
		require.NoError(t, cmd.Start())
		pid := cmd.Process.Pid
		// The traps are set before the lock is taken: a deploy blocked
		// in flock has them.
		deadline := time.Now().Add(10 * time.Second)
		for !childRunning(pid, "flock") {
			require.True(t, time.Now().Before(deadline), "run %d: deploy never waited for the lock\n%s", i, stderr.String())
			time.Sleep(time.Millisecond)
		}
		done := make(chan struct{})
		sent := make(chan int)
		// firstSent closes once a signal reached the deploy in flock: it
		// sees that one as it takes the lock, however late this goroutine
		// runs.
		firstSent := make(chan struct{})
		go func() {
			n := 0
			for {
				select {
				case <-done:
					sent <- n
					return
				case <-stderr.seen:
					sent <- n
					return
				default:
				}
				if cmd.Process.Signal(syscall.SIGTERM) == nil {
					n++
					if n == 1 {
						close(firstSent)
					}
				}
				// Not faster: signals that come quicker than bash runs
				// its trap nest the trap runs until bash itself crashes.
				time.Sleep(stormGap)
			}
		}()
		<-firstSent
		release()
		_ = cmd.Wait()
		close(done)
		n := <-sent
		require.Positive(t, n, "run %d: no signal reached the deploy", i)
		res := result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
		require.Equal(t, 1, res.code, "run %d, %d signals: %s (%v)", i, n, res, cmd.ProcessState)
		assert.Contains(t, res.stderr, "stopped by SIGTERM before step stage: nothing was changed", "run %d", i)
		assert.NotContains(t, res.stderr, "unexpected EOF", "run %d", i)
		assert.Contains(t, string(mustRead(t, filepath.Join(s.Root, "state", "last-deploy"))),
			"v1: stopped by SIGTERM before changing anything", "run %d", i)
	}
}

// Deploy, bootstrap and the watchdog trap signals, and they and lib.sh
// must never make bash parse a command's text while a trap may run (see
// the storm test above): no $(...), <(...) or >(...) outside comments.
// Arithmetic $((...)) is not parsed as a command.
func TestNoDollarParen(t *testing.T) {
	for _, name := range []string{"deploy", "lib.sh", "bootstrap", "watchdog"} {
		for i, line := range strings.Split(string(mustRead(t, name)), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			rest := strings.ReplaceAll(line, "$((", "")
			for _, bad := range []string{"$(", "<(", ">("} {
				assert.NotContains(t, rest, bad, "%s:%d: %s", name, i+1, line)
			}
		}
	}
}
