package hooks

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// fleet is a set of stand-in servers for the rollout: its deploy command
// keeps each server's release in a file and answers remote-deploy's three
// calls (VERSION, --status, --rollback VERSION) from it, recording every
// call, when each deploy or rollback starts and ends, and failing where the
// test says. The rollout script is the real one; the servers are not (the
// Docker and ssh tests run real ones).
type fleet struct {
	dir     string
	servers []string
	env     []string
}

// fleetScript is the stand-in deploy command. Settings, from the
// environment: FLEET_FAIL servers whose deploy fails; FLEET_FAIL_ROLLBACK
// servers whose rollback fails; FLEET_UNREADABLE servers whose --status
// answers nonsense; FLEET_DOWN servers whose --status fails; FLEET_TOGETHER
// groups of servers that must deploy at once (below). A deploy of
// SERVER waits while the file hold.SERVER exists beside the script: the
// tests' phase barrier.
const fleetScript = `#!/usr/bin/env bash
set -euo pipefail
dir="$(dirname "$0")"
server="$1"
shift
has() { [[ " ${1:-} " == *" $server "* ]]; }
echo "$server $*" >>"$dir/calls"
case "$1" in
  --status)
    has "${FLEET_DOWN:-}" && { echo "ssh: connect to host $server: Connection refused" >&2; exit 255; }
    has "${FLEET_UNREADABLE:-}" && { echo "hello"; exit 0; }
    echo "checking $server" >&2
    echo "release=$(cat "$dir/$server.release" 2>/dev/null || true) previous= verified=$(cat "$dir/$server.verified" 2>/dev/null || echo yes)"
    ;;
  --rollback)
    echo "start $server" >>"$dir/events"
    echo "rolling back to $2"
    sleep 0.05
    echo "end $server" >>"$dir/events"
    has "${FLEET_FAIL_ROLLBACK:-}" && { echo "rollback broke" >&2; exit 1; }
    echo "$2" >"$dir/$server.release"
    echo yes >"$dir/$server.verified"
    ;;
  *)
    echo "start $server" >>"$dir/events"
    while [[ -e "$dir/hold.$server" ]]; do sleep 0.02; done
    # FLEET_TOGETHER: groups of servers ("s2,s3 s4,s5") that must deploy
    # at once: each waits until its whole group has started, so a batch's
    # overlap shows however busy the machine is. A group that never gathers
    # (a rollout that does not batch) fails its deploys, after a wait no
    # scheduling delay comes near.
    for group in ${FLEET_TOGETHER:-}; do
      [[ ",$group," == *",$server,"* ]] || continue
      for (( i = 0; ; i++ )); do
        gathered=yes
        for member in ${group//,/ }; do
          grep -qx "start $member" "$dir/events" || gathered=no
        done
        [[ "$gathered" == yes ]] && break
        (( i < 1500 )) || { echo "$server: $group never deployed at once" >&2; exit 1; }
        sleep 0.02
      done
    done
    sleep 0.05
    echo "end $server" >>"$dir/events"
    has "${FLEET_FAIL:-}" && { echo "compose up failed" >&2; echo "$1" >"$dir/$server.release"; echo no >"$dir/$server.verified"; exit 1; }
    echo "$1" >"$dir/$server.release"
    echo yes >"$dir/$server.verified"
    echo "deployed $1"
    ;;
esac
`

// newFleet makes n stand-in servers s1..sn, each on release (none when "").
func newFleet(t *testing.T, n int, release string) *fleet {
	t.Helper()
	requireServerTools(t)
	f := &fleet{dir: t.TempDir()}
	cmd := filepath.Join(f.dir, "deploy")
	require.NoError(t, os.WriteFile(cmd, []byte(fleetScript), 0o755))
	for i := 1; i <= n; i++ {
		s := fmt.Sprintf("s%d", i)
		f.servers = append(f.servers, s)
		if release != "" {
			require.NoError(t, os.WriteFile(filepath.Join(f.dir, s+".release"), []byte(release+"\n"), 0o644))
		}
	}
	wait := filepath.Join(f.dir, "wait")
	require.NoError(t, os.WriteFile(wait, []byte("#!/usr/bin/env bash\necho \"$1 wait\" >>\""+f.dir+"/calls\"\n[[ \" ${FLEET_NEVER_BACK:-} \" != *\" $1 \"* ]]\n"), 0o755))
	f.env = append(environWithout("MYTHEX_"), "MYTHEX_DEPLOY_CMD="+cmd, "MYTHEX_WAIT_IN_SERVICE="+wait)
	return f
}

