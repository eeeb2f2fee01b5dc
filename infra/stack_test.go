package infra

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/common/workspace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	prodStackFile = "../Pulumi.prod.yaml"
	projectFile   = "../Pulumi.yaml"
)

// prodConfig is the committed prod stack's config, as the engine would hand
// it to the program.
func prodConfig(t *testing.T) map[string]string {
	t.Helper()
	f, err := LoadStackFile(prodStackFile)
	require.NoError(t, err, "load %s", prodStackFile)
	return f.Config
}

// with returns a copy of cfg with key set to value, or deleted when value is nil.
func withKey(cfg map[string]string, key string, value *string) map[string]string {
	out := make(map[string]string, len(cfg))
	for k, v := range cfg {
		out[k] = v
	}
	if value == nil {
		delete(out, key)
	} else {
		out[key] = *value
	}
	return out
}

func strp(s string) *string { return &s }

func mapSource(cfg map[string]string) ConfigSource {
	return func(key string) (string, bool) {
		v, ok := cfg[key]
		return v, ok
	}
}

func TestProdStackFileIsValid(t *testing.T) {
	f, err := LoadStackFile(prodStackFile)
	require.NoError(t, err)
	assert.Equal(t, "prod", f.Stack)
	c, err := ParseStackConfig(f.Get)
	require.NoError(t, err, "the committed prod stack config must parse")
	assert.Len(t, c.PublicSubnetIDs, 2, "prod public subnets")
	assert.NotEmpty(t, c.InstanceIDs, "prod instances")
	assert.Equal(t, "us-east-1", c.Region, "aws:region comes through Pulumi's loader with its namespace")
}

// Placeholders must say so next to them, so nobody mistakes them for the
// real thing; the shape-valid IDs must each carry such a comment.
func TestProdStackFileMarksPlaceholders(t *testing.T) {
	b, err := os.ReadFile(prodStackFile)
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	for _, key := range []string{KeyVPCID, KeyPublicSubnetIDs, KeyCertificateARN, KeyAccessLogsBucket, KeyInstanceIDs} {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), key+":") })
		require.GreaterOrEqual(t, i, 1, "%s is in %s", key, prodStackFile)
		assert.Contains(t, lines[i-1], "# placeholder: replace with", "%s is marked as a placeholder on the line above", key)
	}
}

// Pulumi.yaml passes Pulumi's own project schema and declares exactly the
// inputs ParseStackConfig reads, so `pulumi config` and the program agree.
func TestProjectDeclaresEveryStackInput(t *testing.T) {
	proj, err := workspace.LoadProject(projectFile)
	require.NoError(t, err, "Pulumi's loader accepts %s", projectFile)
	assert.Equal(t, Project, string(proj.Name))
	assert.Equal(t, "go", proj.Runtime.Name())
	require.NotNil(t, proj.Description)

	_, err = ParseStackConfig(mapSource(nil))
	var sce *StackConfigError
	require.ErrorAs(t, err, &sce)
	var read []string
	for _, p := range sce.Problems {
		key, ok := strings.CutSuffix(p, " is not set")
		require.True(t, ok, "an empty source only reports missing keys, got %q", p)
		if name, ok := strings.CutPrefix(key, Project+":"); ok {
			read = append(read, name)
		}
	}
	// Optional inputs are not reported missing; each has a default, which
	// means what leaving it out means to the program.
	optional := map[string]any{"slotPort": 0}
	for name := range optional {
		read = append(read, name)
	}
	var declared []string
	types := map[string]string{}
	for name, ct := range proj.Config {
		declared = append(declared, name)
		assert.NotEmpty(t, ct.Description, "config %s has a description", name)
		if def, ok := optional[name]; ok {
			assert.EqualValues(t, def, ct.Default, "config %s defaults to what its absence means", name)
		} else {
			assert.Nil(t, ct.Default, "config %s has no default: a stack sets it on purpose", name)
		}
		if assert.True(t, ct.IsExplicitlyTyped(), "config %s is typed, so Pulumi checks stack values against it", name) {
			types[name] = *ct.Type
		}
	}
	assert.ElementsMatch(t, read, declared, "Pulumi.yaml config vs keys the program reads")
	assert.Equal(t, "integer", types["appPort"])
	assert.Equal(t, "integer", types["slotPort"])
	assert.Equal(t, "array", types["publicSubnetIds"])
	assert.Equal(t, "array", types["instanceIds"])
}

