package infra

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const componentURN = "urn:pulumi:prod::" + Project + "::" + ComponentType + "::" + ComponentName

// altTiming is a second valid timing in which every value the load balancer
// reads differs from Prod's and from each other, so a test sees each input
// follow its own field (a swap of two fields shows too).
func altTiming(t *testing.T) Timing {
	t.Helper()
	tm := Prod()
	tm.HealthCheckInterval = 10 * time.Second
	tm.HealthCheckTimeout = 5 * time.Second
	tm.UnhealthyThreshold = 3
	tm.HealthyThreshold = 4
	tm.Drain = 40 * time.Second // detection 3 × 10 s + 5 s = 35 s, plus skew
	tm.MaxDrain = 40 * time.Second
	tm.StopGracePeriod = 55 * time.Second
	tm.DeregistrationDelay = 45 * time.Second
	tm.LBIdleTimeout = 120 * time.Second
	tm.AppKeepAlive = 150 * time.Second
	tm.StartTimeout = 90 * time.Second
	tm.MaxPlannedDowntime = 150 * time.Second
	tm.LockWait = 165 * time.Second
	tm.DeployHold = 8 * time.Minute // 3 × 90 s + 145 s + 40 s + 15 s = 7m50s
	tm.WatchdogInterval = 70 * time.Second
	require.NoError(t, tm.Validate(), "the alternative timing must be valid")
	return tm
}

// runProgram runs the stack's program (Build) under the mock engine with cfg as
// the stack config, and returns what it registered.
func runProgram(t *testing.T, tm Timing, stack string, cfg map[string]string) ([]PlannedResource, error) {
	t.Helper()
	rec := &Recorder{}
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		_, err := Build(ctx, tm)
		return err
	}, pulumi.WithMocks(Project, stack, rec), WithConfig(cfg))
	return rec.Resources(), err
}

func planProd(t *testing.T) []PlannedResource {
	t.Helper()
	rs, err := runProgram(t, Prod(), "prod", prodConfig(t))
	require.NoError(t, err, "the prod program runs under the mock engine")
	return rs
}