// release is what s runs now.
func (f *fleet) release(t *testing.T, s string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, s+".release"))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// calls are the deploy command's calls other than --status, in order.
func (f *fleet) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, "calls"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, l := range lines(string(b)) {
		if !strings.HasSuffix(l, " --status") {
			out = append(out, l)
		}
	}
	return out
}

// mostAtOnce is the most deploys and rollbacks that ran at the same time.
func (f *fleet) mostAtOnce(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, "events"))
	require.NoError(t, err)
	now, most := 0, 0
	for _, l := range lines(string(b)) {
		if strings.HasPrefix(l, "start ") {
			now++
		} else {
			now--
		}
		most = max(most, now)
	}
	return most
}

// run runs the rollout with args and extra environment.
func (f *fleet) run(t *testing.T, extra []string, args ...string) result {
	t.Helper()
	cmd := exec.Command("./rollout", args...)
	cmd.Env = append(slices.Clone(f.env), extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// row is the final table's line for server s, its fields split on runs of
// two or more spaces.
func row(t *testing.T, stdout, s string) []string {
	t.Helper()
	for _, l := range lines(stdout) {
		if strings.HasPrefix(l, s+" ") {
			var fields []string
			for _, f := range strings.Split(l, "  ") {
				if f = strings.TrimSpace(f); f != "" {
					fields = append(fields, f)
				}
			}
			return fields
		}
	}
	require.Failf(t, "no table row", "for %s in:\n%s", s, stdout)
	return nil
}

func TestRolloutBatches(t *testing.T) {
	// Stand-in servers only: no Docker, nothing shared.
	t.Parallel()
	tests := []struct {
		name    string
		servers int
		flags   []string
		env     []string
		code    int
		// calls, phase by phase: the calls of one phase come in any order
		// (a batch's servers run at once).
		calls  [][]string
		most   int
		rows   map[string][]string
		stderr []string
	}{
		{"one at a time by default", 3, nil, nil, 0,
			[][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2"}, {"s2 wait"}, {"s3 v2"}, {"s3 wait"}}, 1,
			map[string][]string{"s3": {"s3", "v1", "v2", "yes", "deployed"}}, nil},
		{"a canary, then two at once", 6, []string{"--max-unavailable", "2"}, []string{"FLEET_TOGETHER=s2,s3 s4,s5"}, 0,
			[][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2", "s3 v2", "s2 wait", "s3 wait"}, {"s4 v2", "s5 v2", "s4 wait", "s5 wait"}, {"s6 v2"}, {"s6 wait"}}, 2,
			nil, nil},
		{"a percentage rounds down", 6, []string{"--max-unavailable", "50%"}, []string{"FLEET_TOGETHER=s2,s3,s4 s5,s6"}, 0, nil, 3, nil, nil},
		{"a small percentage is one server", 3, []string{"--max-unavailable=10%"}, nil, 0, nil, 1, nil, nil},
		{"the canary fails: it alone goes back", 4, []string{"--max-unavailable", "2"}, []string{"FLEET_FAIL=s1"}, 1,
			[][]string{{"s1 v2"}, {"s1 --rollback v1"}, {"s1 wait"}}, 1,
			map[string][]string{
				"s1": {"s1", "v1", "v1", "yes", "FAILED (deploy exit 1); rolled back"},
				"s2": {"s2", "v1", "v1", "yes", "not started"},
			},
			[]string{"deploy of v2 to s1 FAILED (exit 1)"}},
		{"a later batch fails: every touched server goes back, in reverse", 5, []string{"--max-unavailable", "2"},
			[]string{"FLEET_FAIL=s4", "FLEET_TOGETHER=s2,s3 s4,s5"}, 1,
			[][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2", "s3 v2", "s2 wait", "s3 wait"}, {"s4 v2", "s5 v2", "s5 wait"},
				{"s5 --rollback v1", "s4 --rollback v1", "s5 wait", "s4 wait"},
				{"s3 --rollback v1", "s2 --rollback v1", "s3 wait", "s2 wait"},
				{"s1 --rollback v1"}, {"s1 wait"}}, 2,
			map[string][]string{
				"s1": {"s1", "v1", "v1", "yes", "deployed; rolled back"},
				"s4": {"s4", "v1", "v1", "yes", "FAILED (deploy exit 1); rolled back"},
			},
			[]string{"deploy of v2 to s4 FAILED (exit 1)"}},
		{"a server never back in service fails like a failed deploy", 3, nil, []string{"FLEET_NEVER_BACK=s2"}, 1,
			[][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2"}, {"s2 wait"}, {"s2 --rollback v1"}, {"s2 wait"}, {"s1 --rollback v1"}, {"s1 wait"}}, 1,
			map[string][]string{
				"s2": {"s2", "v1", "v1", "yes", "FAILED (not back in service, exit 1); rollback FAILED (not back in service, exit 1)"},
				"s3": {"s3", "v1", "v1", "yes", "not started"},
			},
			[]string{"s2 did not come back into service (exit 1)"}},
		{"--no-rollback stops where it failed", 3, []string{"--no-rollback"}, []string{"FLEET_FAIL=s2"}, 1,
			[][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2"}}, 1,
			map[string][]string{
				"s1": {"s1", "v1", "v2", "yes", "deployed"},
				"s2": {"s2", "v1", "v2", "no", "FAILED (deploy exit 1)"},
				"s3": {"s3", "v1", "v1", "yes", "not started"},
			},
			[]string{"--no-rollback: leaving every server where it is"}},
		{"a failed rollback is reported, and the others still go back", 3, nil,
			[]string{"FLEET_FAIL=s3", "FLEET_FAIL_ROLLBACK=s2"}, 1,
			[][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2"}, {"s2 wait"}, {"s3 v2"}, {"s3 --rollback v1"}, {"s3 wait"},
				{"s2 --rollback v1"}, {"s1 --rollback v1"}, {"s1 wait"}}, 1,
			map[string][]string{
				"s2": {"s2", "v1", "v2", "yes", "deployed; rollback FAILED (rollback exit 1)"},
				"s1": {"s1", "v1", "v1", "yes", "deployed; rolled back"},
			},
			[]string{"rollback to v1 of s2 FAILED (exit 1)"}},
		{"a server that cannot say what it runs: nothing deployed", 3, nil, []string{"FLEET_DOWN=s2"}, 1,
			nil, 0,
			map[string][]string{"s2": {"s2", "?", "?", "unknown", "cannot tell what it runs"}, "s1": {"s1", "v1", "v1", "yes"}},
			[]string{"cannot tell what runs on: s2; nothing deployed"}},
		{"an answer that is not a status: nothing deployed", 3, nil, []string{"FLEET_UNREADABLE=s3"}, 1,
			nil, 0, nil,
			[]string{"s3 answered --status with something unreadable: hello", "nothing deployed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, tt.servers, "v1")
			res := f.run(t, tt.env, append(append(slices.Clone(tt.flags), "v2"), f.servers...)...)
			require.Equal(t, tt.code, res.code, "%s", res)
			if tt.calls != nil {
				assertPhases(t, tt.calls, f.calls(t))
			}
			if tt.most > 0 {
				assert.Equal(t, tt.most, f.mostAtOnce(t), "servers deployed at once")
			}
			for s, want := range tt.rows {
				got := row(t, res.stdout, s)
				assert.Equal(t, want, got[:min(len(want), len(got))], "%s's row:\n%s", s, res.stdout)
			}
			for _, w := range tt.stderr {
				assert.Contains(t, res.stderr, w)
			}
			if tt.code == 0 {
				for _, s := range f.servers {
					assert.Equal(t, "v2", f.release(t, s))
				}
				assert.Contains(t, res.stdout, fmt.Sprintf("deployed v2 to all %d server(s)", tt.servers))
			}
			if strings.Contains(tt.name, "nothing deployed") {
				assert.Empty(t, f.calls(t), "no server touched")
			}
		})
	}
}

// The canary is one server, and it is verified and back in service before
// any other starts; every later batch starts only when the one before is
// back.
func TestRolloutCanaryGoesFirst(t *testing.T) {
	// Stand-in servers only: no Docker, nothing shared.
	t.Parallel()
	f := newFleet(t, 5, "v1")
	res := f.run(t, nil, append([]string{"--max-unavailable", "2", "v2"}, f.servers...)...)
	require.Equal(t, 0, res.code, "%s", res)
	// The canary alone, then its wait; then batches of two, whose servers'
	// calls interleave as the machine schedules them.
	assertPhases(t, [][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2", "s3 v2", "s2 wait", "s3 wait"}, {"s4 v2", "s5 v2", "s4 wait", "s5 wait"}}, f.calls(t))
	assert.Contains(t, res.stdout, "deploying v2 to s1 (batch 1 of 3, the canary)")
	assert.Contains(t, res.stdout, "deploying v2 to s5 (batch 3 of 3)")
}

// Running the same rollout again converges: servers already on the release
// and verified are checked in service and skipped, not redeployed.
func TestRolloutSkipsServersAlreadyOnTheRelease(t *testing.T) {
	// Stand-in servers only: no Docker, nothing shared.
	t.Parallel()
	f := newFleet(t, 3, "v2")
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "s2.release"), []byte("v1\n"), 0o644))
	// s3 runs v2 but fails its verification: it is deployed again.
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "s3.verified"), []byte("no\n"), 0o644))
	res := f.run(t, nil, append([]string{"v2"}, f.servers...)...)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, []string{"s1 wait", "s2 v2", "s2 wait", "s3 v2", "s3 wait"}, f.calls(t))
	assert.Equal(t, []string{"s1", "v2", "v2", "yes", "skipped: already on v2"}, row(t, res.stdout, "s1"))

	// A skipped server the balancer does not have in service stops the
	// rollout before anything changes.
	f = newFleet(t, 3, "v2")
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "s3.release"), []byte("v1\n"), 0o644))
	res = f.run(t, []string{"FLEET_NEVER_BACK=s1"}, append([]string{"v2"}, f.servers...)...)
	require.Equal(t, 1, res.code, "%s", res)
	// The skipped servers are asked at once, in any order; nothing follows.
	assertPhases(t, [][]string{{"s1 wait", "s2 wait"}}, f.calls(t))
	assert.Contains(t, res.stderr, "deploying others now could take too many servers out")
}

