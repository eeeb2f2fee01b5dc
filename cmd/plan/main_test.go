package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

const (
	repoRoot      = "../.."
	prodStackFile = repoRoot + "/Pulumi.prod.yaml"
)

func loadProd(t *testing.T) infra.StackFile {
	t.Helper()
	stack, err := infra.LoadStackFile(prodStackFile)
	require.NoError(t, err)
	return stack
}

// planProdResources runs the prod program under the mock engine as the
// command does and returns what it registered.
func planProdResources(t *testing.T) []infra.PlannedResource {
	t.Helper()
	stack := loadProd(t)
	rec := &infra.Recorder{}
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		_, err := infra.Build(ctx, infra.Prod())
		return err
	}, pulumi.WithMocks(infra.Project, stack.Stack, rec), infra.WithConfig(stack.Config))
	require.NoError(t, err)
	return rec.Resources()
}

// markLine matches the plan's line for one timing-derived input.
func markLine(input, value, from string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^    ` + regexp.QuoteMeta(input) + ` +` + regexp.QuoteMeta(value) +
		` +← ` + regexp.QuoteMeta(from) + `( = .*)?$`)
}

func secs(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }

func TestPlanMarksEveryTimingInputWithItsField(t *testing.T) {
	slow := infra.Prod()
	slow.HealthCheckInterval = 10 * time.Second
	slow.HealthCheckTimeout = 5 * time.Second
	slow.UnhealthyThreshold = 3
	slow.HealthyThreshold = 4
	slow.Drain = 40 * time.Second
	slow.MaxDrain = 40 * time.Second
	slow.StopGracePeriod = 55 * time.Second
	slow.DeregistrationDelay = 45 * time.Second
	slow.LBIdleTimeout = 120 * time.Second
	slow.AppKeepAlive = 150 * time.Second
	slow.LockWait = 130 * time.Second
	require.NoError(t, slow.Validate(), "the second timing must be valid")

	for name, tm := range map[string]infra.Timing{"prod": infra.Prod(), "slow": slow} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			require.NoError(t, writePlan(&out, tm, loadProd(t), ""))
			plan := out.String()
			want := []struct{ input, value, from string }{
				{"idleTimeout", secs(tm.LBIdleTimeout), "Timing.LBIdleTimeout = " + contract.FormatDuration(tm.LBIdleTimeout)},
				{"healthCheck.interval", secs(tm.HealthCheckInterval), "Timing.HealthCheckInterval = " + contract.FormatDuration(tm.HealthCheckInterval)},
				{"healthCheck.timeout", secs(tm.HealthCheckTimeout), "Timing.HealthCheckTimeout = " + contract.FormatDuration(tm.HealthCheckTimeout)},
				{"healthCheck.healthyThreshold", strconv.Itoa(tm.HealthyThreshold), "Timing.HealthyThreshold = " + strconv.Itoa(tm.HealthyThreshold)},
				{"healthCheck.unhealthyThreshold", strconv.Itoa(tm.UnhealthyThreshold), "Timing.UnhealthyThreshold = " + strconv.Itoa(tm.UnhealthyThreshold)},
				{"healthCheck.path", strconv.Quote(infra.HealthPath), "HealthPath"},
				{"healthCheck.matcher", strconv.Quote(strconv.Itoa(infra.HealthyStatus)), "HealthyStatus"},
				{"deregistrationDelay", secs(tm.DeregistrationDelay), "Timing.DeregistrationDelay = " + contract.FormatDuration(tm.DeregistrationDelay)},
			}
			require.Len(t, want, len(infra.TimingInputs()), "every timing input is checked")
			for _, w := range want {
				assert.Regexp(t, markLine(w.input, w.value, w.from), plan, "%s timing: %s marked with %s", name, w.input, w.from)
			}
			resources, _, found := strings.Cut(plan, "\nStack outputs ")
			require.True(t, found, "the plan has a stack outputs section")
			assert.Equal(t, len(want), len(regexp.MustCompile(`(?m)^    .*← `).FindAllString(resources, -1)), "only timing-derived inputs are marked")
		})
	}
}

func TestPlanSaysWhatItIsAndListsEverything(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writePlan(&out, infra.Prod(), loadProd(t), ""))
	plan := out.String()

	assert.True(t, strings.HasPrefix(plan, "Dry plan of stack prod (project mythex-infra) under the Pulumi mock engine: no AWS calls, not a preview."),
		"the first line says plainly what this is:\n%s", plan)

	heads := regexp.MustCompile(`(?m)^\+ (\S+) (\S+) \((component|AWS resource), parent ([^,\s)]+)(, protected)?(, retained on delete)?\)$`).FindAllStringSubmatch(plan, -1)
	require.NotEmpty(t, heads)
	assert.Equal(t, []string{infra.ComponentType, infra.ComponentName}, heads[0][1:3], "the component comes first")
	types := map[string]int{}
	for _, h := range heads[1:] {
		types[h[1]]++
		assert.Equal(t, "AWS resource", h[3], "%s %s", h[1], h[2])
		assert.Equal(t, infra.ComponentName, h[4], "%s %s is the component's child", h[1], h[2])
	}
	assert.Equal(t, map[string]int{
		infra.TypeSecurityGroup: 2, infra.TypeIngressRule: 5, infra.TypeEgressRule: 3, infra.TypeLoadBalancer: 1,
		infra.TypeTargetGroup: 1, infra.TypeListener: 2, infra.TypeAttachment: 2, infra.TypeENIAttachment: 2,
		infra.TypeBucket: 1, infra.TypeBucketEncryption: 1, infra.TypeBucketPublicAccess: 1, infra.TypeBucketPolicy: 1,
		infra.TypeBucketLifecycle: 1,
	}, types, "resources listed by type")
	// The access logs' lifecycle, with the stack's days.
	assert.Regexp(t, `(?m)^\+ `+regexp.QuoteMeta(infra.TypeBucketLifecycle)+` mythex-access-logs-lifecycle \(AWS resource, parent mythex, protected\)\n`+
		`    bucket +"dry-plan-mythex-access-logs"\n    rules\.0\.expiration\.days +90\n    rules\.0\.filter\.prefix +"mythex-infra/prod/"\n`, plan)

	assert.Contains(t, plan, "\nStack outputs ")
	assert.Regexp(t, `(?m)^  albDnsName +mythex-alb\.dry-plan\.invalid$`, plan)
	assert.Regexp(t, `(?m)^  timing\.drain +15s$`, plan)
	// The contract, as the timing command prints it.
	var c bytes.Buffer
	fleet, err := contract.StackFleet(loadProd(t))
	require.NoError(t, err)
	require.NoError(t, contract.Write(&c, infra.Prod(), fleet))
	assert.Contains(t, plan, strings.TrimSpace(trimLines(c.String())), "the contract follows the resources")

	last := regexp.MustCompile(`Plan: (\d+) resources to create in stack prod \((\d+) AWS resources under 1 component\)\. Dry plan only: nothing was sent to AWS\.\n$`).
		FindStringSubmatch(plan)
	require.NotNil(t, last, "the plan ends with the count")
	assert.Equal(t, strconv.Itoa(len(heads)), last[1], "count of resources")
	assert.Equal(t, strconv.Itoa(len(heads)-1), last[2], "count of AWS resources")
	assert.NotRegexp(t, `(?m) +$`, plan, "no trailing spaces")
}

// The plan shows how the rollout takes the stack's own servers through a
// release: the batches, the time a sound rollout takes and the rollback's
// bound, at the rollout's default --max-unavailable.
func TestPlanShowsTheFleetRollout(t *testing.T) {
	prod := loadProd(t)
	three := infra.StackFile{Stack: "staging", Config: maps.Clone(prod.Config)}
	three.Config[infra.KeyInstanceIDs] = `["i-0123456789abcdef0","i-0123456789abcdef1","i-0123456789abcdef2"]`
	for _, tt := range []struct {
		stack   infra.StackFile
		servers int
		head    string
	}{
		{prod, 2, "Fleet rollout: stack prod's 2 servers (mythex-infra:instanceIds in Pulumi.prod.yaml) at --max-unavailable 1, the default"},
		{three, 3, "Fleet rollout: stack staging's 3 servers (mythex-infra:instanceIds in Pulumi.staging.yaml) at --max-unavailable 1, the default"},
	} {
		t.Run(tt.stack.Stack, func(t *testing.T) {
			var out bytes.Buffer
			require.NoError(t, writePlan(&out, infra.Prod(), tt.stack, ""))
			plan := out.String()
			assert.Contains(t, plan, "\n"+tt.head+"\n")
			tm, k, n := infra.Prod(), tt.servers, infra.DefaultMaxUnavailable
			for _, row := range []struct{ name, value string }{
				{"RolloutBatches", strconv.Itoa(infra.RolloutBatches(k, n))},
				{"RolloutBatchesMax", strconv.Itoa(infra.RolloutBatchesMax(k, n))},
				{"RollbackBatchesMax", strconv.Itoa(infra.RollbackBatchesMax(k, n))},
				{"RolloutMin", contract.FormatDuration(tm.RolloutMin(k, n))},
				{"RolloutMax", contract.FormatDuration(tm.RolloutMax(k, n))},
				{"RollbackBound", contract.FormatDuration(tm.RollbackBound(k, n))},
				{"FailedRolloutMax", contract.FormatDuration(tm.FailedRolloutMax(k, n))},
			} {
				call := fmt.Sprintf("%s(%d, %d)", row.name, k, n)
				assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(call)+` +`+regexp.QuoteMeta(row.value)+` +`+row.name+` `, plan)
			}
		})
	}
}

// What a reviewer checks before the first `pulumi up`: the bucket policy that
// lets the region's log writer in, which resources are protected, and the
// outputs a Route 53 alias and CloudWatch need.
func TestPlanShowsBucketPolicyProtectionsAndOutputs(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writePlan(&out, infra.Prod(), loadProd(t), ""))
	plan := out.String()

	policy := regexp.MustCompile(`(?m)^\+ ` + regexp.QuoteMeta(infra.TypeBucketPolicy) + ` mythex-access-logs-policy \(AWS resource, parent mythex, protected\)\n    bucket +"dry-plan-mythex-access-logs"\n    policy +(".*")$`).
		FindStringSubmatch(plan)
	require.NotNil(t, policy, "the plan lists the bucket policy with its document:\n%s", plan)
	doc, err := strconv.Unquote(policy[1])
	require.NoError(t, err)
	assert.Contains(t, doc, `"Principal":{"AWS":"arn:aws:iam::dry-plan-elb-account-of-us-east-1:root"}`, "us-east-1 logs are written by its ELB account")
	assert.Contains(t, doc, `"Resource":"arn:aws:s3:::mythex-placeholder-alb-access-logs/mythex-infra/prod/AWSLogs/`+infra.DryAccountID+`/*"`)
	assert.Regexp(t, `(?m)^\+ `+regexp.QuoteMeta(infra.TypeBucketEncryption)+` mythex-access-logs-sse .*\n(    .*\n)*    rules\.0\.applyServerSideEncryptionByDefault\.sseAlgorithm +"AES256"$`, plan)

	for _, head := range []string{
		infra.TypeLoadBalancer + " mythex-alb (AWS resource, parent mythex, protected)",
		infra.TypeTargetGroup + " mythex-tg (AWS resource, parent mythex, protected)",
		infra.TypeListener + " mythex-https (AWS resource, parent mythex, protected)",
		infra.TypeListener + " mythex-http (AWS resource, parent mythex, protected)",
		infra.TypeSecurityGroup + " mythex-servers-sg (AWS resource, parent mythex, protected)",
		infra.TypeBucket + " mythex-access-logs (AWS resource, parent mythex, protected, retained on delete)",
		infra.TypeAttachment + " mythex-target-i-0123456789abcdef0 (AWS resource, parent mythex)",
		infra.TypeENIAttachment + " mythex-servers-sg-i-0123456789abcdef0 (AWS resource, parent mythex)",
	} {
		assert.Contains(t, plan, "\n+ "+head+"\n")
	}
	for _, o := range []string{
		`albZoneId +dry-plan-zone-mythex-alb`, `albArn +arn:dry-plan:mythex-alb`, `albArnSuffix +app/mythex-alb/dry-plan`,
		`targetGroupArnSuffix +targetgroup/mythex-tg/dry-plan`, `httpsListenerArn +arn:dry-plan:mythex-https`,
		`httpListenerArn +arn:dry-plan:mythex-http`, `accessLogsBucket +mythex-placeholder-alb-access-logs`,
		`accessLogsPrefix +mythex-infra/prod`,
	} {
		assert.Regexp(t, `(?m)^  `+o+`$`, plan)
	}
}

func TestPlanRefusesAnInvalidTiming(t *testing.T) {
	broken := infra.Prod()
	broken.Drain = 12 * time.Second
	broken.DeregistrationDelay = 5 * time.Second
	var out bytes.Buffer
	err := writePlan(&out, broken, loadProd(t), "")
	require.Error(t, err)
	var ite *infra.InvalidTimingError
	assert.True(t, errors.As(err, &ite), "the error is the timing's own: %v", err)
	for _, want := range []string{
		"invalid timing: 2 rule(s) broken",
		"drain-outlasts-detection: Drain 12s must exceed worst-case detection 13s",
		"deregistration-covers-shutdown: DeregistrationDelay 5s must cover ShutdownTimeout 10s",
	} {
		assert.Contains(t, err.Error(), want)
	}
	assert.Zero(t, out.Len(), "nothing is printed for a plan that cannot be made")
}

// The binary, end to end: exit codes, stdout and stderr as an operator or CI
// sees them.
func TestPlanCommand(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "plan")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "build the plan command")

	project, err := os.ReadFile(filepath.Join(repoRoot, "Pulumi.yaml"))
	require.NoError(t, err)
	bad := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bad, "Pulumi.yaml"), project, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(bad, "Pulumi.prod.yaml"), []byte(`config:
  aws:region: us-east-1
  mythex-infra:vpcId: vpc-0123456789abcdef0
  mythex-infra:publicSubnetIds:
    - subnet-0123456789abcdef0
  mythex-infra:ipAddressType: ipv4
  mythex-infra:certificateArn: arn:aws:acm:eu-west-1:123456789012:certificate/00000000-0000-4000-8000-000000000000
  mythex-infra:accessLogsBucket: Mythex_Logs
  mythex-infra:accessLogsExpireDays: 0
  mythex-infra:appPort: 70000
  mythex-infra:instanceIds:
    - i-0123456789abcdef0
    - i-0123456789abcdef0
