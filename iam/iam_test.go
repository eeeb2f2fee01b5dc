package iam

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

const root = ".."

// strings1 is a JSON value that is one string or a list of them, as IAM
// takes Action and Resource.
type strings1 []string

func (s *strings1) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*s = many
	return nil
}

type statement struct {
	Sid       string
	Effect    string
	Principal map[string]string
	Action    strings1
	NotAction strings1
	Resource  strings1
	Condition map[string]map[string]string
}

type document struct {
	Version   string
	Statement []statement
}

func loadDoc(t *testing.T, name string) document {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var d document
	require.NoError(t, dec.Decode(&d), "%s is an IAM policy document", name)
	assert.Equal(t, "2012-10-17", d.Version, name)
	return d
}

func stackConfig(t *testing.T) (infra.StackFile, infra.StackConfig) {
	t.Helper()
	f, err := infra.LoadStackFile(filepath.Join(root, "Pulumi.prod.yaml"))
	require.NoError(t, err)
	c, err := infra.ParseStackConfig(f.Get)
	require.NoError(t, err)
	return f, c
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

// The role trusts GitHub's OIDC provider for one subject: a job of this
// repository in the production environment (whose branch rule admits main
// only, docs/runbook.md), asking for an STS token.
func TestTrustIsTheProductionEnvironmentOnly(t *testing.T) {
	d := loadDoc(t, "deploy-role-trust.json")
	require.Len(t, d.Statement, 1)
	s := d.Statement[0]
	_, cfg := stackConfig(t)
	account := strings.Split(cfg.CertificateARN, ":")[4]
	assert.Equal(t, "Allow", s.Effect)
	assert.Equal(t, map[string]string{"Federated": "arn:aws:iam::" + account + ":oidc-provider/token.actions.githubusercontent.com"}, s.Principal,
		"GitHub's OIDC provider in the stack's account (the account of Pulumi.prod.yaml's certificate)")
	assert.Equal(t, strings1{"sts:AssumeRoleWithWebIdentity"}, s.Action)
	assert.Equal(t, map[string]map[string]string{"StringEquals": {
		"token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
		"token.actions.githubusercontent.com:sub": "repo:" + repo(t) + ":environment:production",
	}}, s.Condition, "exact subject and audience: no StringLike, no wildcard")
}

// call is one AWS action the code needs, and where the need comes from.
type call struct{ action, source string }

// programCalls are the actions of every resource type and provider function
// the Pulumi program registers for the prod stack, under the mock engine.
func programCalls(t *testing.T) ([]call, []infra.PlannedResource) {
	t.Helper()
	f, _ := stackConfig(t)
	rec := &infra.Recorder{}
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		_, err := infra.Build(ctx, infra.Prod())
		return err
	}, pulumi.WithMocks(infra.Project, f.Stack, rec), infra.WithConfig(f.Config))
	require.NoError(t, err)
	var out []call
	for _, r := range rec.Resources() {
		if !r.Custom {
			continue
		}
		actions, ok := ResourceActions[r.Type]
		require.True(t, ok, "the program registers %s (%s): add its actions to iam.ResourceActions", r.Type, r.Name)
		for _, a := range actions {
			out = append(out, call{a, "program: " + r.Type})
		}
	}
	for _, c := range rec.Calls() {
		actions, ok := InvokeActions[c.Token]
		require.True(t, ok, "the program calls %s: add its actions to iam.InvokeActions", c.Token)
		for _, a := range actions {
			out = append(out, call{a, "program: " + c.Token})
		}
	}
	return out, rec.Resources()
}

// shellFiles are the deploy workflow and the server-side and rollout hooks:
// where the job and the rollout call the AWS CLI.
func shellFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(root, ".github", "workflows", "deploy.yml")}
	entries, err := os.ReadDir(filepath.Join(root, "hooks"))
	require.NoError(t, err)
	for _, e := range entries {
		if !e.IsDir() && !strings.HasSuffix(e.Name(), ".go") {
			files = append(files, filepath.Join(root, "hooks", e.Name()))
		}
	}
	return files
}

// cliCall is `aws SERVICE VERB-NOUN`: an API call (`require_commands aws
// jq timeout` is not one).
var cliCall = regexp.MustCompile(`\baws\s+([a-z0-9]+)\s+([a-z][a-z0-9]*-[a-z0-9-]+)`)

// cliCalls are the `aws SERVICE COMMAND` invocations outside comments.
func cliCalls(t *testing.T) []call {
	t.Helper()
	var out []call
	for _, f := range shellFiles(t) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, m := range cliCall.FindAllStringSubmatch(line, -1) {
				prefix, ok := CLIServices[m[1]]
				require.True(t, ok, "%s calls `aws %s %s`: add the service to iam.CLIServices", f, m[1], m[2])
				var op strings.Builder
				for _, w := range strings.Split(m[2], "-") {
					op.WriteString(strings.ToUpper(w[:1]) + w[1:])
				}
				action := prefix + ":" + op.String()
				rel, _ := filepath.Rel(root, f)
				out = append(out, call{action, rel + ": aws " + m[1] + " " + m[2]})
				for _, extra := range CLIExtraActions[action] {
					out = append(out, call{extra, rel + ": aws " + m[1] + " " + m[2]})
				}
			}
		}
	}
	return out
}

