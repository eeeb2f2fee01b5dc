package workflows

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/needs"
)

// Every step's shell is `bash --noprofile --norc -eo pipefail`, the command
// runStep uses: without `shell: bash` the runner's is `bash -e`, where a
// failure left of a pipe passes.
func TestDeployRunsEveryStepUnderPipefail(t *testing.T) {
	var w struct {
		Defaults struct {
			Run struct{ Shell string }
		}
	}
	require.NoError(t, yaml.Unmarshal([]byte(load(t, "deploy.yml").raw), &w))
	assert.Equal(t, "bash", w.Defaults.Run.Shell)
	assert.Equal(t, []string{"bash", "--noprofile", "--norc", "-eo", "pipefail"}, runnerShell)
}

// prodOutputs is `pulumi stack output --json` of the prod stack as the
// program at this build exports it (under Pulumi's mocks).
func prodOutputs(t *testing.T) []byte {
	t.Helper()
	stack, err := infra.LoadStackFile(filepath.Join(root, "Pulumi.prod.yaml"))
	require.NoError(t, err)
	got := make(chan map[string]any, 1)
	err = pulumi.RunErr(func(ctx *pulumi.Context) error {
		lb, err := infra.Build(ctx, infra.Prod())
		if err != nil {
			return err
		}
		lb.Outputs().ToMapOutput().ApplyT(func(m map[string]any) map[string]any {
			got <- m
			return m
		})
		return nil
	}, pulumi.WithMocks(infra.Project, stack.Stack, &infra.Recorder{}), infra.WithConfig(stack.Config))
	require.NoError(t, err)
	require.Len(t, got, 1, "outputs resolved")
	b, err := json.MarshalIndent(<-got, "", "  ")
	require.NoError(t, err)
	return b
}

// fakePulumi is a bin directory whose `pulumi stack output` prints answer
// and exits with code, as the CLI would.
func fakePulumi(t *testing.T, answer string, code int) string {
	t.Helper()
	bin := t.TempDir()
	answerFile := filepath.Join(bin, "answer")
	require.NoError(t, os.WriteFile(answerFile, []byte(answer), 0o644))
	// Builtins only: the test may leave nothing else on PATH.
	script := fmt.Sprintf("#!/bin/bash\n[[ $1 == stack && $2 == output ]] || exit 64\nprintf '%%s' \"$(<%s)\"\nexit %d\n", answerFile, code)
	require.NoError(t, os.WriteFile(filepath.Join(bin, "pulumi"), []byte(script), 0o755))
	return bin
}

// binWith is a bin directory holding links to the named tools only.
func binWith(t *testing.T, dir string, tools ...string) string {
	t.Helper()
	for _, tool := range tools {
		p, err := exec.LookPath(tool)
		require.NoError(t, err, "%s is needed", tool)
		require.NoError(t, os.Symlink(p, filepath.Join(dir, tool)))
	}
	return dir
}

