package drain_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

// childEnv, when set, makes the test binary a service that serves the way
// the usual Go idiom has it: Run with a context from signal.NotifyContext.
// Signals are process-wide, so they are sent to a child, never to the test
// process that runs the other tests.
const childEnv = "MYTHEX_DRAIN_TEST_CHILD"

// childScale is the child's timing: a drain short enough to wait out.
const childScale = 0.1

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if err := waitBoundParallel(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// testParallel is how many of this package's tests run at once unless
// -test.parallel says otherwise. Its tests wait out real drains (seconds
// each, 80 s in all) and spend almost no CPU meanwhile: go test's default of
// one per CPU ran them two at a time on a 2-core machine, 40 s of the
// everyday gate's 60.
const testParallel = 32

// waitBoundParallel sets -test.parallel to testParallel, unless given.
func waitBoundParallel() error {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if explicit {
		return nil
	}
	if err := flag.Set("test.parallel", strconv.Itoa(testParallel)); err != nil {
		return fmt.Errorf("set -test.parallel: %w", err)
	}
	return nil
}

// childSignalFirst is the child's mode in which its SIGTERM has ended the
// NotifyContext before Run starts listening: the one order of a signal's
// two deliveries a test can force (os/signal picks the order otherwise).
const childSignalFirst = "signal-first"

// childProdDrain is the child's mode with the production drain, for a test
// that ends the drain with a second signal: it lands inside the drain
// however late, and the drain is never waited out.
const childProdDrain = "prod-drain"

func runChild() int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if os.Getenv(childEnv) == childSignalFirst {
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		<-ctx.Done()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	timing := infra.Prod().Scaled(childScale)
	if os.Getenv(childEnv) == childProdDrain {
		timing.Drain = infra.Prod().Drain
		timing.MaxDrain = infra.Prod().MaxDrain
	}
	srv, err := drain.New(timing.DrainConfig(), routes(newGate()), drain.WithLogger(log))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := srv.Run(ctx, ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child is the test binary running as a service, with its log as it comes.
type child struct {
	cmd  *exec.Cmd
	recs chan map[string]any
	seen []map[string]any
}

func startChild(t *testing.T, mode string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, recs: make(chan map[string]any, 64)}
	go func() {
		defer close(c.recs)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			rec := map[string]any{}
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				rec = map[string]any{"msg": "unparsed", "line": sc.Text()}
			}
			c.recs <- rec
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if mode != childSignalFirst {
		c.waitLog(t, "serving")
	}
	return c
}

func (c *child) waitLog(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case rec, ok := <-c.recs:
			require.True(t, ok, "child exited before logging %q; log: %v", msg, c.seen)
			c.seen = append(c.seen, rec)
			if rec["msg"] == msg {
				return rec
			}
		case <-deadline:
			require.FailNow(t, "timed out waiting for log", "%q; log so far: %v", msg, c.seen)
		}
	}
}

// One SIGTERM reaches Run twice when its context comes from
// signal.NotifyContext: once as the signal, once as the context ending. It
// is still one stop request, and the drain runs its whole course; a second
// SIGTERM is still "I mean it". Whichever of the two deliveries Run sees
// first, the drain is named after the signal: the last case forces the
// context's.
func TestOneSIGTERMThroughNotifyContextIsOneStopRequest(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(childScale)
	tests := []struct {
		name       string
		mode       string
		sigterms   int
		wantReason string
	}{
		{"one SIGTERM drains in full", "1", 1, drain.ReasonDrainElapsed},
		{"a second SIGTERM skips the drain", childProdDrain, 2, "second stop request: SIGTERM"},
		{"a SIGTERM that ended the context before Run listened drains in full", childSignalFirst, 1, drain.ReasonDrainElapsed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := startChild(t, tt.mode)
			if tt.mode != childSignalFirst {
				require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
			}
			draining := c.waitLog(t, "phase draining")
			assert.Equal(t, "SIGTERM", draining["reason"], "log: %v", c.seen)
			if tt.sigterms == 2 {
				require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
			}
			closing := c.waitLog(t, "phase shutting-down")
			assert.Equal(t, tt.wantReason, closing["reason"], "log: %v", c.seen)
			lasted, err := time.ParseDuration(closing["lasted"].(string))
			require.NoError(t, err)
			if tt.sigterms == 1 {
				assert.GreaterOrEqual(t, lasted, timing.Drain, "the drain was cut short: 502s on every deploy")
			}
			c.waitLog(t, "phase stopped")
			require.NoError(t, c.cmd.Wait(), "a drained service exits 0")
		})
	}
}
