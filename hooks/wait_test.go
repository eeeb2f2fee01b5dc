package hooks

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks/targethealth"
	"github.com/mythex/infra/infra"
)

const waitTestARN = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/mythex-api/0123456789abcdef"

// timeline is a scripted describe-target-health: each step's answer holds
// from its offset (a number of poll intervals after the first call) on.
type timeline []struct {
	at float64
	h  targethealth.Health
}

// waitRun is one rollout whose deploy is a no-op and whose wait is the
// default one, polling the stand-in.
type waitRun struct {
	code           int
	stdout, stderr string
	calls          []targethealth.Call
	exited         time.Time
}

// runWait rolls v1 to the servers with the default wait against the
// scripted answers, at timing tm.
func runWait(t *testing.T, tm infra.Timing, answers func(c targethealth.Call, since time.Duration) (targethealth.Health, error), servers ...string) waitRun {
	t.Helper()
	requireServerTools(t)
	var (
		mu    sync.Mutex
		first time.Time
	)
	s, err := targethealth.Start(func(c targethealth.Call) (targethealth.Health, error) {
		mu.Lock()
		if first.IsZero() {
			first = c.At
		}
		since := c.At.Sub(first)
		mu.Unlock()
		return answers(c, since)
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bin := t.TempDir()
	_, err = s.WriteCLI(bin)
	require.NoError(t, err)
	env, err := RenderTimingEnv(tm)
	require.NoError(t, err)
	envFile := filepath.Join(t.TempDir(), TimingEnvFile)
	require.NoError(t, os.WriteFile(envFile, env, 0o644))

	// A deploy that always succeeds, on servers that ran nothing before.
	deploy := filepath.Join(bin, "deploy-stand-in")
	require.NoError(t, os.WriteFile(deploy, []byte(`#!/usr/bin/env bash
state="$(dirname "$0")/release.$1"
if [[ "$2" == --status ]]; then
  echo "release=$(cat "$state" 2>/dev/null) previous= verified=yes"
else
  echo "$2" >"$state"
fi
`), 0o755))
	cmd := exec.Command("./rollout", append([]string{"v1"}, servers...)...)
	cmd.Env = append(environWithout("MYTHEX_", "PATH"),
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"MYTHEX_DEPLOY_CMD="+deploy,
		"MYTHEX_TARGET_GROUP_ARN="+waitTestARN,
		"MYTHEX_APP_PORT=8080",
		"MYTHEX_TIMING_ENV="+envFile,
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	exited := time.Now()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err)
	}
	return waitRun{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(), calls: s.Calls(), exited: exited}
}

func environWithout(prefix string, names ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, prefix) || contains(names, name) {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// at answers from a timeline, in poll intervals since the first call.
func (tl timeline) at(poll time.Duration) func(targethealth.Call, time.Duration) (targethealth.Health, error) {
	return func(_ targethealth.Call, since time.Duration) (targethealth.Health, error) {
		h := tl[0].h
		for _, step := range tl {
			if since >= time.Duration(step.at*float64(poll)) {
				h = step.h
			}
		}
		return h, nil
	}
}

// gaveUp is the wait's report when the bound ran out: how long it waited,
// and its bound.
var gaveUp = regexp.MustCompile(`not back in service after ([0-9.]+)s \(bound ([0-9.]+)s\)`)

var changeLine = regexp.MustCompile(`rollout: (\S+): (.+) at \+([0-9.]+)s$`)

// changes returns the state changes the rollout reported, in order.
func changes(stdout string) []string {
	var out []string
	for _, l := range lines(stdout) {
		if m := changeLine.FindStringSubmatch(l); m != nil {
			out = append(out, m[1]+": "+m[2])
		}
	}
	return out
}

var (
	draining  = targethealth.Health{State: targethealth.Draining, Reason: "Target.DeregistrationInProgress", Description: "Target deregistration is in progress"}
	initial   = targethealth.Health{State: targethealth.Initial, Reason: "Elb.RegistrationInProgress", Description: "Target registration is in progress"}
	unhealthy = targethealth.Health{State: targethealth.Unhealthy, Reason: "Target.ResponseCodeMismatch", Description: "Health checks failed with these codes: [503]"}
	timedOut  = targethealth.Health{State: targethealth.Unhealthy, Reason: "Target.Timeout", Description: "Request timed out"}
	healthy   = targethealth.Health{State: targethealth.Healthy}
)

// The wait polls at the contract's pace, reports each change of state with
// its time, and notices re-entry within one poll interval of the target
// turning healthy. Each state lasts a whole interval or more, centred between
// two polls, so a poll up to half an interval late still sees every state.
// A poll is four process starts (a subshell, timeout, the CLI, curl), which a
// busy machine can delay past half a second: the interval is 2 s here.
func TestWaitNoticesReentryWithinOneInterval(t *testing.T) {
	tm := infra.Prod().Scaled(0.4)
	poll := tm.ReentryPoll()
	turnsHealthy := 3.5
	tl := timeline{{0, draining}, {0.5, initial}, {1.5, unhealthy}, {turnsHealthy, healthy}}
	res := runWait(t, tm, tl.at(poll), "i-0123456789abcdef0")
	require.Equal(t, 0, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)

	assert.Equal(t, []string{
		"i-0123456789abcdef0: draining (Target.DeregistrationInProgress: Target deregistration is in progress)",
		"i-0123456789abcdef0: initial (Elb.RegistrationInProgress: Target registration is in progress)",
		"i-0123456789abcdef0: unhealthy (Target.ResponseCodeMismatch: Health checks failed with these codes: [503])",
		"i-0123456789abcdef0: healthy",
	}, changes(res.stdout), "each state change reported once, in order:\n%s", res.stdout)

	require.NotEmpty(t, res.calls)
	first := res.calls[0].At
	healthyAt := first.Add(time.Duration(turnsHealthy * float64(poll)))
	last := res.calls[len(res.calls)-1]
	assert.False(t, last.At.Before(healthyAt), "the last call is the one that saw it healthy")
	assert.LessOrEqual(t, last.At.Sub(healthyAt), poll, "re-entry noticed within one interval (%v) of turning healthy", poll)
	for i := 1; i < len(res.calls)-1; i++ {
		assert.False(t, res.calls[i].At.Before(res.calls[i-1].At.Add(poll/2)),
			"calls %d and %d %v apart: the pace is the interval %v, not faster", i-1, i, res.calls[i].At.Sub(res.calls[i-1].At), poll)
	}
	assert.LessOrEqual(t, len(res.calls), int(turnsHealthy)+2, "one call per interval")
	for _, c := range res.calls {
		assert.Equal(t, targethealth.Call{TargetGroupARN: waitTestARN, ID: "i-0123456789abcdef0", Port: 8080},
			targethealth.Call{TargetGroupARN: c.TargetGroupARN, ID: c.ID, Port: c.Port})
	}
	assert.Contains(t, res.stdout, "i-0123456789abcdef0 back in service after")
}

// A target that never returns fails the wait within the bound, naming its
// last state, and the rollout stops there.
func TestWaitGivesUpWithinTheBound(t *testing.T) {
	tm := infra.Prod().Scaled(0.2)
	bound := tm.ReentryWait()
	tl := timeline{{0, unhealthy}, {1.5, timedOut}}
	res := runWait(t, tm, tl.at(tm.ReentryPoll()), "i-1", "i-2")
	require.Equal(t, 1, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	assert.Contains(t, res.stderr, "i-1 not back in service after")
	assert.Contains(t, res.stderr, "last state: unhealthy (Target.Timeout: Request timed out)")
	assert.Contains(t, res.stderr, "i-1 did not come back into service (exit 1)")
	assert.Regexp(t, `(?m)^i-2 +- +- +yes +not started$`, res.stdout)
	require.NotEmpty(t, res.calls)
	// The tight checks are on the wait itself: what it says it waited, and
	// when it last asked. The rollout's exit comes later by its own
	// polling, a --status batch and the table, which a busy machine slows.
	m := gaveUp.FindStringSubmatch(res.stderr)
	require.NotNil(t, m, "the wait says how long it waited:\n%s", res.stderr)
	waited, err := time.ParseDuration(m[1] + "s")
	require.NoError(t, err)
	assert.Equal(t, seconds(bound), m[2], "it names its bound")
	assert.GreaterOrEqual(t, waited, bound, "it waited out the bound, %v", bound)
	assert.LessOrEqual(t, waited, bound+tm.ReentryPoll()/2, "it gave up within the bound, %v", bound)
	last := res.calls[len(res.calls)-1].At
	// The bound runs from the wait's start, just before the first call.
	assert.LessOrEqual(t, last.Sub(res.calls[0].At), bound, "no call started past the bound, %v", bound)
	took := res.exited.Sub(res.calls[0].At)
	t.Logf("the wait gave up after %v (bound %v); the rollout exited %v after the first call", waited, bound, took)
	assert.GreaterOrEqual(t, took, bound-tm.ReentryPoll(), "the rollout waited out the bound, %v", bound)
	assert.Less(t, took, 2*bound, "the rollout stopped once the wait gave up")
	for _, c := range res.calls {
		assert.Equal(t, "i-1", c.ID, "i-2 never deployed, never asked about")
	}
}

// A failed call (a throttled API) is a state like any other: reported, and
// the next poll may answer.
func TestWaitRidesOutAFailedCall(t *testing.T) {
	tm := infra.Prod().Scaled(0.2)
	poll := tm.ReentryPoll()
	answers := func(_ targethealth.Call, since time.Duration) (targethealth.Health, error) {
		if since < poll/2 {
			return targethealth.Health{}, errors.New("Rate exceeded")
		}
		return healthy, nil
	}
	res := runWait(t, tm, answers, "i-1")
	require.Equal(t, 0, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	got := changes(res.stdout)
	require.Len(t, got, 2, "%s", res.stdout)
	assert.Contains(t, got[0], "i-1: no-answer (describe-target-health failed (exit 22)")
	assert.Contains(t, got[0], "Rate exceeded")
	assert.Equal(t, "i-1: healthy", got[1])
}

// Bad input is refused before any server is touched, every problem named at
// once: a server name ssh would read as an option, one that would change
// the --targets argument, a VERSION that would leave the releases directory.
func TestRolloutRefusesBadInput(t *testing.T) {
	requireServerTools(t)
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	deploy := filepath.Join(dir, "deploy")
	require.NoError(t, os.WriteFile(deploy, []byte("#!/usr/bin/env bash\necho \"$*\" >>"+calls+"\n"), 0o755))
	tests := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"hostile names", []string{"MYTHEX_DEPLOY_CMD=" + deploy, "MYTHEX_TARGET_GROUP_ARN=" + waitTestARN, "MYTHEX_APP_PORT=8080"},
			[]string{"../../usr/local/bin", "i-1", "-oProxyCommand=touch /tmp/owned", "i-2,Port=1", "Id=i-3", "a b", ""},
			[]string{
				"VERSION '../../usr/local/bin' is not a valid image tag",
				"SERVER '-oProxyCommand=touch /tmp/owned' starts with '-': ssh would read it as an option",
				"SERVER 'i-2,Port=1' holds ',' or '='",
				"SERVER 'Id=i-3' holds ',' or '='",
				"SERVER 'a b' may hold only letters, digits and _ . @ -",
				"SERVER '' is empty",
			}},
		{"the default wait without its settings", []string{"MYTHEX_DEPLOY_CMD=" + deploy, "MYTHEX_APP_PORT=http"},
			[]string{"v1", "i-1"},
			[]string{"MYTHEX_TARGET_GROUP_ARN is not set", "MYTHEX_APP_PORT 'http' must be a port number"}},
		{"--max-unavailable that takes every server out, or is no number",
			[]string{"MYTHEX_DEPLOY_CMD=" + deploy, "MYTHEX_WAIT_IN_SERVICE=true"},
			[]string{"--max-unavailable", "2", "v1", "i-1", "i-2"},
			[]string{"--max-unavailable '2' lets all 2 servers out of service at once (it allows 2): an ALB whose targets are all unhealthy fails open",
				"use at most 1"}},
		{"a percentage of every server", []string{"MYTHEX_DEPLOY_CMD=" + deploy, "MYTHEX_WAIT_IN_SERVICE=true"},
			[]string{"--max-unavailable=100%", "v1", "i-1", "i-2", "i-3"},
			[]string{"--max-unavailable '100%' lets all 3 servers out of service at once (it allows 3)"}},
		{"a server named twice", []string{"MYTHEX_DEPLOY_CMD=" + deploy, "MYTHEX_WAIT_IN_SERVICE=true"},
			[]string{"v1", "i-1", "i-2", "i-1"},
			[]string{"SERVER 'i-1' is named twice"}},
		{"the default deploy with a relative releases directory", []string{"MYTHEX_REMOTE_RELEASES=releases", "MYTHEX_WAIT_IN_SERVICE=true"},
			[]string{"v1", "i-1"},
			[]string{"MYTHEX_REMOTE_RELEASES 'releases' must be an absolute path"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command("./rollout", tt.args...)
			cmd.Env = append(environWithout("MYTHEX_"), tt.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			_ = cmd.Run()
			assert.Equal(t, 2, cmd.ProcessState.ExitCode(), "%s", stderr.String())
			for _, w := range tt.want {
				assert.Contains(t, stderr.String(), w)
			}
			assert.Contains(t, stderr.String(), "nothing deployed")
			assert.NoFileExists(t, calls, "no server touched")
		})
	}
}

// rollout and deploy apply the same rule to VERSION: one accepts what the
// other accepts.
func TestRolloutAndDeployAgreeOnVersion(t *testing.T) {
	requireServerTools(t)
	for _, v := range []string{"v1", "2026.11.30-abc_1", "_x", "a..b", strings.Repeat("a", 128),
		strings.Repeat("a", 129), "../x", "..", ".hidden", "-v", "v 1", "v1;id", "v/1", ""} {
		t.Run(v, func(t *testing.T) {
			// "--": a VERSION starting with '-' is otherwise an option.
			rollout := exec.Command("./rollout", "--", v, "i-1")
			rollout.Env = append(environWithout("MYTHEX_"), "MYTHEX_DEPLOY_CMD=true", "MYTHEX_WAIT_IN_SERVICE=true")
			rolloutOut, _ := rollout.CombinedOutput()
			deploy := exec.Command("./deploy", v)
			// Bad everything else, so deploy stops at its input check.
			deploy.Env = append(environWithout("MYTHEX_"), "MYTHEX_APP_PORT=0", "MYTHEX_ROOT="+t.TempDir())
			deployOut, _ := deploy.CombinedOutput()
			rolloutRefused := strings.Contains(string(rolloutOut), "is not a valid image tag")
			deployRefused := strings.Contains(string(deployOut), "is not a valid image tag")
			assert.Equal(t, deployRefused, rolloutRefused, "rollout:\n%s\ndeploy:\n%s", rolloutOut, deployOut)
		})
	}
}