// A server that ran nothing before has nothing to roll back to: the table
// says so and the others still go back.
func TestRolloutRollbackOfAFirstDeploy(t *testing.T) {
	// Stand-in servers only: no Docker, nothing shared.
	t.Parallel()
	f := newFleet(t, 2, "")
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "s1.release"), []byte("v1\n"), 0o644))
	res := f.run(t, []string{"FLEET_FAIL=s2"}, "v2", "s1", "s2")
	require.Equal(t, 1, res.code, "%s", res)
	assert.Equal(t, []string{"s2", "-", "v2", "no", "FAILED (deploy exit 1); no release to roll back to"}, row(t, res.stdout, "s2"))
	assert.Equal(t, []string{"s1", "v1", "v1", "yes", "deployed; rolled back"}, row(t, res.stdout, "s1"))
	assert.Contains(t, res.stderr, "s2 ran no release before this rollout: nothing to roll back to")
}

// SIGTERM mid-batch (a cancelled CI job): the batch in flight finishes,
// nothing new starts, the table is printed, and the rollout exits 143. No
// server is left without a release it runs and has verified; the same
// rollout run again converges, deploying only what the first did not.
func TestRolloutSIGTERMMidBatchThenRerunConverges(t *testing.T) {
	// Stand-in servers only: no Docker, nothing shared.
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sigName(sig), func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, 6, "v1")
			// Batch 2 (s2, s3) is held on the servers until the signal has
			// arrived.
			for _, s := range []string{"s2", "s3"} {
				require.NoError(t, os.WriteFile(filepath.Join(f.dir, "hold."+s), nil, 0o644))
			}
			cmd := exec.Command("./rollout", append([]string{"--max-unavailable", "2", "v2"}, f.servers...)...)
			cmd.Env = f.env
			stderr := &lockedBuffer{}
			cmd.Stderr = stderr
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			var stdout strings.Builder
			sc := bufio.NewScanner(out)
			signalled := false
			for sc.Scan() {
				stdout.WriteString(sc.Text() + "\n")
				if !signalled && strings.Contains(sc.Text(), "deploying v2 to s3 (batch 2") {
					waitForEvent(t, f, "start s3")
					waitForEvent(t, f, "start s2")
					require.NoError(t, cmd.Process.Signal(sig))
					require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "starting nothing new") },
						10*time.Second, 10*time.Millisecond, "the rollout took the signal")
					for _, s := range []string{"s2", "s3"} {
						require.NoError(t, os.Remove(filepath.Join(f.dir, "hold."+s)))
					}
					signalled = true
				}
			}
			_ = cmd.Wait()
			require.True(t, signalled, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.Equal(t, 128+int(sig), cmd.ProcessState.ExitCode(), "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			assertPhases(t, [][]string{{"s1 v2"}, {"s1 wait"}, {"s2 v2", "s3 v2", "s2 wait", "s3 wait"}}, f.calls(t))
			for _, s := range []string{"s2", "s3"} {
				assert.Equal(t, []string{s, "v1", "v2", "yes", "deployed"}, row(t, stdout.String(), s), "the batch in flight finished")
			}
			for _, s := range []string{"s4", "s5", "s6"} {
				assert.Equal(t, []string{s, "v1", "v1", "yes", "not started (" + sigName(sig) + ")"}, row(t, stdout.String(), s))
			}
			for _, s := range f.servers {
				assert.Contains(t, []string{"v1", "v2"}, f.release(t, s), "%s runs a release", s)
			}
			assert.Contains(t, stderr.String(), "run the same rollout again to go on")

			require.NoError(t, os.Remove(filepath.Join(f.dir, "calls")))
			res := f.run(t, nil, append([]string{"--max-unavailable", "2", "v2"}, f.servers...)...)
			require.Equal(t, 0, res.code, "%s", res)
			assertPhases(t, [][]string{{"s1 wait", "s2 wait", "s3 wait"}, {"s4 v2"}, {"s4 wait"}, {"s5 v2", "s6 v2", "s5 wait", "s6 wait"}}, f.calls(t))
			for _, s := range f.servers {
				assert.Equal(t, "v2", f.release(t, s))
			}
		})
	}
}

