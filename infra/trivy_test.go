package infra

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/lb"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/s3"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/vpc"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/mythex/infra/internal/needs"
)

// The scanner is trivy at the version CI installs (.ci/run).
const (
	trivyVersion = "0.74.0"
	trivyInstall = "GOEXPERIMENT=jsonv2 go install github.com/aquasecurity/trivy/cmd/trivy@v" + trivyVersion
	// ignoreFile is the reviewed list of accepted findings, beside the program.
	ignoreFile = "../.trivyignore.yaml"
	// realPlan is the directory of the unweakened program's export in a scan.
	realPlan = "prod"
)

// hardening is one rule trivy holds the program to, and the one setting
// that, turned off, breaks it.
type hardening struct {
	// rule is trivy's ID for it.
	rule string
	// what the program does to pass it.
	what string
	// weakened turns that setting off on the one resource that carries it.
	weakened weakening
}

// weakening is one setting turned off on one resource.
type weakening struct {
	// resource is the resource's Terraform address, as trivy names it.
	resource string
	// transform changes that resource's args and leaves every other alone.
	transform pulumi.ResourceTransformation
}

// only applies f to the props of the resource of type typ named name.
func only[T any, PT interface {
	*T
	pulumi.Input
}](typ, name string, f func(*T)) weakening {
	return weakening{TerraformType(typ) + "." + name, func(a *pulumi.ResourceTransformationArgs) *pulumi.ResourceTransformationResult {
		if a.Type != typ || a.Name != name {
			return nil
		}
		props, ok := a.Props.(PT)
		if !ok {
			panic(fmt.Sprintf("%s %s: props are %T, not %T", typ, name, a.Props, props))
		}
		weakened := *props
		f(&weakened)
		return &pulumi.ResourceTransformationResult{Props: PT(&weakened), Opts: a.Opts}
	}}
}

// hardenings lists every rule the program is hardened against that trivy
// checks. checkov's CKV_AWS_150 (deletion protection), CKV_AWS_91 (access
// logs), CKV_AWS_328 (desync mitigation) and CKV_AWS_261 (health-check path)
// have no trivy check; their tests in alb_test.go stay our reading of them.
// Neither does the access-log bucket's encryption: trivy v0.74.0 reports
// AWS-0088 neither for an encryption configuration with no rule nor for one
// with no algorithm (S3 has encrypted every new object with SSE-S3 by
// default since 2023), so production_test.go keeps our reading of it.
func hardenings() []hardening {
	return []hardening{
		{"AWS-0052", "the ALB drops invalid header fields (CKV_AWS_131)",
			only(TypeLoadBalancer, ComponentName+"-alb", func(a *lb.LoadBalancerArgs) {
				a.DropInvalidHeaderFields = pulumi.Bool(false)
			})},
		{"AWS-0054", "plain HTTP only redirects to HTTPS (CKV_AWS_2, CKV2_AWS_20)",
			only(TypeListener, ComponentName+"-http", func(a *lb.ListenerArgs) {
				a.DefaultActions = lb.ListenerDefaultActionArray{&lb.ListenerDefaultActionArgs{
					Type: pulumi.String("fixed-response"),
					FixedResponse: &lb.ListenerDefaultActionFixedResponseArgs{
						ContentType: pulumi.String("text/plain"),
						StatusCode:  pulumi.String("200"),
					},
				}}
			})},
		{"AWS-0047", "HTTPS takes TLS 1.3 and 1.2 with forward secrecy only (CKV_AWS_103); checkov accepts the Ext1 policy, trivy does not",
			only(TypeListener, ComponentName+"-https", func(a *lb.ListenerArgs) {
				a.SslPolicy = pulumi.String("ELBSecurityPolicy-TLS13-1-2-Ext1-2021-06")
			})},
		{"AWS-0099", "every security group says what it is for",
			only(TypeSecurityGroup, ComponentName+"-alb-sg", func(a *ec2.SecurityGroupArgs) {
				a.Description = nil
			})},
		{"AWS-0124", "every security group rule says what it is for",
			only(TypeIngressRule, ComponentName+"-alb-in-https-ipv4", func(a *vpc.SecurityGroupIngressRuleArgs) {
				a.Description = nil
			})},
		{"AWS-0104", "the ALB sends only to the servers' group, never to any address",
			only(TypeEgressRule, ComponentName+"-alb-out-app", func(a *vpc.SecurityGroupEgressRuleArgs) {
				a.ReferencedSecurityGroupId = nil
				a.CidrIpv4 = pulumi.String(anywhereIPv4)
			})},
		{"AWS-0086", "the access-log bucket blocks public ACLs",
			only(TypeBucketPublicAccess, ComponentName+"-access-logs-private", func(a *s3.BucketPublicAccessBlockArgs) {
				a.BlockPublicAcls = pulumi.Bool(false)
			})},
		{"AWS-0087", "the access-log bucket blocks public policies",
			only(TypeBucketPublicAccess, ComponentName+"-access-logs-private", func(a *s3.BucketPublicAccessBlockArgs) {
				a.BlockPublicPolicy = pulumi.Bool(false)
			})},
		{"AWS-0091", "the access-log bucket ignores public ACLs",
			only(TypeBucketPublicAccess, ComponentName+"-access-logs-private", func(a *s3.BucketPublicAccessBlockArgs) {
				a.IgnorePublicAcls = pulumi.Bool(false)
			})},
		{"AWS-0093", "the access-log bucket restricts public buckets",
			only(TypeBucketPublicAccess, ComponentName+"-access-logs-private", func(a *s3.BucketPublicAccessBlockArgs) {
				a.RestrictPublicBuckets = pulumi.Bool(false)
			})},
	}
}

