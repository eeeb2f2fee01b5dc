package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

// gitRepo copies this module's files into a fresh repository and commits
// them as "base"; edit commits Prod() changes on top and returns the commit.
type gitRepo struct {
	t   *testing.T
	dir string
}

func newGitRepo(t *testing.T) *gitRepo {
	t.Helper()
	root, err := contract.FindModuleRoot(".")
	require.NoError(t, err)
	out, err := exec.Command("git", "-C", root, "ls-files", "-co", "--exclude-standard").Output()
	require.NoError(t, err)
	r := &gitRepo{t: t, dir: t.TempDir()}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		data, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Join(r.dir, filepath.Dir(f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(r.dir, f), data, 0o644))
	}
	r.git("init", "-q")
	r.git("add", "-A")
	r.git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base")
	r.git("tag", "base")
	return r
}

func (r *gitRepo) git(args ...string) string {
	r.t.Helper()
	out, err := exec.Command("git", append([]string{"-C", r.dir}, args...)...).CombinedOutput()
	require.NoError(r.t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// commit checks out from, replaces lines of Prod() in infra/timing.go (each
// must occur once) and commits the result as tag.
func (r *gitRepo) commit(from, tag string, replace map[string]string) {
	r.t.Helper()
	r.git("checkout", "-q", from)
	path := filepath.Join(r.dir, "infra", "timing.go")
	data, err := os.ReadFile(path)
	require.NoError(r.t, err)
	src := string(data)
	for old, new := range replace {
		require.Equal(r.t, 1, strings.Count(src, old), "timing.go has %q once", old)
		src = strings.Replace(src, old, new, 1)
	}
	require.NoError(r.t, os.WriteFile(path, []byte(src), 0o644))
	r.git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", tag)
	r.git("tag", tag)
}

// TestOrderOnABranch: a branch that makes the change (interval 5s →
// 10s, drain and its upper bound → 30s, grace 40s → 45s) gets "servers first" with its
// reason under the diff, and `pulumi up` after the rollout; reversed, balancer
// first; with a shorter idle timeout on top, no order: the pull-request gate
// fails with a split and the deploy refuses it.
func TestOrderOnABranch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds other revisions of package infra; run without -short")
	}
	r := newGitRepo(t)
	slow := map[string]string{
		"HealthCheckInterval: 5 * time.Second,": "HealthCheckInterval: 10 * time.Second,",
		"Drain: 15 * time.Second,":              "Drain: 30 * time.Second,",
		"MaxDrain: 25 * time.Second,":           "MaxDrain: 30 * time.Second,",
		"StopGracePeriod: 40 * time.Second,":    "StopGracePeriod: 45 * time.Second,",
	}
	r.commit("base", "slow", slow)
	r.commit("slow", "unsafe", map[string]string{
		"LBIdleTimeout: 60 * time.Second,": "LBIdleTimeout: 30 * time.Second,",
		"AppKeepAlive: 75 * time.Second,":  "AppKeepAlive: 40 * time.Second,",
	})
	r.commit("base", "grace45", map[string]string{"StopGracePeriod: 40 * time.Second,": "StopGracePeriod: 45 * time.Second,"})
	t.Chdir(r.dir)

	code, stdout, stderr := runTiming(t, "diff", "-gate", "base", "slow")
	require.Equal(t, 0, code, stderr)
	verdict := stdout[strings.Index(stdout, "#### Rollout order"):]
	assert.Contains(t, verdict, "#### Rollout order: **servers first**\n\nservers first: roll the servers out, then run `pulumi up`; "+
		"balancer first would break `drain-outlasts-detection`, `reentry-short`.")
	assert.Contains(t, verdict, "Drain 15s must exceed worst-case detection 23s")
	assert.Greater(t, strings.Index(stdout, "#### Rollout order"), strings.Index(stdout, "#### Values"), "the verdict is under the diff")

	tests := []struct {
		name     string
		from, to string
		code     int
		stdout   string
		stderr   string
	}{
		{"the example", "base", "slow", 0, "verdict=servers-first\npulumi-up=after\n", "servers first: roll the servers out"},
		{"the example reversed", "slow", "grace45", 0, "verdict=balancer-first\npulumi-up=before\n", "balancer first: run `pulumi up`"},
		{"no safe order", "base", "unsafe", 1, "verdict=unsafe\n", "1. change `LBIdleTimeout` 1m → 30s (**any order**)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runTiming(t, "order", tt.from, tt.to)
			assert.Equal(t, tt.code, code, stderr)
			assert.Equal(t, tt.stdout, stdout)
			assert.Contains(t, stderr, tt.stderr)
		})
	}

	out := filepath.Join(t.TempDir(), "diff.md")
	code, _, stderr = runTiming(t, "diff", "-gate", "-o", out, "base", "unsafe")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the timing change has no safe rollout order: unsafe in either order")
	md, err := os.ReadFile(out)
	require.NoError(t, err, "the diff is written before the gate fails")
	assert.Contains(t, string(md), "**Split it in two changes, each deployed on its own:**")
}