// sdkCalls are the aws-sdk-go-v2 operations the Go code calls: every
// OPInput, OPOutput and NewOPPaginator of a service package it imports.
func sdkCalls(t *testing.T) []call {
	t.Helper()
	var out []call
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || strings.HasPrefix(d.Name(), "_")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		src := string(b)
		for pkg, prefix := range SDKServices {
			if !strings.Contains(src, `"github.com/aws/aws-sdk-go-v2/service/`+pkg+`"`) {
				continue
			}
			re := regexp.MustCompile(`\b` + pkg + `\.(?:New(\w+)Paginator|(\w+)(?:Input|Output))\b`)
			for _, m := range re.FindAllStringSubmatch(src, -1) {
				op := m[1] + m[2]
				rel, _ := filepath.Rel(root, path)
				out = append(out, call{prefix + ":" + op, rel + ": " + pkg + "." + op})
			}
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// The policy allows every call the program, the workflow and the rollout
// make, and nothing else; no action is a wildcard.
func TestPolicyAllowsEveryCallAndNothingElse(t *testing.T) {
	d := loadDoc(t, "deploy-role-policy.json")
	allowed := map[string][]statement{}
	for _, s := range d.Statement {
		assert.Equal(t, "Allow", s.Effect, "%s", s.Sid)
		assert.Empty(t, s.NotAction, "%s: NotAction allows everything else", s.Sid)
		for _, a := range s.Action {
			assert.NotContains(t, a, "*", "%s: %s is a wildcard", s.Sid, a)
			allowed[a] = append(allowed[a], s)
		}
	}
	prog, _ := programCalls(t)
	cli, sdk := cliCalls(t), sdkCalls(t)
	// The calls the issue names must be found, or the derivation is broken.
	for _, want := range []call{
		{"elasticloadbalancing:DescribeTargetHealth", "rollout/elb.go: elasticloadbalancingv2.DescribeTargetHealth"},
		{"ssm:StartSession", ".github/workflows/deploy.yml: aws ssm start-session"},
		{"cloudwatch:GetMetricData", "cmd/albmetrics/main.go: cloudwatch.GetMetricData"},
		{"iam:CreateServiceLinkedRole", "program: aws:lb/loadBalancer:LoadBalancer"},
	} {
		assert.Contains(t, slices.Concat(prog, cli, sdk), want)
	}
	needed := map[string][]string{}
	for _, c := range slices.Concat(prog, cli, sdk) {
		if !slices.Contains(needed[c.action], c.source) {
			needed[c.action] = append(needed[c.action], c.source)
		}
	}
	var missing, extra []string
	for a, sources := range needed {
		if len(allowed[a]) == 0 {
			missing = append(missing, a+" (needed by "+strings.Join(sources, "; ")+")")
		}
	}
	for a := range allowed {
		if len(needed[a]) == 0 {
			extra = append(extra, a)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	assert.Empty(t, missing, "calls the policy does not allow")
	assert.Empty(t, extra, "actions the policy allows that no call needs")
}

// Where a call names a resource, the policy names it too: the stack's bucket,
// its load balancer, target group and listeners, its servers and the SSH
// document; the service-linked role only for ELB.
func TestPolicyResourcesAreTheStacks(t *testing.T) {
	d := loadDoc(t, "deploy-role-policy.json")
	_, cfg := stackConfig(t)
	_, rs := programCalls(t)
	bySid := map[string]statement{}
	for _, s := range d.Statement {
		bySid[s.Sid] = s
		for _, a := range s.Action {
			switch {
			case strings.HasPrefix(a, "s3:"):
				assert.Equal(t, strings1{"arn:aws:s3:::" + cfg.AccessLogsBucket}, s.Resource, "%s: %s only on the stack's access-log bucket", s.Sid, a)
			case a == "ssm:StartSession":
				var want strings1
				for _, id := range cfg.InstanceIDs {
					want = append(want, "arn:aws:ec2:*:*:instance/"+id)
				}
				want = append(want, "arn:aws:ssm:*::document/AWS-StartSSHSession")
				assert.ElementsMatch(t, want, s.Resource, "%s: sessions to the stack's servers, by SSH only", s.Sid)
			case a == "ssm:TerminateSession" || a == "ssm:ResumeSession":
				assert.Equal(t, strings1{"arn:aws:ssm:*:*:session/${aws:userid}-*"}, s.Resource, "%s: %s of the role's own sessions", s.Sid, a)
			case a == "iam:CreateServiceLinkedRole":
				assert.Equal(t, strings1{"arn:aws:iam::*:role/aws-service-role/elasticloadbalancing.amazonaws.com/AWSServiceRoleForElasticLoadBalancing"}, s.Resource)
				assert.Equal(t, map[string]map[string]string{"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}}, s.Condition,
					"%s: ELB's service-linked role and no other", s.Sid)
			case strings.HasPrefix(a, "elasticloadbalancing:") && !strings.HasPrefix(a, "elasticloadbalancing:Describe"):
				// Pulumi names each resource NAME-<random>; the ARNs carry it.
				var want strings1
				for _, r := range rs {
					switch r.Type {
					case "aws:lb/loadBalancer:LoadBalancer":
						want = append(want, "arn:aws:elasticloadbalancing:*:*:loadbalancer/app/"+r.Name+"-*/*",
							"arn:aws:elasticloadbalancing:*:*:listener/app/"+r.Name+"-*/*/*")
					case "aws:lb/targetGroup:TargetGroup":
						want = append(want, "arn:aws:elasticloadbalancing:*:*:targetgroup/"+r.Name+"-*/*")
					}
				}
				assert.ElementsMatch(t, want, s.Resource, "%s: %s only on the stack's load balancer, listeners and target group", s.Sid, a)
			default:
				// Describe calls and EC2's security-group calls take no
				// resource the stack file names.
				assert.Equal(t, strings1{"*"}, s.Resource, "%s: %s", s.Sid, a)
			}
		}
	}
	_, ok := bySid["ELBServiceLinkedRole"]
	assert.True(t, ok, "a statement ELBServiceLinkedRole: a fresh account's first pulumi up creates ELB's service-linked role")
}