// runWeakened runs the stack's program as `pulumi up` would (Build, prod
// config) with weaken registered on the stack, so it sees every resource
// before it is registered.
func runWeakened(t *testing.T, weaken pulumi.ResourceTransformation) []PlannedResource {
	t.Helper()
	rec := &Recorder{}
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		if weaken != nil {
			if err := ctx.RegisterStackTransformation(weaken); err != nil {
				return err
			}
		}
		_, err := Build(ctx, Prod())
		return err
	}, pulumi.WithMocks(Project, "prod", rec), WithConfig(prodConfig(t)))
	require.NoError(t, err, "the program runs under the mock engine")
	return rec.Resources()
}

// trivyFinding is one check's verdict, as `trivy config --format json`
// reports it.
type trivyFinding struct {
	ID            string
	Status        string // FAIL or PASS
	CauseMetadata struct {
		Resource string
	}
}

type trivyReport struct {
	Results []struct {
		Target            string
		Misconfigurations []trivyFinding
	}
}

// trivyVerdict is what trivy said about one exported plan: the resources
// failing each check.
type trivyVerdict struct {
	failed map[string][]string
}

func (v trivyVerdict) String() string {
	return fmt.Sprintf("failed %v", v.failed)
}

// findings are the plan's failures as "check resource" pairs, sorted.
func (v trivyVerdict) findings() []string {
	out := []string{}
	for id, rs := range v.failed {
		for _, r := range rs {
			out = append(out, id+" "+r)
		}
	}
	slices.Sort(out)
	return out
}