`), 0o600))

	out := t.TempDir()
	export := filepath.Join(out, "plan", "prod.tf") // its directory is made
	badExport := filepath.Join(out, "bad.tf")
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderrHas  []string
		stdoutHas  string
		stdoutNone bool
		// export is the -tf file the run must leave (or, with
		// noExport, must not).
		export   string
		noExport bool
	}{
		{
			name: "prod", code: 0,
			stdoutHas: "Dry plan of stack prod (project mythex-infra) under the Pulumi mock engine: no AWS calls, not a preview.",
		},
		{
			name: "prod with export", args: []string{"-tf", export}, code: 0, export: export,
			stdoutHas: "Dry plan of stack prod (project mythex-infra) under the Pulumi mock engine: no AWS calls, not a preview.",
		},
		{
			name: "export to a file scanners skip", args: []string{"-tf", filepath.Join(out, "plan.tf.json")}, code: 2, stdoutNone: true,
			stderrHas: []string{`plan: -tf "` + filepath.Join(out, "plan.tf.json") + `" must end in .tf`},
		},
		{
			name: "no export of a bad stack", args: []string{"-stack-file", filepath.Join(bad, "Pulumi.prod.yaml"), "-tf", badExport},
			code: 1, stdoutNone: true, export: badExport, noExport: true,
			stderrHas: []string{"plan: stack prod: invalid stack config: 6 problem(s)"},
		},
		{
			name: "bad stack file", args: []string{"-stack-file", filepath.Join(bad, "Pulumi.prod.yaml")}, code: 1, stdoutNone: true,
			stderrHas: []string{
				"plan: stack prod: invalid stack config: 6 problem(s)",
				"mythex-infra:publicSubnetIds has 1 entries, needs at least 2",
				"mythex-infra:certificateArn \"arn:aws:acm:eu-west-1:123456789012:certificate/00000000-0000-4000-8000-000000000000\" is in region eu-west-1, but the load balancer is in aws:region us-east-1",
				"mythex-infra:accessLogsBucket \"Mythex_Logs\" must be lowercase",
				"mythex-infra:appPort 70000 must be within 1–65535",
				"mythex-infra:accessLogsExpireDays 0 must be within 1–3650 days",
				"mythex-infra:instanceIds [1] \"i-0123456789abcdef0\" repeats [0]",
			},
		},
		{
			name: "missing stack file", args: []string{"-stack-file", filepath.Join(bad, "Pulumi.nope.yaml")}, code: 1, stdoutNone: true,
			stderrHas: []string{"plan: read stack file: stat " + filepath.Join(bad, "Pulumi.nope.yaml") + ": no such file or directory"},
		},
		{
			name: "stray argument", args: []string{"prod"}, code: 2, stdoutNone: true,
			stderrHas: []string{`plan: unexpected arguments ["prod"]`, "-stack-file"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			cmd.Dir = repoRoot
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.code, code, "exit code; stderr:\n%s", stderr.String())
			for _, want := range tc.stderrHas {
				assert.Contains(t, stderr.String(), want)
			}
			if tc.stdoutHas != "" {
				assert.Contains(t, stdout.String(), tc.stdoutHas)
			}
			if tc.stdoutNone {
				assert.Empty(t, stdout.String(), "nothing on stdout when there is no plan")
			}
			if tc.export != "" {
				doc, err := os.ReadFile(tc.export)
				if tc.noExport {
					assert.ErrorIs(t, err, os.ErrNotExist, "no export of a plan that cannot be made")
					return
				}
				require.NoError(t, err, "the export is written")
				want, err := infra.TerraformHCL(planProdResources(t))
				require.NoError(t, err)
				assert.Equal(t, string(want), string(doc), "the export is the prod program's")
				assert.Contains(t, string(doc), `resource "aws_lb" "`+infra.ComponentName+`-alb" {`)
				leftovers, err := filepath.Glob(filepath.Join(filepath.Dir(tc.export), ".*"))
				require.NoError(t, err)
				assert.Empty(t, leftovers, "no temporary file is left behind")
			}
		})
	}
}
