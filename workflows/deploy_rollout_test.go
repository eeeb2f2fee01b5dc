package workflows

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

// The rollout step execs the Go rollout: the runner signals the step's
// shell alone on a cancel, so the rollout must be that process. Run as the
// runner runs it, with a stand-in `go` whose build writes a rollout that
// notes its pid and the signals it gets: the shell's pid is the rollout's,
// and the runner's SIGINT to it reaches the rollout, whose status is the
// step's.
func TestRolloutStepExecsTheGoRollout(t *testing.T) {
	s := findStep(t, load(t, "deploy.yml").Jobs["rollout"], "Roll out, a canary then batches, rolled back on a failure")
	assert.Contains(t, s.Run, `go build -o "$RUNNER_TEMP/rollout" ./cmd/rollout`)
	assert.Contains(t, s.Run, `exec "$RUNNER_TEMP/rollout" -max-unavailable "$MAX_UNAVAILABLE" "$GITHUB_SHA" "${servers[@]}"`)

	tmp, bin := t.TempDir(), t.TempDir()
	notes := filepath.Join(tmp, "notes")
	fakeRollout := `#!/usr/bin/env bash
printf 'pid %s args %s\n' "$$" "$*" >>` + notes + `
trap 'printf "got INT\n" >>` + notes + `; exit 130' INT
while :; do sleep 0.05; done
`
	fakeGo := `#!/usr/bin/env bash
set -eu
[[ "$1 $2 $4" == "build -o ./cmd/rollout" ]] || { echo "unexpected: go $*" >&2; exit 2; }
cat >"$3" <<'ROLLOUT'
` + fakeRollout + `ROLLOUT
chmod +x "$3"
`
	require.NoError(t, os.WriteFile(filepath.Join(bin, "go"), []byte(fakeGo), 0o755))
	script := filepath.Join(tmp, "step.sh")
	require.NoError(t, os.WriteFile(script, []byte(s.Run), 0o644))
	cmd := exec.Command(runnerShell[0], append(runnerShell[1:], script)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"RUNNER_TEMP="+tmp, "MAX_UNAVAILABLE=1", "GITHUB_SHA=0123abc")
	// A group of its own, so the test can end whatever the step left.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
	waited := make(chan error, 1)

	var note string
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(notes)
		note = string(b)
		return strings.Contains(note, "\n")
	}, 60*time.Second, 10*time.Millisecond, "the rollout never started; step output:\n%s", &out)
	assert.Contains(t, note, "pid "+strconv.Itoa(cmd.Process.Pid)+" ", "the step's shell is the rollout (exec)")
	assert.Contains(t, note, "args -max-unavailable 1 0123abc i-")

	// The runner's first signal of a cancel, to the step's shell alone.
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	go func() { waited <- cmd.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-time.After(30 * time.Second):
		// The runner's tree kill comes 10 s after its SIGINT; a step still
		// running long after never gave the rollout the signal.
		require.FailNow(t, "the step did not end after the runner's SIGINT: the rollout never got it", "step output:\n%s", &out)
	}
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "step output:\n%s", &out)
	assert.Equal(t, 130, ee.ExitCode(), "the step's status is the rollout's")
	b, err := os.ReadFile(notes)
	require.NoError(t, err)
	assert.Contains(t, string(b), "got INT", "the runner's SIGINT reached the rollout")
}

// The rollout job's timeout-minutes covers the longest the rollout may take
// by its own bounds, a failed rollout rolled back (FailedRolloutMax, for
// production's servers, Pulumi.prod.yaml's instanceIds, which the step
// deploys, at the step's default MAX_UNAVAILABLE, the most batches), and the
// bound the count of 502s after it states (METRICS_WAIT). A shorter timeout
// cuts a rollback half-way, its servers left on either release. The other
// steps (checkout, Go, the plugin, the builds, albmetrics' own calls) state
// no bound: they have what is left.
func TestRolloutJobTimeoutCoversTheFailedRollout(t *testing.T) {
	j := load(t, "deploy.yml").Jobs["rollout"]
	require.Positive(t, j.TimeoutMinutes, "the rollout job sets timeout-minutes")
	timeout := time.Duration(j.TimeoutMinutes) * time.Minute

	roll := findStep(t, j, "Roll out, a canary then batches, rolled back on a failure")
	assert.Contains(t, roll.Run, `yq -r '.config["`+infra.KeyInstanceIDs+`"][]' `+contract.ProdStackFile,
		"the step deploys the servers of the stack file the fleet is read from")
	m := regexp.MustCompile(`^\$\{\{ vars\.DEPLOY_MAX_UNAVAILABLE \|\| '([0-9]+)' \}\}$`).FindStringSubmatch(roll.Env["MAX_UNAVAILABLE"])
	require.NotNil(t, m, "MAX_UNAVAILABLE %q: a variable with a default count", roll.Env["MAX_UNAVAILABLE"])
	maxUnavailable, err := strconv.Atoi(m[1])
	require.NoError(t, err)

	fleet, err := contract.LoadProdFleet(root)
	require.NoError(t, err)
	count := findStep(t, j, "Count the rollout's 502s and 504s at the load balancer")
	metricsWait, err := time.ParseDuration(count.Env["METRICS_WAIT"])
	require.NoError(t, err, "METRICS_WAIT")

	tm := infra.Prod()
	failed := tm.FailedRolloutMax(fleet.Servers, maxUnavailable)
	need := failed + metricsWait
	assert.GreaterOrEqual(t, timeout, need,
		"the rollout job's timeout-minutes %d (%v) must cover FailedRolloutMax(%d, %d) %v + METRICS_WAIT %v = %v: raise it to at least %d",
		j.TimeoutMinutes, timeout, fleet.Servers, maxUnavailable, contract.FormatDuration(failed), metricsWait, contract.FormatDuration(need),
		int((need+time.Minute-1)/time.Minute))
	t.Logf("timeout-minutes %d covers FailedRolloutMax(%d, %d) %v + METRICS_WAIT %v = %v; %v left for the steps that state no bound",
		j.TimeoutMinutes, fleet.Servers, maxUnavailable, contract.FormatDuration(failed), metricsWait, contract.FormatDuration(need),
		contract.FormatDuration(timeout-need))
}
