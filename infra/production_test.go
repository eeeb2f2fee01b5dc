package infra

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What a first real `pulumi up` would trip on, checked under the mock engine.
// Lookups are answered by a fake account (fakeAWS) that tests bend one answer
// at a time.

// fakeAWS answers the program's lookups like an account would; each field
// overrides DryLookups' answer for one lookup.
type fakeAWS struct {
	partition  string
	account    string
	elbAccount map[string]string // region → ELB account ARN; a region missing from a non-nil map: lookup error
	zones      map[string]string // subnet → availability zone
	vpcs       map[string]string // subnet → VPC; missing: the subnet's lookup echoes the VPC asked for
	enis       map[string]string // instance → primary network interface
	states     map[string]string // instance → state
	missing    map[string]bool   // subnets and instances that do not exist
}

func (f fakeAWS) lookups(args pulumi.MockCallArgs) (resource.PropertyMap, error) {
	str := func(k string) string {
		if v, ok := args.Args[resource.PropertyKey(k)]; ok && v.IsString() {
			return v.StringValue()
		}
		return ""
	}
	out, err := DryLookups(args)
	if err != nil {
		return nil, err
	}
	set := func(k, v string) {
		if v != "" {
			out[resource.PropertyKey(k)] = resource.NewProperty(v)
		}
	}
	switch args.Token {
	case InvokePartition:
		set("partition", f.partition)
	case InvokeCallerIdentity:
		set("accountId", f.account)
	case InvokeELBServiceAccount:
		if f.elbAccount == nil {
			break
		}
		arn, ok := f.elbAccount[str("region")]
		if !ok {
			// What the provider says for a region it has no account for.
			return nil, fmt.Errorf("unsupported AWS Region (%s)", str("region"))
		}
		set("arn", arn)
	case InvokeSubnet:
		id := str("id")
		if f.missing[id] || (f.vpcs[id] != "" && f.vpcs[id] != str("vpcId")) {
			return nil, errors.New("no matching EC2 Subnet found")
		}
		set("availabilityZone", f.zones[id])
	case InvokeInstance:
		id := str("instanceId")
		if f.missing[id] {
			return nil, errors.New("Your query returned no results. Please change your search criteria and try again.")
		}
		set("networkInterfaceId", f.enis[id])
		set("instanceState", f.states[id])
	}
	return out, nil
}

func runFake(t *testing.T, aws fakeAWS, stack string, cfg map[string]string) (*Recorder, error) {
	t.Helper()
	rec := &Recorder{Lookups: aws.lookups}
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		_, err := Build(ctx, Prod())
		return err
	}, pulumi.WithMocks(Project, stack, rec), WithConfig(cfg))
	return rec, err
}

// inRegion is the prod config moved to region, certificate included.
func inRegion(t *testing.T, region string) map[string]string {
	t.Helper()
	cfg := prodConfig(t)
	cfg = withKey(cfg, KeyRegion, &region)
	parts := strings.Split(cfg[KeyCertificateARN], ":")
	parts[3] = region
	if strings.HasPrefix(region, "us-gov-") {
		parts[1] = "aws-us-gov"
	}
	return withKey(cfg, KeyCertificateARN, strp(strings.Join(parts, ":")))
}

type policyDoc struct {
	Version   string
	Statement []struct {
		Sid       string
		Effect    string
		Principal map[string]string
		Action    string
		Resource  string
	}
}

