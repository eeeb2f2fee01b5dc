package workflows

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/mythex/infra/infra"
)

const root = ".."

type workflow struct {
	Env  map[string]string
	Jobs map[string]job
	raw  string
}

type job struct {
	// TimeoutMinutes is the job's timeout-minutes: the runner cuts the job
	// there, whatever it is doing.
	TimeoutMinutes int `yaml:"timeout-minutes"`
	Environment    string
	Permissions    map[string]string
	Outputs        map[string]string
	Uses           string
	Steps          []step
	raw            string
}

type step struct {
	ID, Name, Uses, Run, If string
	With                    map[string]string
	Env                     map[string]string
}

func load(t *testing.T, name string) workflow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".github", "workflows", name))
	require.NoError(t, err)
	var w workflow
	require.NoError(t, yaml.Unmarshal(b, &w), "%s parses", name)
	w.raw = string(b)
	var raw struct{ Jobs map[string]yaml.Node }
	require.NoError(t, yaml.Unmarshal(b, &raw))
	for id, n := range raw.Jobs {
		out, err := yaml.Marshal(&n)
		require.NoError(t, err)
		j := w.Jobs[id]
		j.raw = string(out)
		w.Jobs[id] = j
	}
	return w
}

func all(t *testing.T) map[string]workflow {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yml"))
	require.NoError(t, err)
	require.NotEmpty(t, names)
	out := map[string]workflow{}
	for _, n := range names {
		out[filepath.Base(n)] = load(t, filepath.Base(n))
	}
	return out
}

// repo is the GitHub repository, from the module path.
func repo(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^module github\.com/(\S+)$`).FindSubmatch(b)
	require.NotNil(t, m, "go.mod names a github.com module")
	return string(m[1])
}

// A job in an environment gets an OIDC token whose subject names the
// environment, not the branch: the header must tell people to trust that.
func TestDeployTrustsTheEnvironmentsOIDCSubject(t *testing.T) {
	w := load(t, "deploy.yml")
	header, _, _ := strings.Cut(w.raw, "\nname:")
	want := "repo:" + repo(t) + ":environment:production"
	for id, j := range w.Jobs {
		if j.Permissions["id-token"] == "write" {
			assert.Equal(t, "production", j.Environment, "job %s takes an OIDC token, so its subject is %s", id, want)
		}
	}
	assert.Contains(t, header, want, "the header names the subject the role must trust")
	assert.NotContains(t, header, "refs/heads/main", "no job's token carries the branch as its subject")
	for _, f := range []string{"iam/deploy-role-trust.json", "iam/deploy-role-policy.json"} {
		assert.Contains(t, header, f, "the header names the role's policies, kept as code")
		_, err := os.Stat(filepath.Join(root, f))
		assert.NoError(t, err, "%s is in the repository", f)
	}
	assert.Contains(t, header, "main only", "the header names the environment's branch rule")
}

// No long-lived Pulumi token: each job that runs Pulumi logs in with its own
// OIDC token, as a team that can do only what the job does.
func TestPulumiLogsInWithOIDCAsTheJobsOwnTeam(t *testing.T) {
	scopes := map[string]string{} // workflow/job → team
	for name, w := range all(t) {
		assert.NotContains(t, w.raw, "PULUMI_ACCESS_TOKEN", "%s: no Pulumi token in secrets or env", name)
		for id, j := range w.Jobs {
			auth := -1
			for i, s := range j.Steps {
				if strings.HasPrefix(s.Uses, "pulumi/auth-actions@") {
					auth = i
					assert.Equal(t, "${{ env.PULUMI_ORG }}", s.With["organization"], "%s %s", name, id)
					assert.Equal(t, "urn:pulumi:token-type:access_token:team", s.With["requested-token-type"], "%s %s", name, id)
					scopes[name+" "+id] = s.With["scope"]
				}
				if strings.HasPrefix(s.Uses, "pulumi/actions@") {
					require.GreaterOrEqual(t, auth, 0, "%s %s logs in to Pulumi before step %d", name, id, i)
					assert.Equal(t, "write", j.Permissions["id-token"], "%s %s may ask for an OIDC token", name, id)
				}
			}
		}
	}
	assert.Equal(t, map[string]string{
		"deploy.yml order":         "team:infra-deploy",
		"deploy.yml up":            "team:infra-deploy",
		"deploy.yml up-after":      "team:infra-deploy",
		"pull-request.yml preview": "team:infra-preview",
	}, scopes, "the deploy's team only in production, a preview-only team for pull requests")
	assert.Equal(t, "production", load(t, "deploy.yml").Jobs["up"].Environment)
}

// The deploy key is the production environment's secret: no job outside it
// may name it.
func TestDeployKeyOnlyInProductionJobs(t *testing.T) {
	seen := 0
	for name, w := range all(t) {
		for id, j := range w.Jobs {
			if strings.Contains(j.raw, "secrets.DEPLOY_SSH_KEY") {
				seen++
				assert.Equal(t, "production", j.Environment, "%s %s uses the deploy key", name, id)
			}
		}
	}
	assert.Equal(t, 1, seen, "one job uses the deploy key")
}

var pinned = regexp.MustCompile(`^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+@[0-9a-f]{40}$`)

func TestActionsPinnedByCommit(t *testing.T) {
	for name, w := range all(t) {
		for _, line := range strings.Split(w.raw, "\n") {
			_, uses, ok := strings.Cut(line, "uses: ")
			if !ok || strings.HasPrefix(uses, "./") {
				continue
			}
			ref, comment, _ := strings.Cut(uses, " # ")
			assert.Regexp(t, pinned, ref, "%s: %q is pinned by commit", name, strings.TrimSpace(line))
			assert.Regexp(t, `^v\d+\.\d+\.\d+$`, comment, "%s: %q names the release the commit is", name, strings.TrimSpace(line))
		}
	}
}

// The CLI that runs the program is the SDK's version: go.mod's pulumi sdk.
func TestPulumiCLIIsTheSDKsVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s+github\.com/pulumi/pulumi/sdk/v3 v(\S+)$`).FindSubmatch(b)
	require.NotNil(t, m, "go.mod requires the pulumi sdk")
	n := 0
	for name, w := range all(t) {
		for id, j := range w.Jobs {
			for _, s := range j.Steps {
				if strings.HasPrefix(s.Uses, "pulumi/actions@") {
					n++
					assert.Equal(t, string(m[1]), s.With["pulumi-version"], "%s %s", name, id)
				}
			}
		}
	}
	// The CLI to read production's timing, pulumi up before the rollout,
	// the CLI alone when up runs after it, pulumi up after the rollout, and
	// pulumi preview.
	assert.Equal(t, 5, n, "every step that installs the CLI")
}