func TestParseStackConfig(t *testing.T) {
	good := map[string]string{
		KeyRegion:               "eu-west-1",
		KeyVPCID:                "vpc-0123abcd",
		KeyPublicSubnetIDs:      `["subnet-0123456789abcdef0","subnet-89abcdef"]`,
		KeyIPAddressType:        "dualstack",
		KeyCertificateARN:       "arn:aws:acm:eu-west-1:123456789012:certificate/12345678-90ab-cdef-1234-567890abcdef",
		KeyAccessLogsBucket:     "mythex.logs-eu",
		KeyAppPort:              "8080",
		KeyInstanceIDs:          `["i-0123456789abcdef0"]`,
		KeyAccessLogsExpireDays: "90",
	}
	tests := []struct {
		name string
		cfg  map[string]string
		// want lists every problem reported, in order, as regexps.
		want []string
	}{
		{name: "valid", cfg: good},
		{name: "lowest port", cfg: withKey(good, KeyAppPort, strp("1"))},
		{name: "highest port", cfg: withKey(good, KeyAppPort, strp("65535"))},
		{name: "logs kept a day", cfg: withKey(good, KeyAccessLogsExpireDays, strp("1"))},
		{name: "logs kept ten years", cfg: withKey(good, KeyAccessLogsExpireDays, strp("3650"))},
		{name: "shortest bucket", cfg: withKey(good, KeyAccessLogsBucket, strp("a-b"))},
		{name: "longest bucket", cfg: withKey(good, KeyAccessLogsBucket, strp(strings.Repeat("a", 63)))},
		{name: "gov partition", cfg: withKey(withKey(good, KeyRegion, strp("us-gov-west-1")), KeyCertificateARN,
			strp("arn:aws-us-gov:acm:us-gov-west-1:123456789012:certificate/12345678-90ab-cdef-1234-567890abcdef"))},
		{
			name: "everything missing",
			cfg:  map[string]string{},
			want: []string{
				`^aws:region is not set$`, `^mythex-infra:vpcId is not set$`, `^mythex-infra:publicSubnetIds is not set$`,
				`^mythex-infra:ipAddressType is not set$`, `^mythex-infra:certificateArn is not set$`,
				`^mythex-infra:accessLogsBucket is not set$`, `^mythex-infra:appPort is not set$`,
				`^mythex-infra:instanceIds is not set$`, `^mythex-infra:accessLogsExpireDays is not set$`,
			},
		},
		{name: "logs kept no day", cfg: withKey(good, KeyAccessLogsExpireDays, strp("0")),
			want: []string{`^mythex-infra:accessLogsExpireDays 0 must be within 1–3650 days$`}},
		{name: "logs kept past ten years", cfg: withKey(good, KeyAccessLogsExpireDays, strp("3651")),
			want: []string{`^mythex-infra:accessLogsExpireDays 3651 must be within 1–3650 days$`}},
		{name: "logs kept a date", cfg: withKey(good, KeyAccessLogsExpireDays, strp("2027-01-01")),
			want: []string{`^mythex-infra:accessLogsExpireDays "2027-01-01" must be a whole number of days$`}},
		{name: "blank counts as missing", cfg: withKey(good, KeyVPCID, strp("  ")), want: []string{`^mythex-infra:vpcId is not set$`}},
		{name: "region", cfg: withKey(good, KeyRegion, strp("Europe")), want: []string{`^aws:region "Europe" is not an AWS region`}},
		{name: "vpc prefix", cfg: withKey(good, KeyVPCID, strp("subnet-0123abcd")), want: []string{`vpcId "subnet-0123abcd" is not a VPC ID`}},
		{name: "vpc length", cfg: withKey(good, KeyVPCID, strp("vpc-0123abcde")), want: []string{`vpcId "vpc-0123abcde" is not a VPC ID`}},
		{name: "vpc uppercase", cfg: withKey(good, KeyVPCID, strp("vpc-0123ABCD")), want: []string{`vpcId "vpc-0123ABCD" is not a VPC ID`}},
		{
			name: "one subnet",
			cfg:  withKey(good, KeyPublicSubnetIDs, strp(`["subnet-0123abcd"]`)),
			want: []string{`publicSubnetIds has 1 entries, needs at least 2: .*two availability zones`},
		},
		{
			name: "same subnet twice",
			cfg:  withKey(good, KeyPublicSubnetIDs, strp(`["subnet-0123abcd","subnet-0123abcd"]`)),
			want: []string{`publicSubnetIds \[1\] "subnet-0123abcd" repeats \[0\]`},
		},
		{
			name: "malformed subnet",
			cfg:  withKey(good, KeyPublicSubnetIDs, strp(`["subnet-0123abcd","sn-1"]`)),
			want: []string{`publicSubnetIds \[1\] "sn-1" is not a subnet ID`},
		},
		{
			name: "subnets not a list",
			cfg:  withKey(good, KeyPublicSubnetIDs, strp(`subnet-0123abcd,subnet-89abcdef`)),
			want: []string{`publicSubnetIds "subnet-0123abcd,subnet-89abcdef" must be a list of strings`},
		},
		{name: "ip address type", cfg: withKey(good, KeyIPAddressType, strp("ipv6")), want: []string{`ipAddressType "ipv6" must be one of ipv4, dualstack`}},
		{name: "certificate not ACM", cfg: withKey(good, KeyCertificateARN, strp("arn:aws:iam::123456789012:server-certificate/x")), want: []string{`certificateArn "arn:aws:iam::123456789012:server-certificate/x" is not an ACM certificate ARN`}},
		{
			name: "certificate in another region",
			cfg:  withKey(good, KeyCertificateARN, strp("arn:aws:acm:us-east-1:123456789012:certificate/12345678-90ab-cdef-1234-567890abcdef")),
			want: []string{`certificateArn .* is in region us-east-1, but the load balancer is in aws:region eu-west-1`},
		},
		{name: "bucket short", cfg: withKey(good, KeyAccessLogsBucket, strp("ab")), want: []string{`accessLogsBucket "ab" must be 3–63 characters long`}},
		{name: "bucket long", cfg: withKey(good, KeyAccessLogsBucket, strp(strings.Repeat("a", 64))), want: []string{`accessLogsBucket "a{64}" must be 3–63 characters long`}},
		{name: "bucket uppercase", cfg: withKey(good, KeyAccessLogsBucket, strp("Mythex-logs")), want: []string{`accessLogsBucket "Mythex-logs" must be lowercase`}},
		{name: "bucket ends with hyphen", cfg: withKey(good, KeyAccessLogsBucket, strp("mythex-")), want: []string{`accessLogsBucket "mythex-" must be lowercase`}},
		{name: "bucket double dot", cfg: withKey(good, KeyAccessLogsBucket, strp("mythex..logs")), want: []string{`two adjacent dots`}},
		{name: "bucket IP", cfg: withKey(good, KeyAccessLogsBucket, strp("192.168.5.4")), want: []string{`must not be formatted as an IP address`}},
		{name: "bucket reserved prefix", cfg: withKey(good, KeyAccessLogsBucket, strp("xn--logs")), want: []string{`must not begin with "xn--"`}},
		{name: "bucket reserved suffix", cfg: withKey(good, KeyAccessLogsBucket, strp("logs-s3alias")), want: []string{`must not end with "-s3alias"`}},
		{name: "port zero", cfg: withKey(good, KeyAppPort, strp("0")), want: []string{`^mythex-infra:appPort 0 must be within 1–65535$`}},
		{name: "port too high", cfg: withKey(good, KeyAppPort, strp("65536")), want: []string{`^mythex-infra:appPort 65536 must be within 1–65535$`}},
		{name: "port not a number", cfg: withKey(good, KeyAppPort, strp("http")), want: []string{`^mythex-infra:appPort "http" must be an integer$`}},
		{name: "no instances", cfg: withKey(good, KeyInstanceIDs, strp(`[]`)), want: []string{`instanceIds has 0 entries, needs at least 1`}},
		{
			name: "duplicate and malformed instances",
			cfg:  withKey(good, KeyInstanceIDs, strp(`["i-0123abcd","i-0123abcd","i-xyz","i-0123456789abcdef"]`)),
			want: []string{`instanceIds \[1\] "i-0123abcd" repeats \[0\]`, `instanceIds \[2\] "i-xyz" is not an EC2 instance ID`, `instanceIds \[3\] "i-0123456789abcdef" is not an EC2 instance ID`},
		},
		{
			name: "every problem at once",
			cfg: withKey(withKey(withKey(withKey(good, KeyAppPort, strp("70000")), KeyPublicSubnetIDs, strp(`["subnet-0123abcd"]`)),
				KeyVPCID, nil), KeyAccessLogsExpireDays, strp("-7")),
			want: []string{`vpcId is not set`, `publicSubnetIds has 1 entries`, `appPort 70000 must be within`, `accessLogsExpireDays -7 must be within 1–3650 days`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseStackConfig(mapSource(tc.cfg))
			if len(tc.want) == 0 {
				require.NoError(t, err)
				assert.NoError(t, c.Validate(), "a parsed config validates")
				return
			}
			var sce *StackConfigError
			require.ErrorAs(t, err, &sce)
			assert.Equal(t, StackConfig{}, c, "nothing half parsed is returned")
			require.Len(t, sce.Problems, len(tc.want), "problems: %q", sce.Problems)
			for i, w := range tc.want {
				assert.Regexp(t, regexp.MustCompile(w), sce.Problems[i], "problem %d", i)
			}
			assert.Contains(t, err.Error(), "invalid stack config: "+strconv.Itoa(len(tc.want))+" problem(s)")
		})
	}
}