// AWS enables access logs only if the bucket's policy lets the region's log
// writer put objects under the prefix and the bucket uses SSE-S3; it checks
// when the ALB is created, so the ALB must wait for both.
func TestAccessLogBucketPolicyPerRegion(t *testing.T) {
	tests := []struct {
		name, region, stack, partition string
		elbAccount                     string // "" when the region has none
		wantPrincipal                  map[string]string
	}{
		{
			name: "region with an ELB account", region: "us-east-1", stack: "prod", partition: "aws",
			elbAccount:    "arn:aws:iam::127311923021:root",
			wantPrincipal: map[string]string{"AWS": "arn:aws:iam::127311923021:root"},
		},
		{
			name: "region opened after August 2022", region: "eu-central-2", stack: "prod", partition: "aws",
			wantPrincipal: map[string]string{"Service": "logdelivery.elasticloadbalancing.amazonaws.com"},
		},
		{
			name: "GovCloud", region: "us-gov-west-1", stack: "staging", partition: "aws-us-gov",
			elbAccount:    "arn:aws-us-gov:iam::048591011584:root",
			wantPrincipal: map[string]string{"AWS": "arn:aws-us-gov:iam::048591011584:root"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := inRegion(t, tc.region)
			aws := fakeAWS{partition: tc.partition, account: "210987654321", elbAccount: map[string]string{}}
			if tc.elbAccount != "" {
				aws.elbAccount[tc.region] = tc.elbAccount
			}
			rec, err := runFake(t, aws, tc.stack, cfg)
			require.NoError(t, err)
			rs := rec.Resources()
			bucketName := cfg[KeyAccessLogsBucket]

			bucket := findResource(t, rs, TypeBucket, ComponentName+"-access-logs")
			assert.Equal(t, bucketName, input(bucket, "bucket"), "%s is the configured bucket", bucket.Name)
			assert.Equal(t, false, input(bucket, "forceDestroy"), "%s: a destroy never empties the logs", bucket.Name)

			sse := findResource(t, rs, TypeBucketEncryption, ComponentName+"-access-logs-sse")
			assert.Equal(t, mockID(bucket), input(sse, "bucket"), "%s encrypts %s", sse.Name, bucket.Name)
			assert.Equal(t, "AES256", input(sse, "rules.0.applyServerSideEncryptionByDefault.sseAlgorithm"),
				"%s: SSE-S3, the only encryption log delivery writes to", sse.Name)
			assert.Nil(t, input(sse, "rules.0.applyServerSideEncryptionByDefault.kmsMasterKeyId"), "%s uses no KMS key", sse.Name)

			pab := findResource(t, rs, TypeBucketPublicAccess, ComponentName+"-access-logs-private")
			for _, k := range []string{"blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"} {
				assert.Equal(t, true, input(pab, k), "%s %s", pab.Name, k)
			}

			pol := findResource(t, rs, TypeBucketPolicy, ComponentName+"-access-logs-policy")
			assert.Equal(t, mockID(bucket), input(pol, "bucket"), "%s is %s's policy", pol.Name, bucket.Name)
			raw, ok := input(pol, "policy").(string)
			require.True(t, ok, "%s policy is a JSON document", pol.Name)
			var doc policyDoc
			require.NoError(t, json.Unmarshal([]byte(raw), &doc), "%s policy", pol.Name)
			assert.Equal(t, "2012-10-17", doc.Version)
			require.Len(t, doc.Statement, 1, "%s: one statement, the log writer's", pol.Name)
			st := doc.Statement[0]
			assert.Equal(t, "Allow", st.Effect)
			assert.Equal(t, tc.wantPrincipal, st.Principal, "%s principal in %s", pol.Name, tc.region)
			assert.Equal(t, "s3:PutObject", st.Action)
			assert.Equal(t, "arn:"+tc.partition+":s3:::"+bucketName+"/"+Project+"/"+tc.stack+"/AWSLogs/210987654321/*", st.Resource,
				"%s: only under the stack's prefix, for this account", pol.Name)

			alb := findResource(t, rs, TypeLoadBalancer, ComponentName+"-alb")
			assert.Equal(t, bucketName, input(alb, "accessLogs.bucket"), "%s logs to %s", alb.Name, bucket.Name)
			assert.Equal(t, Project+"/"+tc.stack, input(alb, "accessLogs.prefix"), "%s prefix", alb.Name)
			for _, dep := range []PlannedResource{sse, pol} {
				assert.Contains(t, alb.DependsOn, urnOf(dep), "%s waits for %s: AWS checks it when access logs are enabled", alb.Name, dep.Name)
			}

			var askedELB []string
			for _, c := range rec.Calls() {
				if c.Token == InvokeELBServiceAccount {
					askedELB = append(askedELB, c.Args["region"].StringValue())
				}
			}
			if tc.elbAccount != "" {
				assert.Equal(t, []string{tc.region}, askedELB, "the ELB account of %s is looked up", tc.region)
			} else {
				assert.Empty(t, askedELB, "%s has no ELB account to look up", tc.region)
			}
		})
	}
}