// assertPhases asserts calls are the phases' calls, phase after phase, in
// any order within a phase.
func assertPhases(t *testing.T, phases [][]string, calls []string) {
	t.Helper()
	for i, phase := range phases {
		if !assert.GreaterOrEqual(t, len(calls), len(phase), "phase %d %v: calls left %v", i, phase, calls) {
			return
		}
		assert.ElementsMatch(t, phase, calls[:len(phase)], "phase %d", i)
		calls = calls[len(phase):]
	}
	assert.Empty(t, calls, "calls after the last phase")
}

func sigName(s syscall.Signal) string {
	if s == syscall.SIGINT {
		return "SIGINT"
	}
	return "SIGTERM"
}

// lockedBuffer is a buffer a command writes while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitForEvent returns once the stand-in servers recorded line.
func waitForEvent(t *testing.T, f *fleet, line string) {
	t.Helper()
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(f.dir, "events"))
		return slices.Contains(lines(string(b)), line)
	}, 10*time.Second, 10*time.Millisecond, "no %q", line)
}

func TestRolloutRefusesBadMaxUnavailable(t *testing.T) {
	requireServerTools(t)
	// Stand-in servers only: no Docker, nothing shared.
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-unavailable", "0"}, "--max-unavailable '0' must be a count (1 or more) or a percentage (1% to 100%)"},
		{[]string{"--max-unavailable", "two"}, "--max-unavailable 'two' must be a count"},
		{[]string{"--max-unavailable=0%"}, "--max-unavailable '0%' must be a count"},
		{[]string{"--max-unavailable=150%"}, "--max-unavailable '150%' must be a count"},
		{[]string{"--max-unavailable", "3"}, "--max-unavailable '3' lets all 3 servers out of service at once (it allows 3)"},
		{[]string{"--max-unavailable", "67%"}, ""},
		{[]string{"--max-unavailable"}, "--max-unavailable needs a value"},
		{[]string{"--canary"}, "unknown option '--canary'"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, 3, "v1")
			args := append(append(slices.Clone(tt.args), "v2"), f.servers...)
			if len(tt.args) == 1 && tt.args[0] == "--max-unavailable" {
				args = tt.args // the value is missing: nothing follows
			}
			res := f.run(t, []string{"FLEET_TOGETHER=s2,s3"}, args...)
			if tt.want == "" {
				// 67% of 3 rounds down to 2: allowed.
				require.Equal(t, 0, res.code, "%s", res)
				assert.Equal(t, 2, f.mostAtOnce(t))
				return
			}
			assert.Equal(t, 2, res.code, "%s", res)
			assert.Contains(t, res.stderr, tt.want)
			assert.Contains(t, res.stderr, "nothing deployed")
			assert.Empty(t, f.calls(t), "no server touched")
		})
	}
}