func ofType(rs []PlannedResource, typ string) []PlannedResource {
	var out []PlannedResource
	for _, r := range rs {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

func findResource(t *testing.T, rs []PlannedResource, typ, name string) PlannedResource {
	t.Helper()
	for _, r := range rs {
		if r.Type == typ && r.Name == name {
			return r
		}
	}
	require.Failf(t, "resource missing", "no %s named %s", typ, name)
	return PlannedResource{}
}

// input reads the input at a dot-separated path (list elements by index) as a
// plain Go value; nil when absent.
func input(r PlannedResource, path string) any {
	v := resource.NewObjectProperty(r.Inputs)
	for _, part := range strings.Split(path, ".") {
		for v.IsSecret() || v.IsOutput() {
			if v.IsSecret() {
				v = v.SecretValue().Element
			} else {
				v = v.OutputValue().Element
			}
		}
		switch {
		case v.IsObject():
			v = v.ObjectValue()[resource.PropertyKey(part)]
		case v.IsArray():
			i, err := strconv.Atoi(part)
			if err != nil || i >= len(v.ArrayValue()) {
				return nil
			}
			v = v.ArrayValue()[i]
		default:
			return nil
		}
	}
	if v.IsNull() {
		return nil
	}
	return v.Mappable()
}

func mockID(r PlannedResource) string  { return "dry-plan-" + r.Name }
func mockARN(r PlannedResource) string { return "arn:dry-plan:" + r.Name }

func TestProgramBuildsTheLoadBalancerComponent(t *testing.T) {
	rs := planProd(t)
	cfg, err := ParseStackConfig(mapSource(prodConfig(t)))
	require.NoError(t, err)

	require.NotEmpty(t, rs)
	assert.Equal(t, ComponentType, rs[0].Type, "the component is registered before any child")
	assert.Equal(t, ComponentName, rs[0].Name)
	assert.False(t, rs[0].Custom, "%s is a component", rs[0].Name)

	counts := map[string]int{}
	names := map[string]bool{}
	for _, r := range rs[1:] {
		counts[r.Type]++
		assert.True(t, r.Custom, "%s %s is an AWS resource", r.Type, r.Name)
		assert.Equal(t, componentURN, r.Parent, "%s %s is parented to the component", r.Type, r.Name)
		assert.True(t, strings.HasPrefix(r.Name, ComponentName+"-"), "%s %s is named after the component", r.Type, r.Name)
		assert.False(t, names[r.Name], "%s %s: names are unique", r.Type, r.Name)
		names[r.Name] = true
	}
	assert.Equal(t, map[string]int{
		TypeSecurityGroup:      2,
		TypeIngressRule:        5, // 80 and 443 over IPv4 and IPv6, app port from the ALB
		TypeEgressRule:         3, // the ALB to the servers; the servers' HTTPS over IPv4 and IPv6
		TypeLoadBalancer:       1,
		TypeTargetGroup:        1,
		TypeListener:           2,
		TypeAttachment:         len(cfg.InstanceIDs),
		TypeENIAttachment:      len(cfg.InstanceIDs),
		TypeBucket:             1,
		TypeBucketEncryption:   1,
		TypeBucketPublicAccess: 1,
		TypeBucketPolicy:       1,
		TypeBucketLifecycle:    1,
	}, counts, "resources by type")
}

// wantTimingInputs is, independently of alb.go, where each timing value must
// land: resource type and input path to the value AWS must receive.
func wantTimingInputs(tm Timing) map[TimingInput]any {
	sec := func(d time.Duration) any { return float64(d / time.Second) }
	return map[TimingInput]any{
		{TypeLoadBalancer, "idleTimeout", "Timing.LBIdleTimeout"}:                        sec(tm.LBIdleTimeout),
		{TypeTargetGroup, "healthCheck.interval", "Timing.HealthCheckInterval"}:          sec(tm.HealthCheckInterval),
		{TypeTargetGroup, "healthCheck.timeout", "Timing.HealthCheckTimeout"}:            sec(tm.HealthCheckTimeout),
		{TypeTargetGroup, "healthCheck.healthyThreshold", "Timing.HealthyThreshold"}:     float64(tm.HealthyThreshold),
		{TypeTargetGroup, "healthCheck.unhealthyThreshold", "Timing.UnhealthyThreshold"}: float64(tm.UnhealthyThreshold),
		{TypeTargetGroup, "healthCheck.path", "HealthPath"}:                              HealthPath,
		{TypeTargetGroup, "healthCheck.matcher", "HealthyStatus"}:                        strconv.Itoa(HealthyStatus),
		{TypeTargetGroup, "deregistrationDelay", "Timing.DeregistrationDelay"}:           sec(tm.DeregistrationDelay),
	}
}

func TestTimingInputsEqualAndFollowTiming(t *testing.T) {
	prod, alt := Prod(), altTiming(t)
	wantProd, wantAlt := wantTimingInputs(prod), wantTimingInputs(alt)
	assert.ElementsMatch(t, timingInputKeys(wantProd), TimingInputs(), "TimingInputs (the dry plan's marks) lists every timing-derived input")

	planned := map[string][]PlannedResource{}
	for name, tm := range map[string]Timing{"prod": prod, "alt": alt} {
		rs, err := runProgram(t, tm, "prod", prodConfig(t))
		require.NoError(t, err, "%s timing", name)
		planned[name] = rs
	}
	for ti := range wantProd {
		for name, want := range map[string]map[TimingInput]any{"prod": wantProd, "alt": wantAlt} {
			rs := ofType(planned[name], ti.Type)
			require.Len(t, rs, 1, "one %s", ti.Type)
			assert.Equal(t, want[ti], input(rs[0], ti.Input), "%s timing: %s %s.%s from %s", name, ti.Type, rs[0].Name, ti.Input, ti.From)
		}
		if strings.HasPrefix(ti.From, "Timing.") {
			assert.NotEqual(t, wantProd[ti], wantAlt[ti], "the two timings differ in %s, so the input is seen to follow it", ti.From)
			for other := range wantAlt {
				if other != ti && strings.HasPrefix(other.From, "Timing.") {
					assert.NotEqual(t, wantAlt[ti], wantAlt[other], "alt %s and %s differ, so a swap shows", ti.From, other.From)
				}
			}
		}
	}
}

func timingInputKeys(m map[TimingInput]any) []TimingInput {
	out := make([]TimingInput, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestALBDropsInvalidHeaderFields_CKV_AWS_131_AVD_AWS_0052(t *testing.T) {
	alb := findResource(t, planProd(t), TypeLoadBalancer, ComponentName+"-alb")
	assert.Equal(t, true, input(alb, "dropInvalidHeaderFields"), "%s dropInvalidHeaderFields", alb.Name)
	requireTrivyVerdict(t, "AWS-0052")
}

func TestALBDeletionProtection_CKV_AWS_150(t *testing.T) {
	alb := findResource(t, planProd(t), TypeLoadBalancer, ComponentName+"-alb")
	assert.Equal(t, true, input(alb, "enableDeletionProtection"), "%s enableDeletionProtection", alb.Name)
}

// The access logs expire after the stack's accessLogsExpireDays, under the
// stack's own prefix: the bucket's lifecycle rule takes the number as set.
func TestAccessLogsExpireAfterTheStacksDays(t *testing.T) {
	for _, days := range []string{"1", "90", "3650"} {
		cfg := withKey(prodConfig(t), KeyAccessLogsExpireDays, strp(days))
		rs, err := runProgram(t, Prod(), "prod", cfg)
		require.NoError(t, err, "days %s", days)
		lc := findResource(t, rs, TypeBucketLifecycle, ComponentName+"-access-logs-lifecycle")
		bucket := findResource(t, rs, TypeBucket, ComponentName+"-access-logs")
		assert.Equal(t, mockID(bucket), input(lc, "bucket"), "%s is %s's lifecycle", lc.Name, bucket.Name)
		assert.Equal(t, AccessLogsLifecycleRule, input(lc, "rules.0.id"), "%s rule id", lc.Name)
		assert.Equal(t, "Enabled", input(lc, "rules.0.status"), "%s rule enabled", lc.Name)
		assert.Equal(t, Project+"/prod/", input(lc, "rules.0.filter.prefix"), "%s expires the stack's own logs", lc.Name)
		assert.Equal(t, days, fmt.Sprint(input(lc, "rules.0.expiration.days")), "%s expires after the stack's days", lc.Name)
		assert.True(t, lc.Protect, "%s is protected like the bucket", lc.Name)
	}
	_, err := runProgram(t, Prod(), "prod", withKey(prodConfig(t), KeyAccessLogsExpireDays, strp("0")))
	assert.ErrorContains(t, err, "mythex-infra:accessLogsExpireDays 0 must be within 1–3650 days")
}

func TestALBAccessLogsPerStack_CKV_AWS_91(t *testing.T) {
	cfg := prodConfig(t)
	for _, stack := range []string{"prod", "staging"} {
		rs, err := runProgram(t, Prod(), stack, cfg)
		require.NoError(t, err, "stack %s", stack)
		alb := findResource(t, rs, TypeLoadBalancer, ComponentName+"-alb")
		assert.Equal(t, true, input(alb, "accessLogs.enabled"), "%s (stack %s) access logs enabled", alb.Name, stack)
		assert.Equal(t, cfg[KeyAccessLogsBucket], input(alb, "accessLogs.bucket"), "%s (stack %s) access logs bucket", alb.Name, stack)
		assert.Equal(t, Project+"/"+stack, input(alb, "accessLogs.prefix"), "%s (stack %s) access logs prefix is the stack's own", alb.Name, stack)
	}
}

func TestHTTPRedirectsToHTTPS_CKV_AWS_2_CKV2_AWS_20_AVD_AWS_0054(t *testing.T) {
	rs := planProd(t)
	alb := findResource(t, rs, TypeLoadBalancer, ComponentName+"-alb")
	listeners := ofType(rs, TypeListener)
	require.Len(t, listeners, 2)
	for _, l := range listeners {
		assert.Equal(t, mockARN(alb), input(l, "loadBalancerArn"), "%s belongs to %s", l.Name, alb.Name)
		if input(l, "protocol") == "HTTPS" {
			continue
		}
		// CKV_AWS_2: a listener is HTTPS or redirects; so every non-HTTPS one must redirect.
		assert.Equal(t, "HTTP", input(l, "protocol"), "%s protocol", l.Name)
		assert.Equal(t, float64(80), input(l, "port"), "%s port", l.Name)
		actions, _ := input(l, "defaultActions").([]any)
		assert.Len(t, actions, 1, "%s has exactly one default action", l.Name)
		assert.Equal(t, "redirect", input(l, "defaultActions.0.type"), "%s action", l.Name)
		assert.Equal(t, "HTTPS", input(l, "defaultActions.0.redirect.protocol"), "%s redirect protocol", l.Name)
		assert.Equal(t, "443", input(l, "defaultActions.0.redirect.port"), "%s redirect port", l.Name)
		assert.Equal(t, "HTTP_301", input(l, "defaultActions.0.redirect.statusCode"), "%s redirect status", l.Name)
		assert.Nil(t, input(l, "defaultActions.0.targetGroupArn"), "%s never forwards plain HTTP", l.Name)
	}
	requireTrivyVerdict(t, "AWS-0054")
}

func TestHTTPSListenerTLSPolicy_CKV_AWS_103_AVD_AWS_0047(t *testing.T) {
	rs := planProd(t)
	l := findResource(t, rs, TypeListener, ComponentName+"-https")
	assert.Equal(t, "HTTPS", input(l, "protocol"), "%s protocol", l.Name)
	assert.Equal(t, float64(443), input(l, "port"), "%s port", l.Name)
	assert.Equal(t, "ELBSecurityPolicy-TLS13-1-2-2021-06", input(l, "sslPolicy"), "%s sslPolicy", l.Name)
	assert.Equal(t, prodConfig(t)[KeyCertificateARN], input(l, "certificateArn"), "%s certificate", l.Name)
	requireTrivyVerdict(t, "AWS-0047")
}

func TestHTTPSListenerForwardsToTargetGroup(t *testing.T) {
	rs := planProd(t)
	l := findResource(t, rs, TypeListener, ComponentName+"-https")
	tg := findResource(t, rs, TypeTargetGroup, ComponentName+"-tg")
	assert.Equal(t, "forward", input(l, "defaultActions.0.type"), "%s action", l.Name)
	assert.Equal(t, mockARN(tg), input(l, "defaultActions.0.targetGroupArn"), "%s forwards to %s", l.Name, tg.Name)
}

func TestALBDesyncMitigation_CKV_AWS_328(t *testing.T) {
	alb := findResource(t, planProd(t), TypeLoadBalancer, ComponentName+"-alb")
	mode := input(alb, "desyncMitigationMode")
	assert.Contains(t, []any{"defensive", "strictest"}, mode, "%s desyncMitigationMode must not be monitor", alb.Name)
}

func TestTargetGroupHealthCheckPath_CKV_AWS_261(t *testing.T) {
	tg := findResource(t, planProd(t), TypeTargetGroup, ComponentName+"-tg")
	assert.Equal(t, true, input(tg, "healthCheck.enabled"), "%s health check enabled", tg.Name)
	assert.Equal(t, "/healthz", input(tg, "healthCheck.path"), "%s health check path", tg.Name)
	assert.Equal(t, "HTTP", input(tg, "healthCheck.protocol"), "%s health check protocol", tg.Name)
	assert.Equal(t, "traffic-port", input(tg, "healthCheck.port"), "%s health check port: the app's, so it checks what serves", tg.Name)
	assert.Equal(t, "200", input(tg, "healthCheck.matcher"), "%s health check matcher: a draining 503 is unhealthy", tg.Name)
}

func TestTargetGroupSendsToTheAppPortOfEachInstance(t *testing.T) {
	rs := planProd(t)
	cfg, err := ParseStackConfig(mapSource(prodConfig(t)))
	require.NoError(t, err)
	tg := findResource(t, rs, TypeTargetGroup, ComponentName+"-tg")
	port := float64(cfg.AppPort)
	assert.Equal(t, "HTTP", input(tg, "protocol"), "%s protocol", tg.Name)
	assert.Equal(t, "instance", input(tg, "targetType"), "%s target type", tg.Name)
	assert.Equal(t, port, input(tg, "port"), "%s port", tg.Name)
	assert.Equal(t, cfg.VPCID, input(tg, "vpcId"), "%s VPC", tg.Name)
	assert.Equal(t, float64(0), input(tg, "slowStart"), "%s slow start is off (reason in alb.go)", tg.Name)
	assert.Equal(t, false, input(tg, "stickiness.enabled"), "%s is not sticky: a client must not be pinned to a draining server", tg.Name)

	var targets []any
	for _, a := range ofType(rs, TypeAttachment) {
		assert.Equal(t, mockARN(tg), input(a, "targetGroupArn"), "%s joins %s", a.Name, tg.Name)
		assert.Equal(t, port, input(a, "port"), "%s port", a.Name)
		assert.Equal(t, ComponentName+"-target-"+fmt.Sprint(input(a, "targetId")), a.Name, "%s is named by its instance", a.Name)
		targets = append(targets, input(a, "targetId"))
	}
	assert.ElementsMatch(t, anySlice(cfg.InstanceIDs), targets, "one attachment per configured instance")
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func TestALBIsInternetFacingInThePublicSubnets(t *testing.T) {
	rs := planProd(t)
	cfg, err := ParseStackConfig(mapSource(prodConfig(t)))
	require.NoError(t, err)
	alb := findResource(t, rs, TypeLoadBalancer, ComponentName+"-alb")
	sg := findResource(t, rs, TypeSecurityGroup, ComponentName+"-alb-sg")
	assert.Equal(t, "application", input(alb, "loadBalancerType"), "%s type", alb.Name)
	assert.Equal(t, false, input(alb, "internal"), "%s is internet-facing", alb.Name)
	assert.Equal(t, anySlice(cfg.PublicSubnetIDs), input(alb, "subnets"), "%s subnets", alb.Name)
	assert.Equal(t, cfg.IPAddressType, input(alb, "ipAddressType"), "%s address type", alb.Name)
	assert.Equal(t, []any{mockID(sg)}, input(alb, "securityGroups"), "%s security groups", alb.Name)
	assert.Equal(t, true, input(alb, "enableHttp2"), "%s HTTP/2", alb.Name)
}

func TestALBOpenOnHTTPAndHTTPSFromAnywhere(t *testing.T) {
	rs := planProd(t)
	sg := findResource(t, rs, TypeSecurityGroup, ComponentName+"-alb-sg")
	type open struct {
		port float64
		cidr string
	}
	var got []open
	for _, r := range ofType(rs, TypeIngressRule) {
		if input(r, "securityGroupId") != mockID(sg) {
			continue
		}
		assert.Equal(t, "tcp", input(r, "ipProtocol"), "%s protocol", r.Name)
		assert.Equal(t, input(r, "fromPort"), input(r, "toPort"), "%s opens one port", r.Name)
		assert.Nil(t, input(r, "referencedSecurityGroupId"), "%s is for clients", r.Name)
		cidr := input(r, "cidrIpv4")
		if cidr == nil {
			cidr = input(r, "cidrIpv6")
		}
		got = append(got, open{input(r, "fromPort").(float64), fmt.Sprint(cidr)})
	}
	assert.ElementsMatch(t, []open{{80, "0.0.0.0/0"}, {80, "::/0"}, {443, "0.0.0.0/0"}, {443, "::/0"}}, got,
		"%s admits exactly 80 and 443 from anywhere, IPv4 and IPv6", sg.Name)
}

func TestServersReachableOnlyFromTheALBSecurityGroup(t *testing.T) {
	rs := planProd(t)
	cfg, err := ParseStackConfig(mapSource(prodConfig(t)))
	require.NoError(t, err)
	albSG := findResource(t, rs, TypeSecurityGroup, ComponentName+"-alb-sg")
	srvSG := findResource(t, rs, TypeSecurityGroup, ComponentName+"-servers-sg")
	for _, sg := range []PlannedResource{albSG, srvSG} {
		assert.Nil(t, input(sg, "ingress"), "%s has no inline rules that would fight the rule resources", sg.Name)
		assert.Nil(t, input(sg, "egress"), "%s has no inline rules that would fight the rule resources", sg.Name)
		assert.Equal(t, cfg.VPCID, input(sg, "vpcId"), "%s VPC", sg.Name)
	}

	var toServers []PlannedResource
	for _, r := range ofType(rs, TypeIngressRule) {
		if input(r, "securityGroupId") == mockID(srvSG) {
			toServers = append(toServers, r)
		}
	}
	require.Len(t, toServers, 1, "%s has exactly one ingress rule", srvSG.Name)
	r := toServers[0]
	assert.Equal(t, mockID(albSG), input(r, "referencedSecurityGroupId"), "%s admits the ALB's group", r.Name)
	assert.Nil(t, input(r, "cidrIpv4"), "%s admits no address range", r.Name)
	assert.Nil(t, input(r, "cidrIpv6"), "%s admits no address range", r.Name)
	assert.Nil(t, input(r, "prefixListId"), "%s admits no prefix list", r.Name)
	assert.Equal(t, "tcp", input(r, "ipProtocol"), "%s protocol", r.Name)
	assert.Equal(t, float64(cfg.AppPort), input(r, "fromPort"), "%s from port", r.Name)
	assert.Equal(t, float64(cfg.AppPort), input(r, "toPort"), "%s to port", r.Name)

	var egress []PlannedResource
	for _, r := range ofType(rs, TypeEgressRule) {
		if input(r, "securityGroupId") == mockID(albSG) {
			egress = append(egress, r)
		}
	}
	require.Len(t, egress, 1, "the ALB's only way out")
	e := egress[0]
	assert.Equal(t, mockID(albSG), input(e, "securityGroupId"), "%s belongs to the ALB's group", e.Name)
	assert.Equal(t, mockID(srvSG), input(e, "referencedSecurityGroupId"), "%s reaches only the servers' group", e.Name)
	assert.Equal(t, float64(cfg.AppPort), input(e, "fromPort"), "%s from port", e.Name)
	assert.Equal(t, float64(cfg.AppPort), input(e, "toPort"), "%s to port", e.Name)
}

// The stack outputs carry the live contract; values are read on the test
// goroutine from a buffered channel, never asserted inside Pulumi's.
func TestOutputsShowWhatIsLive(t *testing.T) {
	for name, tm := range map[string]Timing{"prod": Prod(), "alt": altTiming(t)} {
		t.Run(name, func(t *testing.T) {
			out, rec := outputsOf(t, tm, prodConfig(t))
			alb := findResource(t, rec.Resources(), TypeLoadBalancer, ComponentName+"-alb")
			tg := findResource(t, rec.Resources(), TypeTargetGroup, ComponentName+"-tg")
			assert.Equal(t, alb.Name+".dry-plan.invalid", out["albDnsName"], "albDnsName is %s's DNS name", alb.Name)
			assert.Equal(t, mockARN(tg), out["targetGroupArn"], "targetGroupArn is %s's", tg.Name)
			// What a Route 53 alias, CloudWatch and listener rules need.
			https := findResource(t, rec.Resources(), TypeListener, ComponentName+"-https")
			http := findResource(t, rec.Resources(), TypeListener, ComponentName+"-http")
			assert.Equal(t, "dry-plan-zone-"+alb.Name, out["albZoneId"], "albZoneId is %s's hosted zone", alb.Name)
			assert.Equal(t, mockARN(alb), out["albArn"], "albArn is %s's", alb.Name)
			assert.Equal(t, "app/"+alb.Name+"/dry-plan", out["albArnSuffix"], "albArnSuffix is %s's", alb.Name)
			assert.Equal(t, "targetgroup/"+tg.Name+"/dry-plan", out["targetGroupArnSuffix"], "targetGroupArnSuffix is %s's", tg.Name)
			assert.Equal(t, mockARN(https), out["httpsListenerArn"], "httpsListenerArn is %s's", https.Name)
			assert.Equal(t, mockARN(http), out["httpListenerArn"], "httpListenerArn is %s's", http.Name)
			assert.Equal(t, prodConfig(t)[KeyAccessLogsBucket], out["accessLogsBucket"], "accessLogsBucket")
			assert.Equal(t, Project+"/prod", out["accessLogsPrefix"], "accessLogsPrefix")
			assert.Equal(t, pulumi.ID(mockID(findResource(t, rec.Resources(), TypeSecurityGroup, ComponentName+"-servers-sg"))), out["serverSecurityGroupId"], "serverSecurityGroupId")
			assert.Equal(t, 8080, out["appPort"])
			assert.Equal(t, HealthPath, out["healthCheckPath"])
			assert.Equal(t, map[string]any{
				// Every field, what the deploy judges its change against.
				"healthCheckInterval":     tm.HealthCheckInterval.String(),
				"healthCheckTimeout":      tm.HealthCheckTimeout.String(),
				"unhealthyThreshold":      tm.UnhealthyThreshold,
				"healthyThreshold":        tm.HealthyThreshold,
				"nodeSkew":                tm.NodeSkew.String(),
				"drain":                   tm.Drain.String(),
				"drainQuiet":              tm.DrainQuiet.String(),
				"quietRequests":           tm.QuietRequests,
				"slots":                   tm.Slots,
				"registeredSlots":         tm.RegisteredSlots,
				"maxDrain":                tm.MaxDrain.String(),
				"shutdownTimeout":         tm.ShutdownTimeout.String(),
				"killMargin":              tm.KillMargin.String(),
				"stopGracePeriod":         tm.StopGracePeriod.String(),
				"deregistrationDelay":     tm.DeregistrationDelay.String(),
				"lbIdleTimeout":           tm.LBIdleTimeout.String(),
				"appKeepAlive":            tm.AppKeepAlive.String(),
				"readHeaderTimeout":       tm.ReadHeaderTimeout.String(),
				"maxRequest":              tm.MaxRequest.String(),
				"containerHealthInterval": tm.ContainerHealthInterval.String(),
				"containerHealthTimeout":  tm.ContainerHealthTimeout.String(),
				"startTimeout":            tm.StartTimeout.String(),
				"engineWork":              tm.EngineWork.String(),
				"lockWait":                tm.LockWait.String(),
				"deployHold":              tm.DeployHold.String(),
				"watchdogInterval":        tm.WatchdogInterval.String(),
				"watchdogStrikes":         tm.WatchdogStrikes,
				"maxPlannedDowntime":      tm.MaxPlannedDowntime.String(),
				// Derived, for people.
				"worstCaseDetection": tm.WorstCaseDetection().String(),
				"drainMargin":        tm.DrainMargin().String(),
				"reentry":            tm.Reentry().String(),
				"killSlack":          tm.KillSlack().String(),
				"keepAliveMargin":    tm.KeepAliveMargin().String(),
			}, out["timing"], "timing output")
		})
	}
}

func TestBadInputFailsBeforeAnyResource(t *testing.T) {
	broken := Prod()
	broken.Drain = 10 * time.Second // shorter than the 13 s worst-case detection
	broken.HealthCheckTimeout = 1500 * time.Millisecond
	require.Error(t, broken.Validate())

	tests := []struct {
		name   string
		timing Timing
		cfg    func(map[string]string) map[string]string
		want   []string
	}{
		{
			name: "invalid timing", timing: broken,
			want: []string{"invalid timing: 3 rule(s) broken", "drain-outlasts-detection: Drain 10s must exceed worst-case detection",
				"whole-seconds: HealthCheckTimeout 1.5s must be whole seconds", "aws-range: HealthCheckTimeout 1.5s must be within 2s–2m0s"},
		},
		{
			name: "missing vpc", timing: Prod(),
			cfg:  func(c map[string]string) map[string]string { return withKey(c, KeyVPCID, nil) },
			want: []string{"invalid stack config: 1 problem(s)", "mythex-infra:vpcId is not set"},
		},
		{
			name: "one subnet", timing: Prod(),
			cfg: func(c map[string]string) map[string]string {
				return withKey(c, KeyPublicSubnetIDs, strp(`["subnet-0123456789abcdef0"]`))
			},
			want: []string{"mythex-infra:publicSubnetIds has 1 entries, needs at least 2"},
		},
		{
			name: "port out of range", timing: Prod(),
			cfg:  func(c map[string]string) map[string]string { return withKey(c, KeyAppPort, strp("65536")) },
			want: []string{"mythex-infra:appPort 65536 must be within 1–65535"},
		},
		{
			name: "duplicate instance", timing: Prod(),
			cfg: func(c map[string]string) map[string]string {
				return withKey(c, KeyInstanceIDs, strp(`["i-0123456789abcdef0","i-0123456789abcdef0"]`))
			},
			want: []string{`mythex-infra:instanceIds [1] "i-0123456789abcdef0" repeats [0]`},
		},
		{
			name: "malformed certificate", timing: Prod(),
			cfg: func(c map[string]string) map[string]string {
				return withKey(c, KeyCertificateARN, strp("arn:aws:acm:us-east-1:1:certificate/x"))
			},
			want: []string{`mythex-infra:certificateArn "arn:aws:acm:us-east-1:1:certificate/x" is not an ACM certificate ARN`},
		},
		{
			name: "two slots without a second port", timing: twoSlots(),
			want: []string{"invalid stack config: 1 problem(s)",
				"mythex-infra:slotPort is not set: the timing contract registers 2 slots a server (RegisteredSlots)"},
		},
		{
			name: "a second port with one slot", timing: Prod(),
			cfg:  func(c map[string]string) map[string]string { return withKey(c, KeySlotPort, strp("8081")) },
			want: []string{"mythex-infra:slotPort 8081 is set, but the timing contract registers one slot a server (RegisteredSlots 1)"},
		},
		{
			name: "both slots on one port", timing: twoSlots(),
			cfg:  func(c map[string]string) map[string]string { return withKey(c, KeySlotPort, strp("8080")) },
			want: []string{"mythex-infra:slotPort 8080 must differ from mythex-infra:appPort 8080"},
		},
		{
			name: "a second port out of range", timing: twoSlots(),
			cfg:  func(c map[string]string) map[string]string { return withKey(c, KeySlotPort, strp("70000")) },
			want: []string{"mythex-infra:slotPort 70000 must be within 1–65535"},
		},
		{
			name: "timing and config together", timing: broken,
			cfg: func(c map[string]string) map[string]string {
				return withKey(withKey(c, KeyAppPort, strp("0")), KeyVPCID, strp("vpc-1"))
			},
			want: []string{"invalid timing: 3 rule(s) broken", "invalid stack config: 2 problem(s)",
				`mythex-infra:vpcId "vpc-1" is not a VPC ID`, "mythex-infra:appPort 0 must be within 1–65535"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := prodConfig(t)
			if tc.cfg != nil {
				cfg = tc.cfg(cfg)
			}
			rs, err := runProgram(t, tc.timing, "prod", cfg)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Empty(t, rs, "no resource is registered")
		})
	}
}

// The component refuses invalid args on its own too, for any caller that
// skips Build.
func TestNewLoadBalancerRefusesInvalidArgs(t *testing.T) {
	cfg, err := ParseStackConfig(mapSource(prodConfig(t)))
	require.NoError(t, err)
	badStack := cfg
	badStack.InstanceIDs = nil
	badTiming := Prod()
	badTiming.AppKeepAlive = badTiming.LBIdleTimeout

	for name, args := range map[string]*LoadBalancerArgs{
		"nil":    nil,
		"stack":  {Timing: Prod(), Stack: badStack},
		"timing": {Timing: badTiming, Stack: cfg},
	} {
		t.Run(name, func(t *testing.T) {
			rec := &Recorder{}
			err := pulumi.RunErr(func(ctx *pulumi.Context) error {
				_, err := NewLoadBalancer(ctx, "edge", args)
				return err
			}, pulumi.WithMocks(Project, "prod", rec))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "load balancer edge")
			assert.Empty(t, rec.Resources(), "no resource is registered")
		})
	}
}

// Two components in one stack never collide: every child is named after its
// component.
func TestTwoLoadBalancersDoNotCollide(t *testing.T) {
	cfg, err := ParseStackConfig(mapSource(prodConfig(t)))
	require.NoError(t, err)
	rec := &Recorder{}
	err = pulumi.RunErr(func(ctx *pulumi.Context) error {
		for _, name := range []string{"blue", "green"} {
			if _, err := NewLoadBalancer(ctx, name, &LoadBalancerArgs{Timing: Prod(), Stack: cfg}); err != nil {
				return err
			}
		}
		return nil
	}, pulumi.WithMocks(Project, "prod", rec))
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, r := range rec.Resources() {
		key := r.Type + "::" + r.Name
		assert.False(t, seen[key], "%s registered once", key)
		seen[key] = true
	}
	assert.Len(t, seen, 2*len(planProd(t)))
}

// TestBalancerFieldsAreTheComponentsInputs: the fields tagged balancer are
// the ones `pulumi up` applies, so they are the component's timing inputs;
// NodeSkew alone describes the balancer's nodes without being set on them.
func TestBalancerFieldsAreTheComponentsInputs(t *testing.T) {
	sides, err := FieldSides()
	require.NoError(t, err)
	var balancer []string
	for _, s := range sides {
		// NodeSkew describes the nodes; RegisteredSlots says how many
		// attachments a server has, not an input's value
		// (TestTwoSlotsRegisterEachServerTwice).
		if s.Side == SideBalancer && s.Field != "NodeSkew" && s.Field != "RegisteredSlots" {
			balancer = append(balancer, s.Field)
		}
	}
	var inputs []string
	for _, ti := range TimingInputs() {
		if f, ok := strings.CutPrefix(ti.From, "Timing."); ok {
			inputs = append(inputs, f)
		}
	}
	assert.ElementsMatch(t, inputs, balancer, "Timing fields the load balancer component sets vs fields tagged side:\"balancer\"")
}

// The timing output carries every field, so the deploy can judge a change
// against production; a field of a kind the output cannot carry fails here,
// before a stack could lose it.
func TestTimingOutputHasEveryField(t *testing.T) {
	out := contractOutputs(Prod())
	typ := reflect.TypeOf(Timing{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		assert.Contains(t, []reflect.Type{reflect.TypeOf(time.Duration(0)), reflect.TypeOf(0)}, f.Type, "field %s is a duration or a count", f.Name)
		assert.Contains(t, out, OutputKey(f.Name), "field %s is in the timing output", f.Name)
	}
	for field, key := range map[string]string{"HealthCheckInterval": "healthCheckInterval", "LBIdleTimeout": "lbIdleTimeout", "TTL": "ttl", "X": "x"} {
		assert.Equal(t, key, OutputKey(field), "OutputKey(%s)", field)
	}
}

// twoSlots is the production timing in the slots design (docs/capacity.md).
func twoSlots() Timing {
	tm := Prod()
	tm.Slots, tm.RegisteredSlots = 2, 2
	return tm
}

// TestTwoSlotsRegisterEachServerTwice: in the slots design the target group
// holds every server on both slots' ports, the security groups let the
// balancer reach both, and the outputs name the second port; today's
// resources keep their names, so a change of design only adds.
func TestTwoSlotsRegisterEachServerTwice(t *testing.T) {
	cfg := withKey(prodConfig(t), KeySlotPort, strp("8081"))
	stack, err := ParseStackConfig(mapSource(cfg))
	require.NoError(t, err)
	two, err := runProgram(t, twoSlots(), "prod", cfg)
	require.NoError(t, err)
	one := planProd(t)

	tg := findResource(t, two, TypeTargetGroup, ComponentName+"-tg")
	got := map[string]any{}
	for _, a := range ofType(two, TypeAttachment) {
		assert.Equal(t, mockARN(tg), input(a, "targetGroupArn"), "%s joins %s", a.Name, tg.Name)
		got[a.Name] = []any{input(a, "targetId"), input(a, "port")}
	}
	want := map[string]any{}
	for _, id := range stack.InstanceIDs {
		want[ComponentName+"-target-"+id] = []any{id, float64(8080)}
		want[ComponentName+"-target-"+id+"-slot"] = []any{id, float64(8081)}
	}
	assert.Equal(t, want, got, "each server on both ports")

	for _, rule := range []struct{ typ, name string }{
		{TypeEgressRule, ComponentName + "-alb-out-app"}, {TypeEgressRule, ComponentName + "-alb-out-slot"},
		{TypeIngressRule, ComponentName + "-servers-in-app"}, {TypeIngressRule, ComponentName + "-servers-in-slot"},
	} {
		r := findResource(t, two, rule.typ, rule.name)
		port := float64(8080)
		if strings.HasSuffix(rule.name, "-slot") {
			port = 8081
		}
		assert.Equal(t, port, input(r, "fromPort"), "%s", r.Name)
		assert.Equal(t, port, input(r, "toPort"), "%s", r.Name)
	}

	// Today's resources are all still there, under the same names: the
	// change adds an attachment a server and a rule each way.
	names := func(rs []PlannedResource) map[string]bool {
		out := map[string]bool{}
		for _, r := range rs {
			out[r.Type+" "+r.Name] = true
		}
		return out
	}
	before, after := names(one), names(two)
	for n := range before {
		assert.True(t, after[n], "%s is kept", n)
	}
	assert.Len(t, after, len(before)+len(stack.InstanceIDs)+2, "one attachment a server and two rules added")
}

func TestTwoSlotsOutputTheSecondPort(t *testing.T) {
	out, _ := outputsOf(t, twoSlots(), withKey(prodConfig(t), KeySlotPort, strp("8081")))
	assert.Equal(t, 8080, out["appPort"])
	assert.Equal(t, 8081, out["slotPort"])
	out, _ = outputsOf(t, Prod(), prodConfig(t))
	assert.NotContains(t, out, "slotPort", "one slot, no second port")
}

// outputsOf runs the stack's program with cfg and returns its outputs and
// what it registered.
func outputsOf(t *testing.T, tm Timing, cfg map[string]string) (map[string]any, *Recorder) {
	t.Helper()
	got := make(chan map[string]any, 1)
	rec := &Recorder{}
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		lb, err := Build(ctx, tm)
		if err != nil {
			return err
		}
		lb.Outputs().ToMapOutput().ApplyT(func(m map[string]any) map[string]any {
			got <- m
			return m
		})
		return nil
	}, pulumi.WithMocks(Project, "prod", rec), WithConfig(cfg))
	require.NoError(t, err)
	require.Len(t, got, 1, "outputs resolved")
	return <-got, rec
}