func urnOf(r PlannedResource) string {
	return r.Parent[:strings.LastIndex(r.Parent, "::")] + "$" + r.Type + "::" + r.Name
}

// Without protect, `pulumi destroy`, a replacement or a rename deletes the
// listeners and the target group first and then fails on the ALB's deletion
// protection: half a stack and an outage. Every resource but per-server
// membership is protected; the logs bucket also outlives the stack.
func TestStatefulResourcesAreProtected(t *testing.T) {
	rs := planProd(t)
	membership := map[string]bool{TypeAttachment: true, TypeENIAttachment: true}
	for _, r := range rs {
		if !r.Custom {
			continue
		}
		if membership[r.Type] {
			assert.False(t, r.Protect, "%s %s: adding and removing servers is routine", r.Type, r.Name)
			continue
		}
		assert.True(t, r.Protect, "%s %s is protected", r.Type, r.Name)
	}
	for _, typ := range []string{TypeLoadBalancer, TypeTargetGroup, TypeListener, TypeSecurityGroup, TypeBucket, TypeBucketPolicy} {
		require.NotEmpty(t, ofType(rs, typ), "the plan has a %s", typ)
	}
	bucket := findResource(t, rs, TypeBucket, ComponentName+"-access-logs")
	assert.True(t, bucket.RetainOnDelete, "%s stays in AWS when the stack lets go of it", bucket.Name)
}

// The ALB may only send to the servers' group, so each server must carry it;
// and the servers need HTTPS out for SSM (the deploy's ssh) and docker pull.
func TestServersCarryTheirSecurityGroupAndReachOutOverHTTPS(t *testing.T) {
	cfg := prodConfig(t)
	c, err := ParseStackConfig(mapSource(cfg))
	require.NoError(t, err)
	aws := fakeAWS{enis: map[string]string{}}
	for i, id := range c.InstanceIDs {
		aws.enis[id] = fmt.Sprintf("eni-0123456789abcde%02x", i)
	}
	rec, err := runFake(t, aws, "prod", cfg)
	require.NoError(t, err)
	rs := rec.Resources()
	srvSG := findResource(t, rs, TypeSecurityGroup, ComponentName+"-servers-sg")

	type out struct {
		port float64
		cidr string
	}
	var got []out
	for _, r := range ofType(rs, TypeEgressRule) {
		if input(r, "securityGroupId") != mockID(srvSG) {
			continue
		}
		assert.Equal(t, "tcp", input(r, "ipProtocol"), "%s protocol", r.Name)
		assert.Equal(t, input(r, "fromPort"), input(r, "toPort"), "%s opens one port", r.Name)
		assert.NotEmpty(t, input(r, "description"), "%s says what it is for", r.Name)
		cidr := input(r, "cidrIpv4")
		if cidr == nil {
			cidr = input(r, "cidrIpv6")
		}
		got = append(got, out{input(r, "fromPort").(float64), fmt.Sprint(cidr)})
	}
	assert.ElementsMatch(t, []out{{443, "0.0.0.0/0"}, {443, "::/0"}}, got, "%s reaches out over HTTPS only", srvSG.Name)

	atts := ofType(rs, TypeENIAttachment)
	require.Len(t, atts, len(c.InstanceIDs), "one security group attachment per server")
	for i, id := range c.InstanceIDs {
		a := findResource(t, rs, TypeENIAttachment, ComponentName+"-servers-sg-"+id)
		assert.Equal(t, mockID(srvSG), input(a, "securityGroupId"), "%s attaches %s", a.Name, srvSG.Name)
		assert.Equal(t, aws.enis[id], input(a, "networkInterfaceId"), "%s: %s's primary network interface [%d]", a.Name, id, i)
	}

	var asked []string
	for _, call := range rec.Calls() {
		if call.Token != InvokeInstance {
			continue
		}
		asked = append(asked, call.Args["instanceId"].StringValue())
		f := call.Args["filters"].ArrayValue()
		require.Len(t, f, 1, "instance lookup filters")
		assert.Equal(t, "vpc-id", f[0].ObjectValue()["name"].StringValue(), "the instance is looked up in the VPC")
		assert.Equal(t, c.VPCID, f[0].ObjectValue()["values"].ArrayValue()[0].StringValue())
	}
	assert.Equal(t, c.InstanceIDs, asked, "every instance is looked up")
}