// The up job's shell steps on bad input: each fails with a one-line reason
// and writes no output, where `echo "x=$(jq -er …)"` passed and wrote
// `target-group-arn=` for the rollout to trip on later.
func TestUpJobStepsFailOnBadInput(t *testing.T) {
	needs.Have(t, needs.Tool("jq", "apt-get install jq"), needs.Tool("yq", "apt-get install yq"))
	up := load(t, "deploy.yml").Jobs["up"]
	var outputs, region step
	for _, s := range up.Steps {
		switch s.ID {
		case "outputs":
			outputs = s
		case "stack":
			region = s
		}
	}
	require.NotEmpty(t, outputs.Run, "the up job reads the stack outputs")
	require.NotEmpty(t, region.Run, "the up job reads the region")

	good := string(prodOutputs(t))
	var parsed map[string]any
	require.NoError(t, json.Unmarshal([]byte(good), &parsed))
	withNull := strings.Replace(good, `"targetGroupArn": "`+parsed["targetGroupArn"].(string)+`"`, `"targetGroupArn": null`, 1)
	require.NotEqual(t, good, withNull)
	withEmpty := strings.Replace(good, `"albArnSuffix": "`+parsed["albArnSuffix"].(string)+`"`, `"albArnSuffix": ""`, 1)
	require.NotEqual(t, good, withEmpty)

	tests := []struct {
		name       string
		answer     string
		pulumiCode int
		code       int
		noJQ       bool
		want       string
	}{
		{name: "a deployed stack", answer: good, code: 0},
		{name: "an empty answer", answer: "", code: 1,
			want: "::error::mythex/mythex-infra/prod has no usable output targetGroupArn targetGroupArnSuffix albArnSuffix appPort (missing, null or empty): has its pulumi up run?"},
		{name: "a null output", answer: withNull, code: 1, want: "has no usable output targetGroupArn (missing, null or empty)"},
		{name: "an empty output", answer: withEmpty, code: 1, want: "has no usable output albArnSuffix (missing, null or empty)"},
		{name: "not JSON", answer: "error: could not read the stack", code: 1, want: "::error::the outputs of mythex/mythex-infra/prod are not JSON"},
		{name: "pulumi fails", answer: "", pulumiCode: 255, code: 255},
		{name: "no jq", answer: good, noJQ: true, code: 1, want: "::error::jq is not on PATH"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bin := fakePulumi(t, tc.answer, tc.pulumiCode)
			if !tc.noJQ {
				bin = binWith(t, bin, "jq")
			}
			tmp := t.TempDir()
			ghOut := filepath.Join(tmp, "github_output")
			require.NoError(t, os.WriteFile(ghOut, nil, 0o644))
			code, out := runStep(t, outputs, map[string]string{
				"PATH": bin, "RUNNER_TEMP": tmp, "GITHUB_OUTPUT": ghOut, "MYTHEX_STACK": "mythex/mythex-infra/prod",
			})
			assert.Equal(t, tc.code, code, "output:\n%s", out)
			written, err := os.ReadFile(ghOut)
			require.NoError(t, err)
			if tc.code != 0 {
				assert.Empty(t, string(written), "nothing half done: no output from a failed step")
				assert.LessOrEqual(t, strings.Count(strings.TrimSpace(out), "\n"), 0, "one line: %s", out)
				assert.Contains(t, out, tc.want)
				return
			}
			assert.Equal(t, "target-group-arn="+parsed["targetGroupArn"].(string)+"\n"+
				"target-group-arn-suffix="+parsed["targetGroupArnSuffix"].(string)+"\n"+
				"alb-arn-suffix="+parsed["albArnSuffix"].(string)+"\n"+
				"app-port=8080\n", string(written))
		})
	}

	for name, tc := range map[string]struct {
		yaml  string
		noYQ  bool
		code  int
		write string
		want  string
	}{
		"the region":    {yaml: "config:\n  aws:region: us-east-1\n", code: 0, write: "region=us-east-1\n"},
		"no region":     {yaml: "config:\n  mythex-infra:appPort: \"8080\"\n", code: 1, want: "::error::Pulumi.prod.yaml sets no aws:region"},
		"an empty file": {yaml: "", code: 1, want: "::error::Pulumi.prod.yaml sets no aws:region"},
		"no yq":         {yaml: "config:\n  aws:region: us-east-1\n", noYQ: true, code: 127, want: "yq: command not found"},
	} {
		t.Run("region: "+name, func(t *testing.T) {
			dir, tmp := t.TempDir(), t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "Pulumi.prod.yaml"), []byte(tc.yaml), 0o644))
			bin := t.TempDir()
			if !tc.noYQ {
				// yq may be a script that needs its interpreter on PATH.
				bin = binWith(t, bin, "yq", "python3", "jq")
			}
			ghOut := filepath.Join(tmp, "github_output")
			require.NoError(t, os.WriteFile(ghOut, nil, 0o644))
			code, out := runStepIn(t, region, dir, map[string]string{"PATH": bin, "GITHUB_OUTPUT": ghOut})
			assert.Equal(t, tc.code, code, "output:\n%s", out)
			written, err := os.ReadFile(ghOut)
			require.NoError(t, err)
			assert.Equal(t, tc.write, string(written))
			assert.Contains(t, out, tc.want)
			assert.LessOrEqual(t, strings.Count(strings.TrimSpace(out), "\n"), 0, "one line: %s", out)
		})
	}
}

// gitRepo is a fresh repository holding this module's files as commit A.
type gitRepo struct {
	t   *testing.T
	dir string
}

func newGitRepo(t *testing.T) *gitRepo {
	t.Helper()
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
	r.commit("A")
	return r
}