func (v trivyVerdict) failedIDs() []string {
	ids := []string{}
	for id := range v.failed {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// trivyBinary finds trivy at the pinned version on PATH or in GOPATH/bin, or
// fails the test at once with the command that installs it.
func trivyBinary(t *testing.T) string {
	t.Helper()
	needs.Have(t, needs.Scanner)
	bin, err := exec.LookPath("trivy")
	if err != nil {
		bin = filepath.Join(build.Default.GOPATH, "bin", "trivy")
		if _, statErr := os.Stat(bin); statErr != nil {
			t.Fatalf("trivy v%s is not installed; install it with: %s", trivyVersion, trivyInstall)
		}
	}
	if v := trivyBinaryVersion(bin); v != trivyVersion {
		t.Fatalf("%s is trivy %q, not v%s; install it with: %s", bin, v, trivyVersion, trivyInstall)
	}
	return bin
}

// trivyBinaryVersion is the version trivy reports, or, for one built with go
// install (which reports "dev"), the module version in its build info.
func trivyBinaryVersion(bin string) string {
	out, _ := exec.Command(bin, "--version").Output()
	if m := regexp.MustCompile(`(?m)^Version: (\S+)$`).FindSubmatch(out); m != nil && string(m[1]) != "dev" {
		return string(m[1])
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil || info.Main.Path != "github.com/aquasecurity/trivy" {
		return "unknown"
	}
	return strings.TrimPrefix(info.Main.Version, "v")
}

// writePlans exports each plan to a new dir/<name>/main.tf and returns dir.
func writePlans(t *testing.T, plans map[string][]PlannedResource) string {
	t.Helper()
	dir := t.TempDir()
	for name, rs := range plans {
		doc, err := TerraformHCL(rs)
		require.NoError(t, err, "export plan %s", name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, name), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name, "main.tf"), doc, 0o600))
	}
	return dir
}

// runTrivy runs `trivy config` over dir with args, as .ci/run does, plus a
// JSON report, and returns its exit code and trivy's verdicts by plan (the
// first directory under dir).
func runTrivy(t *testing.T, bin, dir string, args ...string) (int, map[string]trivyVerdict) {
	t.Helper()
	args = append([]string{"config", "--skip-check-update", "--quiet", "--format", "json", "--cache-dir", t.TempDir()}, args...)
	cmd := exec.Command(bin, append(args, ".")...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err, "run trivy")
	}
	var report trivyReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "trivy's JSON report (exit %d): %s", code, stderr.String())

	out := map[string]trivyVerdict{}
	for _, r := range report.Results {
		// Failures are reported on the file, passes on its directory.
		name, file, _ := strings.Cut(filepath.ToSlash(r.Target), "/")
		require.Contains(t, []string{"", "main.tf"}, file, "trivy reported on %s, which is no exported plan", r.Target)
		v, ok := out[name]
		if !ok {
			v = trivyVerdict{failed: map[string][]string{}}
			out[name] = v
		}
		for _, m := range r.Misconfigurations {
			switch m.Status {
			case "FAIL":
				v.failed[m.ID] = append(v.failed[m.ID], m.CauseMetadata.Resource)
			case "PASS": // reported per check, not per resource
			default:
				require.Failf(t, "unknown status", "%s: %s status %q", r.Target, m.ID, m.Status)
			}
		}
	}
	return code, out
}

var (
	scanOnce   sync.Once
	scanResult map[string]trivyVerdict
	scanFailed bool
)

// trivyVerdicts is trivy's verdict, with no finding accepted, on the real
// program (plan "prod") and on each weakened one (named by the rule it
// breaks): one trivy run over all of them, shared by every test in the
// package.
func trivyVerdicts(t *testing.T) map[string]trivyVerdict {
	t.Helper()
	bin := trivyBinary(t)
	scanOnce.Do(func() {
		scanFailed = true
		plans := map[string][]PlannedResource{realPlan: runWeakened(t, nil)}
		for _, h := range hardenings() {
			plans[h.rule] = runWeakened(t, h.weakened.transform)
		}
		code, v := runTrivy(t, bin, writePlans(t, plans), "--include-non-failures")
		require.Zero(t, code, "trivy's exit code with no --exit-code")
		for name := range plans {
			require.Contains(t, v, name, "trivy scanned plan %s (a plan it skips would pass every check)", name)
		}
		scanResult = v
		scanFailed = false
	})
	if scanFailed {
		t.Fatal("the shared trivy scan failed (see the first test that ran it)")
	}
	return scanResult
}