// The rollout (bash, on the CI runner) and the contract (infra, which the
// dry plan, TIMING.md and the rollout's bounds read) each decide which
// --max-unavailable a fleet takes and how many batches it makes: they agree
// on every fleet of up to seven servers, so neither can drift alone.
func TestRolloutAgreesWithTheContract(t *testing.T) {
	requireServerTools(t)
	// Stand-in servers only: no Docker, nothing shared.
	t.Parallel()
	for k := 1; k <= 7; k++ {
		for n := 1; n <= 8; n++ {
			t.Run(fmt.Sprintf("%d servers, %d at once", k, n), func(t *testing.T) {
				t.Parallel()
				f := newFleet(t, k, "v1")
				res := f.run(t, nil, append([]string{"--max-unavailable", fmt.Sprint(n), "v2"}, f.servers...)...)
				if err := infra.CheckRollout(k, n); err != nil {
					assert.Equal(t, 2, res.code, "the contract refuses it (%v): %s", err, res)
					assert.Contains(t, res.stderr, "out of service at once")
					assert.Empty(t, f.calls(t), "no server touched")
					return
				}
				require.Equal(t, 0, res.code, "the contract allows it: %s", res)
				assert.Contains(t, res.stdout, fmt.Sprintf("deploying v2 to %d server(s) in %d batch(es)", k, infra.RolloutBatches(k, n)))
				assert.LessOrEqual(t, f.mostAtOnce(t), n)
			})
		}
	}
}

// What the rollout ships and runs on a server is executable in the
// repository itself, not only in a test's copy: tar carries the mode over.
func TestShippedScriptsAreExecutableInGit(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-s", "--", "rollout", "remote-deploy", "deploy", "bootstrap", "watchdog").Output()
	require.NoError(t, err)
	got := lines(string(out))
	require.Len(t, got, 5)
	for _, l := range got {
		assert.True(t, strings.HasPrefix(l, "100755 "), "not executable in git: %s", l)
	}
}