func TestOrderUsage(t *testing.T) {
	code, stdout, stderr := runTiming(t, "order")
	assert.Equal(t, 2, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "order takes one or two revisions, got 0")
	code, _, stderr = runTiming(t, "order", "-x", "a")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "flag provided but not defined: -x")
	code, stdout, stderr = runTiming(t, "order", "no-such-revision-anywhere")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout, "no verdict line for a revision that does not exist")
	assert.Contains(t, stderr, `revision "no-such-revision-anywhere" is not a commit`)
}

type workflow struct {
	Jobs map[string]struct {
		Needs   any               `yaml:"needs"`
		If      string            `yaml:"if"`
		Outputs map[string]string `yaml:"outputs"`
		Steps   []struct {
			ID   string            `yaml:"id"`
			If   string            `yaml:"if"`
			Uses string            `yaml:"uses"`
			Run  string            `yaml:"run"`
			With map[string]string `yaml:"with"`
		} `yaml:"steps"`
	} `yaml:"jobs"`
}

func needs(v any) []string {
	switch n := v.(type) {
	case string:
		return []string{n}
	case []any:
		var out []string
		for _, x := range n {
			out = append(out, x.(string))
		}
		return out
	}
	return nil
}

// TestDeployWorkflowFollowsTheVerdict reads deploy.yml: one job writes
// `timing order`'s lines to its outputs; every `pulumi up` runs only on the
// pulumi-up value that `timing order` prints for its place (before the
// rollout, or after it), so a change whose verdict is unsafe, which fails
// that job and prints no pulumi-up, reaches neither `pulumi up` nor the
// rollout.
func TestDeployWorkflowFollowsTheVerdict(t *testing.T) {
	root, err := contract.FindModuleRoot(".")
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "deploy.yml"))
	require.NoError(t, err)
	var wf workflow
	require.NoError(t, yaml.Unmarshal(data, &wf))

	// The job that judges, and the output it exports.
	var orderJob, stepID string
	for name, job := range wf.Jobs {
		for _, s := range job.Steps {
			if strings.Contains(s.Run, "go run ./cmd/timing order") {
				require.Contains(t, s.Run, `>>"$GITHUB_OUTPUT"`, "the verdict lines become step outputs")
				orderJob, stepID = name, s.ID
			}
		}
	}
	require.NotEmpty(t, orderJob, "deploy.yml no longer runs `go run ./cmd/timing order`")
	require.NotEmpty(t, stepID)
	assert.Equal(t, "${{ steps."+stepID+".outputs.pulumi-up }}", wf.Jobs[orderJob].Outputs["pulumi-up"])
	ref := "needs." + orderJob + ".outputs.pulumi-up"

	// dependsOn reports whether job waits for other, directly or not.
	var dependsOn func(job, other string) bool
	dependsOn = func(job, other string) bool {
		for _, n := range needs(wf.Jobs[job].Needs) {
			if n == other || dependsOn(n, other) {
				return true
			}
		}
		return false
	}
	var rollout string
	for name, job := range wf.Jobs {
		for _, s := range job.Steps {
			if strings.Contains(s.Run, "./cmd/rollout") {
				rollout = name
			}
		}
	}
	require.NotEmpty(t, rollout, "deploy.yml no longer runs the rollout (cmd/rollout)")
	assert.True(t, dependsOn(rollout, orderJob), "the rollout waits for the verdict")

	ups := map[string]string{} // "before"/"after" → job
	for name, job := range wf.Jobs {
		for _, s := range job.Steps {
			if !strings.HasPrefix(s.Uses, "pulumi/actions@") || s.With["command"] != "up" {
				continue
			}
			require.Truef(t, dependsOn(name, orderJob), "job %s runs pulumi up without waiting for the verdict", name)
			switch {
			case s.If == ref+" == 'before'":
				assert.Truef(t, dependsOn(rollout, name), "job %s runs pulumi up 'before': the rollout must wait for it", name)
				ups["before"] = name
			case job.If == ref+" == 'after'":
				assert.Truef(t, dependsOn(name, rollout), "job %s runs pulumi up 'after': it must wait for the rollout", name)
				ups["after"] = name
			default:
				t.Errorf("job %s runs pulumi up on neither verdict (step if %q, job if %q)", name, s.If, job.If)
			}
		}
	}
	assert.Len(t, ups, 2, "one pulumi up before the rollout, one after: %v", ups)

	// The values the conditions test are the ones `timing order` prints.
	old, slow := example()
	for want, v := range map[string]contract.Verdict{
		"after":  contract.JudgeTransition(old, slow),
		"before": contract.JudgeTransition(slow, slow),
	} {
		assert.Equal(t, want, v.PulumiUp())
	}

	// The command line parses: it gets as far as reading production's
	// outputs.
	missing := filepath.Join(t.TempDir(), "prod-outputs.json")
	args := workflowArgs(t, string(data), "go run ./cmd/timing order", map[string]string{"prod": missing})
	code, stdout, stderr := runTiming(t, args...)
	assert.Equal(t, 1, code, "args %q: %s", args, stderr)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "timing: production's timing: open "+missing)
}

// example is the change as two timings: Prod, and Prod with the
// interval at 10s, the drain and its upper bound at 30s and the grace period
// at 45s.
func example() (old, new infra.Timing) {
	old = infra.Prod()
	new = old
	new.HealthCheckInterval = 10 * time.Second
	new.Drain = 30 * time.Second
	new.MaxDrain = 30 * time.Second
	new.StopGracePeriod = 45 * time.Second
	return old, new
}