// Stacks are named org/project/stack, so a login to another organization
// can never act on a stack of the same short name there.
func TestStackNamesAreOrgQualified(t *testing.T) {
	for _, name := range []string{"deploy.yml", "pull-request.yml"} {
		w := load(t, name)
		assert.Equal(t, w.Env["PULUMI_ORG"]+"/"+infra.Project+"/prod", w.Env["MYTHEX_STACK"], "%s", name)
		for id, j := range w.Jobs {
			for _, s := range j.Steps {
				// Without a command, pulumi/actions only installs the CLI.
				if strings.HasPrefix(s.Uses, "pulumi/actions@") && s.With["command"] != "" {
					assert.Equal(t, "${{ env.MYTHEX_STACK }}", s.With["stack-name"], "%s %s", name, id)
				}
				for _, m := range regexp.MustCompile(`--stack\s+(\S+)`).FindAllStringSubmatch(s.Run, -1) {
					assert.Equal(t, `"$MYTHEX_STACK"`, m[1], "%s %s: %s", name, id, s.Name)
				}
			}
		}
	}
}

// The rollout reads stack outputs the program exports, by their names.
func TestRolloutReadsOutputsTheProgramExports(t *testing.T) {
	w := load(t, "deploy.yml")
	var run string
	for _, s := range w.Jobs["up"].Steps {
		if s.ID == "outputs" {
			run = s.Run
		}
	}
	require.NotEmpty(t, run, "the up job reads the stack outputs")
	// The heredoc of output names: "step-output stackOutput" lines.
	keys := regexp.MustCompile(`(?m)^([a-z-]+) (\w+)$`).FindAllStringSubmatch(run, -1)
	for i, k := range keys {
		keys[i] = []string{k[0], k[2]}
	}
	require.NotEmpty(t, keys)
	exported := exportedOutputs(t)
	for _, k := range keys {
		assert.Contains(t, exported, k[1], "stack output %s is exported by main.go", k[1])
	}
	for _, k := range []string{"albArnSuffix", "targetGroupArnSuffix"} {
		assert.True(t, slices.ContainsFunc(keys, func(m []string) bool { return m[1] == k }), "the 502 count needs %s", k)
	}
}

func findStep(t *testing.T, j job, name string) step {
	t.Helper()
	for _, s := range j.Steps {
		if s.Name == name {
			return s
		}
	}
	require.Failf(t, "no step", "no step named %q", name)
	return step{}
}
