package targethealth

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/internal/needs"
)

const testARN = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/mythex-api/0123456789abcdef"

// The arguments that ask the CLI for one target's health.
var rolloutArgs = []string{"elbv2", "describe-target-health", "--target-group-arn", testARN,
	"--targets", "Id=i-0123456789abcdef0,Port=8080", "--output", "json"}

// Answers AWS documents for the target of a rolling deploy.
var answers = []Health{
	{State: Healthy},
	{State: Unhealthy, Reason: "Target.ResponseCodeMismatch", Description: "Health checks failed with these codes: [503]"},
	{State: Unhealthy, Reason: "Target.Timeout", Description: "Request timed out"},
	{State: Initial, Reason: "Elb.RegistrationInProgress", Description: "Target registration is in progress"},
	{State: Draining, Reason: "Target.DeregistrationInProgress", Description: "Target deregistration is in progress"},
	{State: Unused, Reason: "Target.NotRegistered", Description: "Target is not registered to the target group"},
}

func run(t *testing.T, env []string, name string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// The stand-in's fidelity: for the same answer of the API, its `aws`
// prints what the real AWS CLI prints when it calls the API (here the
// stand-in's query endpoint, through --endpoint-url), and both send the
// same target. The rollout parses that output, so this is the point relied
// on.
func TestCLIStandInPrintsWhatTheRealCLIPrints(t *testing.T) {
	needs.Have(t, needs.AWSCLI)
	realCLI, err := exec.LookPath("aws")
	require.NoError(t, err, "this test needs the AWS CLI: apt-get install awscli")
	// No account, no network: fake credentials, no config, no metadata.
	env := append(os.Environ(), "AWS_ACCESS_KEY_ID=AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY=example",
		"AWS_DEFAULT_REGION=eu-west-1", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER=")
	for _, h := range answers {
		t.Run(h.State+" "+h.Reason, func(t *testing.T) {
			s, err := Start(func(Call) (Health, error) { return h, nil })
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			fake, err := s.WriteCLI(t.TempDir())
			require.NoError(t, err)

			realOut, realErr, err := run(t, env, realCLI, append([]string{"--endpoint-url", s.URL}, rolloutArgs...)...)
			require.NoError(t, err, "the real CLI against the stand-in's API: %s", realErr)
			fakeOut, fakeErr, err := run(t, env, fake, rolloutArgs...)
			require.NoError(t, err, "%s", fakeErr)
			assert.JSONEq(t, realOut, fakeOut)

			calls := s.Calls()
			require.Len(t, calls, 2)
			for _, c := range calls {
				assert.Equal(t, Call{TargetGroupARN: testARN, ID: "i-0123456789abcdef0", Port: 8080}, Call{TargetGroupARN: c.TargetGroupARN, ID: c.ID, Port: c.Port})
			}
		})
	}
}

// What the real CLI refuses, the stand-in refuses: a call it would not make
// must not pass here.
func TestCLIStandInRefusesOtherCalls(t *testing.T) {
	s, err := Start(func(Call) (Health, error) { return Health{State: Healthy}, nil })
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fake, err := s.WriteCLI(t.TempDir())
	require.NoError(t, err)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"another command", []string{"elbv2", "wait", "target-in-service"}, "only `aws elbv2 describe-target-health`"},
		{"no target group", []string{"elbv2", "describe-target-health", "--targets", "Id=i-1,Port=80", "--output", "json"}, "--target-group-arn is required"},
		{"port not a number", []string{"elbv2", "describe-target-health", "--target-group-arn", testARN, "--targets", "Id=i-1,Port=x", "--output", "json"}, `Port "x" is not a number`},
		{"a comma in the id adds a key", []string{"elbv2", "describe-target-health", "--target-group-arn", testARN, "--targets", "Id=i-1,AvailabilityZone=all,Port=80", "--output", "json"}, `unknown key "AvailabilityZone"`},
		{"text output", []string{"elbv2", "describe-target-health", "--target-group-arn", testARN, "--targets", "Id=i-1,Port=80"}, `only json`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := run(t, os.Environ(), fake, tt.args...)
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "want a failed call, got %v", err)
			assert.Contains(t, stderr, tt.want)
		})
	}
	assert.Empty(t, s.Calls(), "no refused call reaches the answer")

	// A failing API (throttled) fails the command, with the API's message.
	s2, err := Start(func(Call) (Health, error) { return Health{}, errors.New("Rate exceeded") })
	require.NoError(t, err)
	t.Cleanup(func() { _ = s2.Close() })
	fake2, err := s2.WriteCLI(t.TempDir())
	require.NoError(t, err)
	_, stderr, err := run(t, os.Environ(), fake2, rolloutArgs...)
	require.Error(t, err)
	assert.True(t, strings.Contains(stderr, "Rate exceeded"), stderr)
}