func (r *gitRepo) git(args ...string) string {
	r.t.Helper()
	out, err := exec.Command("git", append([]string{"-C", r.dir}, args...)...).CombinedOutput()
	require.NoError(r.t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// edit replaces each old text of file once and commits the result as msg.
func (r *gitRepo) edit(msg, file string, replace map[string]string) string {
	r.t.Helper()
	path := filepath.Join(r.dir, file)
	data, err := os.ReadFile(path)
	require.NoError(r.t, err)
	src := string(data)
	for old, new := range replace {
		require.Equal(r.t, 1, strings.Count(src, old), "%s has %q once", file, old)
		src = strings.Replace(src, old, new, 1)
	}
	require.NoError(r.t, os.WriteFile(path, []byte(src), 0o644))
	return r.commit(msg)
}

func (r *gitRepo) commit(msg string) string {
	r.t.Helper()
	r.git("add", "-A")
	r.git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", msg)
	return r.git("rev-parse", "HEAD")
}

// expand replaces the ${{ … }} expressions a step's env uses with values;
// an expression the test does not know fails it.
func expand(t *testing.T, env map[string]string, values map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	expr := regexp.MustCompile(`\$\{\{\s*([^}]*?)\s*\}\}`)
	for k, v := range env {
		out[k] = expr.ReplaceAllStringFunc(v, func(m string) string {
			name := expr.FindStringSubmatch(m)[1]
			val, ok := values[name]
			assert.True(t, ok, "env %s uses ${{ %s }}, which this test does not provide", k, name)
			return val
		})
	}
	return out
}

// Pushes A (deployed), B (cancelled while waiting its turn: the interval
// 5s → 10s, with the drain and grace period it needs) and C (a README
// change). The deploy of C runs the order job's step in a checkout of C,
// with production's outputs as the prod stack holds them after A's `pulumi
// up`: C is judged against A, so B's change, which never went live, is
// judged now: servers first, `pulumi up` after the rollout. Judged against
// the previous push (B → C: nothing changed) it would be "any order", and
// `pulumi up` would run first: the new interval against servers still on
// A's drain.
func TestDeployJudgesAgainstWhatProductionRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/timing at other revisions; run without -short")
	}
	var order step
	for _, s := range load(t, "deploy.yml").Jobs["order"].Steps {
		if s.ID == "order" {
			order = s
		}
	}
	require.NotEmpty(t, order.Run, "the order job's step `order` writes the verdict")

	r := newGitRepo(t)
	a := r.git("rev-parse", "HEAD")
	b := r.edit("B: interval 5s → 10s", "infra/timing.go", map[string]string{
		"HealthCheckInterval: 5 * time.Second,": "HealthCheckInterval: 10 * time.Second,",
		"Drain: 15 * time.Second,":              "Drain: 30 * time.Second,",
		"MaxDrain: 25 * time.Second,":           "MaxDrain: 30 * time.Second,",
		"StopGracePeriod: 40 * time.Second,":    "StopGracePeriod: 45 * time.Second,",
	})
	require.NoError(t, os.WriteFile(filepath.Join(r.dir, "README.md"), []byte("# Mythex infra\n\nA README change.\n"), 0o644))
	c := r.commit("C: README")
	require.NotEqual(t, a, b)

	// Production runs A: the outputs of A's program (this build's).
	prod := prodOutputs(t)

	run := func(t *testing.T, answer string, pulumiCode int) (int, string, string, string) {
		tmp := t.TempDir()
		ghOut, summary := filepath.Join(tmp, "github_output"), filepath.Join(tmp, "summary.md")
		require.NoError(t, os.WriteFile(ghOut, nil, 0o644))
		env := expand(t, order.Env, map[string]string{"github.event.before": b, "github.sha": c})
		env["PATH"] = fakePulumi(t, answer, pulumiCode) + string(os.PathListSeparator) + os.Getenv("PATH")
		env["RUNNER_TEMP"] = tmp
		env["GITHUB_OUTPUT"] = ghOut
		env["GITHUB_STEP_SUMMARY"] = summary
		env["GITHUB_SHA"] = c
		env["MYTHEX_STACK"] = "mythex/mythex-infra/prod"
		env["GOFLAGS"] = "-mod=mod"
		code, out := runStepIn(t, order, r.dir, env)
		written, err := os.ReadFile(ghOut)
		require.NoError(t, err)
		md, _ := os.ReadFile(summary)
		return code, out, string(written), string(md)
	}

	code, out, written, md := run(t, string(prod), 0)
	require.Equal(t, 0, code, "output:\n%s", out)
	assert.Equal(t, "verdict=servers-first\npulumi-up=after\n", written,
		"C is judged against A, what production runs, not against B, the previous push; output:\n%s", out)
	assert.Contains(t, out, "production → working tree: servers first")
	assert.Contains(t, md, "`production`", "the job summary's diff names production as its old side")
	assert.Contains(t, md, "#### Rollout order: **servers first**")

	// A production it cannot read is no baseline: one line, no verdict.
	for name, tc := range map[string]struct {
		answer string
		code   int
		want   string
	}{
		"an empty answer":  {"", 0, "timing: production's timing: "},
		"no timing output": {`{"albArnSuffix": "app/x/y"}`, 0, "has no `timing` output"},
		"a null value":     {`{"timing": {"drain": null, "healthCheckInterval": "5s"}}`, 0, "timing.drain is null"},
		"pulumi fails":     {"", 255, ""},
	} {
		t.Run(name, func(t *testing.T) {
			code, out, written, _ := run(t, tc.answer, tc.code)
			assert.NotEqual(t, 0, code, "output:\n%s", out)
			assert.Empty(t, written, "no verdict without a baseline")
			assert.Contains(t, out, tc.want)
		})
	}
}