// requireTrivyVerdict checks rule against trivy: the real program does not
// fail it on the resource that carries the setting, and the program with
// that one setting turned off fails it there, and nothing else the real
// program does not fail.
func requireTrivyVerdict(t *testing.T, rule string) {
	t.Helper()
	i := slices.IndexFunc(hardenings(), func(h hardening) bool { return h.rule == rule })
	require.GreaterOrEqual(t, i, 0, "%s is in hardenings()", rule)
	h := hardenings()[i]
	finding := rule + " " + h.weakened.resource
	all := trivyVerdicts(t)
	real, weak := all[realPlan].findings(), all[rule].findings()
	assert.NotContains(t, real, finding, "trivy passes the real program on %s: %s", finding, h.what)
	assert.Equal(t, slices.Sorted(slices.Values(append(slices.Clone(real), finding))), weak,
		"with that one setting off (%s), trivy reports %s and nothing else new", h.what, finding)
}

func TestTrivyFailsEachWeakenedProgramAndPassesTheReal(t *testing.T) {
	for _, h := range hardenings() {
		t.Run(h.rule, func(t *testing.T) {
			requireTrivyVerdict(t, h.rule)
		})
	}
}

// ignoreEntry is one accepted finding in .trivyignore.yaml. resources is
// ours (trivy ignores keys it does not know, and accepts a check on every
// resource): the tests hold each acceptance to the resources it names.
type ignoreEntry struct {
	ID        string   `yaml:"id"`
	Statement string   `yaml:"statement"`
	Resources []string `yaml:"resources"`
	Paths     []string `yaml:"paths"`
}

// Every entry of the ignore file has its reason and answers findings trivy
// makes on the real program, on exactly the resources it names; nothing else
// is accepted.
func TestTrivyIgnoreFileAcceptsEachFindingWithItsReason(t *testing.T) {
	real := trivyVerdicts(t)[realPlan]
	raw, err := os.ReadFile(ignoreFile)
	require.NoError(t, err)
	var cfg struct {
		Misconfigurations []ignoreEntry `yaml:"misconfigurations"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&cfg), "%s holds misconfigurations only, each with id, statement, resources and paths", ignoreFile)

	accepted := []string{}
	var ids []string
	for _, e := range cfg.Misconfigurations {
		assert.NotEmpty(t, strings.TrimSpace(e.Statement), "%s: %s is accepted without a reason", ignoreFile, e.ID)
		assert.NotEmpty(t, e.Resources, "%s: %s names no resource", ignoreFile, e.ID)
		assert.NotContains(t, ids, e.ID, "%s: %s is listed twice (one entry a check, its resources listed)", ignoreFile, e.ID)
		ids = append(ids, e.ID)
		for _, r := range e.Resources {
			accepted = append(accepted, e.ID+" "+r)
		}
	}
	slices.Sort(accepted)
	assert.Equal(t, real.findings(), accepted,
		"%s accepts exactly the findings trivy makes on the real program: fix a finding not listed or accept it with its reason; remove an entry no finding needs", ignoreFile)
	assert.Contains(t, accepted, "AWS-0053 aws_lb."+ComponentName+"-alb", "the internet-facing ALB is accepted, with its reason")
}

// The scan as .ci/run runs it: with the ignore file, trivy exits 0 on the
// real program and 1 on a finding not accepted, naming it.
func TestTrivyWithTheIgnoreFileFailsOnlyOnUnacceptedFindings(t *testing.T) {
	bin := trivyBinary(t)
	ignore, err := filepath.Abs(ignoreFile)
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		weaken pulumi.ResourceTransformation
		code   int
		failed []string
	}{
		{"real", nil, 0, []string{}},
		{"AWS-0052", hardenings()[0].weakened.transform, 1, []string{"AWS-0052"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writePlans(t, map[string][]PlannedResource{tc.name: runWeakened(t, tc.weaken)})
			code, v := runTrivy(t, bin, dir, "--exit-code", "1", "--ignorefile", ignore)
			assert.Equal(t, tc.code, code, "trivy's exit code: %s", v[tc.name])
			assert.Equal(t, tc.failed, v[tc.name].failedIDs(), "findings not accepted")
		})
	}
}