// What the stack config's shape cannot show, a lookup can: every problem is
// reported at once and nothing is registered.
func TestStackLookupsRefuseWhatAWSWould(t *testing.T) {
	cfg := prodConfig(t)
	c, err := ParseStackConfig(mapSource(cfg))
	require.NoError(t, err)
	sn0, sn1 := c.PublicSubnetIDs[0], c.PublicSubnetIDs[1]
	i0, i1 := c.InstanceIDs[0], c.InstanceIDs[1]
	tests := []struct {
		name   string
		region string
		aws    fakeAWS
		want   []string
	}{
		{
			name: "subnets in one zone",
			aws:  fakeAWS{zones: map[string]string{sn0: "us-east-1a", sn1: "us-east-1a"}},
			want: []string{"mythex-infra:publicSubnetIds " + sn0 + ", " + sn1 + " are all in availability zone us-east-1a: an internet-facing ALB needs subnets in at least two availability zones"},
		},
		{
			name: "subnet of another VPC",
			aws:  fakeAWS{vpcs: map[string]string{sn1: "vpc-0fedcba9876543210"}},
			want: []string{`mythex-infra:publicSubnetIds [1] "` + sn1 + `": no such subnet in mythex-infra:vpcId ` + c.VPCID + `: `, "no matching EC2 Subnet found"},
		},
		{
			name: "instance missing and another terminated",
			aws:  fakeAWS{missing: map[string]bool{i0: true}, states: map[string]string{i1: "terminated"}},
			want: []string{`mythex-infra:instanceIds [0] "` + i0 + `": no such instance in mythex-infra:vpcId ` + c.VPCID,
				`mythex-infra:instanceIds [1] "` + i1 + `" is terminated`},
		},
		{
			name:   "region the provider has no ELB account for",
			region: "us-east-2",
			aws:    fakeAWS{elbAccount: map[string]string{}},
			want:   []string{"aws:region us-east-2: look up the region's Elastic Load Balancing account for the access logs", "unsupported AWS Region (us-east-2)"},
		},
		{
			name: "every problem at once",
			aws: fakeAWS{zones: map[string]string{sn0: "us-east-1b", sn1: "us-east-1b"}, missing: map[string]bool{i1: true},
				elbAccount: map[string]string{}},
			want: []string{"invalid stack config: 3 problem(s)", "all in availability zone us-east-1b", `instanceIds [1] "` + i1 + `": no such instance`,
				"look up the region's Elastic Load Balancing account"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := cfg
			if tc.region != "" {
				run = inRegion(t, tc.region)
			}
			rec, err := runFake(t, tc.aws, "prod", run)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Empty(t, rec.Resources(), "no resource is registered")
		})
	}
}