func TestLoadStackFileErrors(t *testing.T) {
	project, err := os.ReadFile(projectFile)
	require.NoError(t, err)
	tests := []struct {
		name    string
		file    string
		project string
		stack   string
		want    string
	}{
		{name: "no stack file", file: "Pulumi.staging.yaml", project: string(project), want: "read stack file: stat "},
		{name: "not a stack file name", file: "prod.yaml", project: string(project), stack: "config: {}\n", want: "name must be Pulumi.<stack>.yaml"},
		{name: "no project beside it", file: "Pulumi.prod.yaml", stack: "config: {}\n", want: "load project for stack file"},
		{name: "another project", file: "Pulumi.prod.yaml", project: "name: other\nruntime: go\n", stack: "config: {}\n", want: `is named "other", want "mythex-infra"`},
		{name: "not YAML", file: "Pulumi.prod.yaml", project: string(project), stack: "config: [\n", want: "load stack file"},
		{
			name: "secret", file: "Pulumi.prod.yaml", project: string(project),
			stack: "config:\n  mythex-infra:vpcId:\n    secure: AAABAGZvbw==\n",
			want:  "mythex-infra:vpcId is a secret; the dry plan cannot decrypt it",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.project != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "Pulumi.yaml"), []byte(tc.project), 0o600))
			}
			path := filepath.Join(dir, tc.file)
			if tc.stack != "" {
				require.NoError(t, os.WriteFile(path, []byte(tc.stack), 0o600))
			}
			_, err := LoadStackFile(path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A stack file's lists reach the program as JSON and its integers as text,
// exactly as the Pulumi engine passes them.
func TestLoadStackFileEncodesLikeTheEngine(t *testing.T) {
	cfg := prodConfig(t)
	assert.Equal(t, `["subnet-0123456789abcdef0","subnet-0123456789abcdef1"]`, cfg[KeyPublicSubnetIDs])
	assert.Equal(t, "8080", cfg[KeyAppPort])
	assert.Equal(t, "us-east-1", cfg[KeyRegion])
}
