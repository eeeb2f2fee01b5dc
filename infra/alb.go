package infra

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"
	"unicode"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/lb"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/s3"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/vpc"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// ComponentType is the Pulumi type of the load balancer component.
const ComponentType = "mythex:infra:LoadBalancer"

// ComponentName is the name the stack gives its one load balancer; every
// child's name starts with it.
const ComponentName = "mythex"

// The resource types the component creates, as the engine names them.
const (
	TypeLoadBalancer   = "aws:lb/loadBalancer:LoadBalancer"
	TypeTargetGroup    = "aws:lb/targetGroup:TargetGroup"
	TypeListener       = "aws:lb/listener:Listener"
	TypeAttachment     = "aws:lb/targetGroupAttachment:TargetGroupAttachment"
	TypeSecurityGroup  = "aws:ec2/securityGroup:SecurityGroup"
	TypeIngressRule    = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
	TypeEgressRule     = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
	TypeENIAttachment  = "aws:ec2/networkInterfaceSecurityGroupAttachment:NetworkInterfaceSecurityGroupAttachment"
	anywhereIPv4       = "0.0.0.0/0"
	anywhereIPv6       = "::/0"
	httpPort           = 80
	httpsPort          = 443
	protocolTCP        = "tcp"
	redirectStatusCode = "HTTP_301"
)

// TLSPolicy is the HTTPS listener's security policy: TLS 1.3 and 1.2 with
// forward-secret ciphers only. It passes checkov CKV_AWS_103 and trivy
// AVD-AWS-0047, which rejects the TLS13 "Ext" policies checkov accepts.
const TLSPolicy = "ELBSecurityPolicy-TLS13-1-2-2021-06"

// DesyncMitigationMode is "defensive", AWS's default written down so a
// provider default can never drift it to "monitor" (CKV_AWS_328): it blocks
// requests that can smuggle, yet still serves merely unusual ones, which
// "strictest" would turn away from real clients.
const DesyncMitigationMode = "defensive"

// SlowStart is off (0 s). Slow start ramps a re-admitted target's share over
// 30–900 s; in a rolling deploy that keeps the neighbours loaded past
// Timing.Reentry while the next server already drains. The api starts warm in
// about a second (no caches to fill, no JIT), so there is nothing to ramp.
const SlowStart = 0

// TimingInput is one resource input the component takes from the timing
// contract: the dry plan marks it, the tests check it follows Timing.
type TimingInput struct {
	// Type is the resource's type token.
	Type string
	// Input is the input's path inside the resource, dot-separated.
	Input string
	// From is the Timing field (or infra constant) it is built from.
	From string
}

// TimingInputs lists every timing-derived input NewLoadBalancer sets.
func TimingInputs() []TimingInput {
	return []TimingInput{
		{TypeLoadBalancer, "idleTimeout", "Timing.LBIdleTimeout"},
		{TypeTargetGroup, "healthCheck.interval", "Timing.HealthCheckInterval"},
		{TypeTargetGroup, "healthCheck.timeout", "Timing.HealthCheckTimeout"},
		{TypeTargetGroup, "healthCheck.healthyThreshold", "Timing.HealthyThreshold"},
		{TypeTargetGroup, "healthCheck.unhealthyThreshold", "Timing.UnhealthyThreshold"},
		{TypeTargetGroup, "healthCheck.path", "HealthPath"},
		{TypeTargetGroup, "healthCheck.matcher", "HealthyStatus"},
		{TypeTargetGroup, "deregistrationDelay", "Timing.DeregistrationDelay"},
	}
}

// slotNames are each slot's, in the order StackConfig.Ports gives them:
// the suffix of its rules' and attachments' names, and the port as the
// rules and errors call it. The first slot's are today's, so a change of
// design only adds resources.
var slotNames = [MaxSlots]struct{ suffix, port string }{
	{"app", "the app port"},
	{"slot", "the second slot's port"},
}

// LoadBalancerArgs is everything a load balancer is built from.
type LoadBalancerArgs struct {
	Timing Timing
	Stack  StackConfig
}

// LoadBalancer is the public entry to Mythex's servers: an internet-facing
// ALB whose target group checks and drains each server on the timing
// contract's schedule.
type LoadBalancer struct {
	pulumi.ResourceState

	ALB                 *lb.LoadBalancer
	ALBSecurityGroup    *ec2.SecurityGroup
	ServerSecurityGroup *ec2.SecurityGroup
	TargetGroup         *lb.TargetGroup
	HTTPS               *lb.Listener
	HTTP                *lb.Listener
	Attachments         []*lb.TargetGroupAttachment
	// ServerAttachments put ServerSecurityGroup on each server's primary
	// network interface, in instanceIds order.
	ServerAttachments []*ec2.NetworkInterfaceSecurityGroupAttachment
	// AccessLogsBucket receives the ALB's access logs; it outlives the stack.
	AccessLogsBucket *s3.BucketV2

	// DNSName is where clients (and the DNS record pointing at us) go.
	DNSName pulumi.StringOutput
	// TargetGroupARN identifies the target group the deploy job drains from.
	TargetGroupARN pulumi.StringOutput

	outputs pulumi.Map
}

// Build is the stack's program: it reads the stack config from ctx, checks it
// and t together (every problem of both at once, before any resource
// exists), then builds the load balancer. `pulumi up` and the dry plan both
// run it.
func Build(ctx *pulumi.Context, t Timing) (*LoadBalancer, error) {
	stack, stackErr := ParseStackConfig(ctx.GetConfig)
	var slotsErr error
	if stackErr == nil {
		slotsErr = CheckSlots(t, stack)
	}
	if err := errors.Join(t.Validate(), stackErr, slotsErr); err != nil {
		return nil, err
	}
	return NewLoadBalancer(ctx, ComponentName, &LoadBalancerArgs{Timing: t, Stack: stack})
}

// NewLoadBalancer validates args and looks the stack's inputs up in AWS
// (LookupStack), then creates the ALB, its access-log bucket, its security
// groups, target group, listeners and, per server, a target group attachment
// and the servers' security group on its primary network interface, all
// children of one component named name. Invalid args or a failed lookup
// register nothing.
//
// Every resource but the per-server attachments is protected, since losing
// any of them is an outage or loses logs: `pulumi destroy`, a replacement,
// or a rename without an alias stops at the preview instead of deleting
// listeners and the target group and then failing on the ALB's deletion
// protection. Renaming the component or a child needs pulumi.Aliases with
// the old name (docs/loadbalancer.md, "Protected").
func NewLoadBalancer(ctx *pulumi.Context, name string, args *LoadBalancerArgs, opts ...pulumi.ResourceOption) (*LoadBalancer, error) {
	if args == nil {
		return nil, errors.New("load balancer " + name + ": args are required")
	}
	if err := errors.Join(args.Timing.Validate(), args.Stack.Validate(), CheckSlots(args.Timing, args.Stack)); err != nil {
		return nil, fmt.Errorf("load balancer %s: %w", name, err)
	}
	t, s := args.Timing, args.Stack
	facts, err := LookupStack(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("load balancer %s: %w", name, err)
	}

	c := &LoadBalancer{}
	if err := ctx.RegisterComponentResource(ComponentType, name, c, opts...); err != nil {
		return nil, fmt.Errorf("register component %s: %w", name, err)
	}
	child := pulumi.Parent(c)
	protected := pulumi.Protect(true)
	tags := pulumi.StringMap{"project": pulumi.String(ctx.Project()), "stack": pulumi.String(ctx.Stack())}

	// Security groups. Rules are their own resources so each one shows in a
	// diff on its own; the groups carry none inline, and the provider strips
	// AWS's default allow-all egress.
	c.ALBSecurityGroup, err = ec2.NewSecurityGroup(ctx, name+"-alb-sg", &ec2.SecurityGroupArgs{
		VpcId:               pulumi.String(s.VPCID),
		Description:         pulumi.String("Mythex ALB: HTTP and HTTPS from anywhere"),
		RevokeRulesOnDelete: pulumi.Bool(true),
		Tags:                tags,
	}, child, protected)
	if err != nil {
		return nil, fmt.Errorf("create ALB security group: %w", err)
	}
	c.ServerSecurityGroup, err = ec2.NewSecurityGroup(ctx, name+"-servers-sg", &ec2.SecurityGroupArgs{
		VpcId:               pulumi.String(s.VPCID),
		Description:         pulumi.String("Mythex servers: the app port from the ALB only"),
		RevokeRulesOnDelete: pulumi.Bool(true),
		Tags:                tags,
	}, child, protected)
	if err != nil {
		return nil, fmt.Errorf("create servers security group: %w", err)
	}
	for _, in := range []struct {
		suffix string
		port   int
		cidr4  string
		cidr6  string
	}{
		{"http-ipv4", httpPort, anywhereIPv4, ""},
		{"http-ipv6", httpPort, "", anywhereIPv6},
		{"https-ipv4", httpsPort, anywhereIPv4, ""},
		{"https-ipv6", httpsPort, "", anywhereIPv6},
	} {
		ruleArgs := &vpc.SecurityGroupIngressRuleArgs{
			SecurityGroupId: c.ALBSecurityGroup.ID(),
			Description:     pulumi.String("clients, port " + strconv.Itoa(in.port)),
			IpProtocol:      pulumi.String(protocolTCP),
			FromPort:        pulumi.Int(in.port),
			ToPort:          pulumi.Int(in.port),
			Tags:            tags,
		}
		if in.cidr4 != "" {
			ruleArgs.CidrIpv4 = pulumi.String(in.cidr4)
		} else {
			ruleArgs.CidrIpv6 = pulumi.String(in.cidr6)
		}
		if _, err := vpc.NewSecurityGroupIngressRule(ctx, name+"-alb-in-"+in.suffix, ruleArgs, child, protected); err != nil {
			return nil, fmt.Errorf("create ALB ingress rule %s: %w", in.suffix, err)
		}
	}
	// Traffic and health checks both go to each slot's port ("traffic-port"):
	// the app port, and in the slots design the second slot's. Today's rules
	// keep their names, so a change of design only adds.
	for i, port := range s.Ports(t) {
		suffix, what := slotNames[i].suffix, slotNames[i].port
		note := ""
		if i > 0 {
			note = " (" + what + ")"
		}
		if _, err := vpc.NewSecurityGroupEgressRule(ctx, name+"-alb-out-"+suffix, &vpc.SecurityGroupEgressRuleArgs{
			SecurityGroupId:           c.ALBSecurityGroup.ID(),
			Description:               pulumi.String("requests and health checks to the servers" + note),
			IpProtocol:                pulumi.String(protocolTCP),
			FromPort:                  pulumi.Int(port),
			ToPort:                    pulumi.Int(port),
			ReferencedSecurityGroupId: c.ServerSecurityGroup.ID(),
			Tags:                      tags,
		}, child, protected); err != nil {
			return nil, fmt.Errorf("create ALB egress rule to %s: %w", what, err)
		}
		if _, err := vpc.NewSecurityGroupIngressRule(ctx, name+"-servers-in-"+suffix, &vpc.SecurityGroupIngressRuleArgs{
			SecurityGroupId:           c.ServerSecurityGroup.ID(),
			Description:               pulumi.String(what + ", from the ALB only"),
			IpProtocol:                pulumi.String(protocolTCP),
			FromPort:                  pulumi.Int(port),
			ToPort:                    pulumi.Int(port),
			ReferencedSecurityGroupId: c.ALBSecurityGroup.ID(),
			Tags:                      tags,
		}, child, protected); err != nil {
			return nil, fmt.Errorf("create servers ingress rule for %s: %w", what, err)
		}
	}
	// The servers reach out over HTTPS only: the SSM endpoints that carry the
	// deploy's ssh (Session Manager), and the image registry for docker pull.
	// Security groups do not filter DNS to the Amazon-provided resolver,
	// instance metadata or the Amazon Time Sync Service, so nothing else is
	// needed.
	for _, out := range []struct{ suffix, cidr4, cidr6 string }{
		{"https-ipv4", anywhereIPv4, ""},
		{"https-ipv6", "", anywhereIPv6},
	} {
		ruleArgs := &vpc.SecurityGroupEgressRuleArgs{
			SecurityGroupId: c.ServerSecurityGroup.ID(),
			Description:     pulumi.String("HTTPS out: SSM Session Manager for deploys, the image registry for docker pull"),
			IpProtocol:      pulumi.String(protocolTCP),
			FromPort:        pulumi.Int(httpsPort),
			ToPort:          pulumi.Int(httpsPort),
			Tags:            tags,
		}
		if out.cidr4 != "" {
			ruleArgs.CidrIpv4 = pulumi.String(out.cidr4)
		} else {
			ruleArgs.CidrIpv6 = pulumi.String(out.cidr6)
		}
		if _, err := vpc.NewSecurityGroupEgressRule(ctx, name+"-servers-out-"+out.suffix, ruleArgs, child, protected); err != nil {
			return nil, fmt.Errorf("create servers egress rule %s: %w", out.suffix, err)
		}
	}

	prefix := AccessLogsPrefix(ctx.Project(), ctx.Stack())
	logs, err := newAccessLogBucket(ctx, name, s.AccessLogsBucket, prefix, s.AccessLogsExpireDays, facts, tags, protected, child)
	if err != nil {
		return nil, err
	}
	c.AccessLogsBucket = logs.bucket

	c.ALB, err = lb.NewLoadBalancer(ctx, name+"-alb", &lb.LoadBalancerArgs{
		LoadBalancerType:         pulumi.String("application"),
		Internal:                 pulumi.Bool(false),
		IpAddressType:            pulumi.String(s.IPAddressType),
		Subnets:                  pulumi.ToStringArray(s.PublicSubnetIDs),
		SecurityGroups:           pulumi.StringArray{c.ALBSecurityGroup.ID()},
		IdleTimeout:              pulumi.Int(seconds(t.LBIdleTimeout)),
		DropInvalidHeaderFields:  pulumi.Bool(true),
		EnableDeletionProtection: pulumi.Bool(true),
		DesyncMitigationMode:     pulumi.String(DesyncMitigationMode),
		EnableHttp2:              pulumi.Bool(true),
		AccessLogs: &lb.LoadBalancerAccessLogsArgs{
			Bucket:  logs.bucket.Bucket,
			Prefix:  pulumi.String(prefix),
			Enabled: pulumi.Bool(true),
		},
		Tags: tags,
	}, child, protected, pulumi.DependsOn(logs.ready))
	if err != nil {
		return nil, fmt.Errorf("create ALB: %w", err)
	}

	c.TargetGroup, err = lb.NewTargetGroup(ctx, name+"-tg", &lb.TargetGroupArgs{
		VpcId:                      pulumi.String(s.VPCID),
		TargetType:                 pulumi.String("instance"),
		Protocol:                   pulumi.String("HTTP"),
		ProtocolVersion:            pulumi.String("HTTP1"),
		Port:                       pulumi.Int(s.AppPort),
		LoadBalancingAlgorithmType: pulumi.String("round_robin"),
		DeregistrationDelay:        pulumi.Int(seconds(t.DeregistrationDelay)),
		SlowStart:                  pulumi.Int(SlowStart),
		// Sticky sessions would pin clients to a draining server.
		Stickiness: &lb.TargetGroupStickinessArgs{
			Enabled: pulumi.Bool(false),
			Type:    pulumi.String("lb_cookie"),
		},
		HealthCheck: &lb.TargetGroupHealthCheckArgs{
			Enabled:            pulumi.Bool(true),
			Protocol:           pulumi.String("HTTP"),
			Port:               pulumi.String("traffic-port"),
			Path:               pulumi.String(HealthPath),
			Matcher:            pulumi.String(strconv.Itoa(HealthyStatus)),
			Interval:           pulumi.Int(seconds(t.HealthCheckInterval)),
			Timeout:            pulumi.Int(seconds(t.HealthCheckTimeout)),
			HealthyThreshold:   pulumi.Int(t.HealthyThreshold),
			UnhealthyThreshold: pulumi.Int(t.UnhealthyThreshold),
		},
		Tags: tags,
	}, child, protected)
	if err != nil {
		return nil, fmt.Errorf("create target group: %w", err)
	}

	c.HTTPS, err = lb.NewListener(ctx, name+"-https", &lb.ListenerArgs{
		LoadBalancerArn: c.ALB.Arn,
		Port:            pulumi.Int(httpsPort),
		Protocol:        pulumi.String("HTTPS"),
		CertificateArn:  pulumi.String(s.CertificateARN),
		SslPolicy:       pulumi.String(TLSPolicy),
		DefaultActions: lb.ListenerDefaultActionArray{&lb.ListenerDefaultActionArgs{
			Type:           pulumi.String("forward"),
			TargetGroupArn: c.TargetGroup.Arn,
		}},
		Tags: tags,
	}, child, protected)
	if err != nil {
		return nil, fmt.Errorf("create HTTPS listener: %w", err)
	}
	c.HTTP, err = lb.NewListener(ctx, name+"-http", &lb.ListenerArgs{
		LoadBalancerArn: c.ALB.Arn,
		Port:            pulumi.Int(httpPort),
		Protocol:        pulumi.String("HTTP"),
		DefaultActions: lb.ListenerDefaultActionArray{&lb.ListenerDefaultActionArgs{
			Type: pulumi.String("redirect"),
			Redirect: &lb.ListenerDefaultActionRedirectArgs{
				Protocol:   pulumi.String("HTTPS"),
				Port:       pulumi.String(strconv.Itoa(httpsPort)),
				StatusCode: pulumi.String(redirectStatusCode),
			},
		}},
		Tags: tags,
	}, child, protected)
	if err != nil {
		return nil, fmt.Errorf("create HTTP listener: %w", err)
	}

	// Named by instance ID, so adding or removing one server leaves the
	// others' attachments alone. Membership is not protected: adding and
	// removing servers is routine. The ALB may only send to the servers'
	// group, so each server carries it on its primary network interface.
	for i, id := range s.InstanceIDs {
		sga, err := ec2.NewNetworkInterfaceSecurityGroupAttachment(ctx, name+"-servers-sg-"+id,
			&ec2.NetworkInterfaceSecurityGroupAttachmentArgs{
				SecurityGroupId:    c.ServerSecurityGroup.ID(),
				NetworkInterfaceId: pulumi.String(facts.InstanceENIs[i]),
			}, child)
		if err != nil {
			return nil, fmt.Errorf("attach the servers' security group to %s: %w", id, err)
		}
		c.ServerAttachments = append(c.ServerAttachments, sga)

		// One target a slot: the instance on each slot's port. The first
		// keeps today's name, so a change of design only adds.
		for j, port := range s.Ports(t) {
			target := name + "-target-" + id
			if j > 0 {
				target += "-" + slotNames[j].suffix
			}
			a, err := lb.NewTargetGroupAttachment(ctx, target, &lb.TargetGroupAttachmentArgs{
				TargetGroupArn: c.TargetGroup.Arn,
				TargetId:       pulumi.String(id),
				Port:           pulumi.Int(port),
			}, child)
			if err != nil {
				return nil, fmt.Errorf("attach server %s on %s: %w", id, slotNames[j].port, err)
			}
			c.Attachments = append(c.Attachments, a)
		}
	}

	c.DNSName = c.ALB.DnsName
	c.TargetGroupARN = c.TargetGroup.Arn
	c.outputs = pulumi.Map{
		"albDnsName": c.DNSName,
		// For a Route 53 alias record to the ALB.
		"albZoneId": c.ALB.ZoneId,
		"albArn":    c.ALB.Arn,
		// CloudWatch's LoadBalancer and TargetGroup dimensions.
		"albArnSuffix":          c.ALB.ArnSuffix,
		"targetGroupArn":        c.TargetGroupARN,
		"targetGroupArnSuffix":  c.TargetGroup.ArnSuffix,
		"httpsListenerArn":      c.HTTPS.Arn,
		"httpListenerArn":       c.HTTP.Arn,
		"accessLogsBucket":      c.AccessLogsBucket.Bucket,
		"accessLogsPrefix":      pulumi.String(prefix),
		"albSecurityGroupId":    c.ALBSecurityGroup.ID(),
		"serverSecurityGroupId": c.ServerSecurityGroup.ID(),
		"appPort":               pulumi.Int(s.AppPort),
		"healthCheckPath":       pulumi.String(HealthPath),
		"timing":                contractOutputs(t),
	}
	if len(s.Ports(t)) > 1 {
		c.outputs["slotPort"] = pulumi.Int(s.SlotPort)
	}
	if err := ctx.RegisterResourceOutputs(c, c.outputs); err != nil {
		return nil, fmt.Errorf("register outputs of %s: %w", name, err)
	}
	return c, nil
}

// Outputs are the stack outputs: where the balancer is (DNS name and Route 53
// zone), the ARNs of the ALB, target group and listeners and the ARN
// suffixes CloudWatch names them by, where the access logs go, the security
// groups, the port the deploy job publishes the api on (MYTHEX_APP_PORT),
// and the timing contract that is live.
func (c *LoadBalancer) Outputs() pulumi.Map {
	return c.outputs
}

// AccessLogsPrefix is where in the bucket a stack's access logs go, so stacks
// sharing a bucket never mix their logs.
func AccessLogsPrefix(project, stack string) string {
	return project + "/" + stack
}

// contractOutputs are the timing contract as `pulumi stack output timing`
// shows it: every field of Timing under OutputKey(field), which is what the
// deploy judges its change against (production runs this stack's last
// `pulumi up`), and the derived numbers people read; durations in Go's
// notation, counts as numbers.
func contractOutputs(t Timing) pulumi.Map {
	d := func(v time.Duration) pulumi.String { return pulumi.String(v.String()) }
	m := pulumi.Map{
		"worstCaseDetection": d(t.WorstCaseDetection()),
		"drainMargin":        d(t.DrainMargin()),
		"reentry":            d(t.Reentry()),
		"killSlack":          d(t.KillSlack()),
		"keepAliveMargin":    d(t.KeepAliveMargin()),
	}
	v := reflect.ValueOf(t)
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		switch x := v.Field(i).Interface().(type) {
		case time.Duration:
			m[OutputKey(f.Name)] = d(x)
		case int:
			m[OutputKey(f.Name)] = pulumi.Int(x)
		default:
			// Timing holds durations and counts only; TestTimingOutputHasEveryField
			// fails on a field of another kind before a stack could lose it.
		}
	}
	return m
}

// OutputKey is the key of a Timing field in the stack's timing output: its
// name with the leading capitals lowered, LBIdleTimeout → lbIdleTimeout.
func OutputKey(field string) string {
	r := []rune(field)
	n := 0
	for n < len(r) && unicode.IsUpper(r[n]) {
		n++
	}
	// In "LBIdle", the I starts the next word.
	if n > 1 && n < len(r) {
		n--
	}
	for i := 0; i < n; i++ {
		r[i] = unicode.ToLower(r[i])
	}
	return string(r)
}

// seconds converts a duration the ALB API takes in whole seconds. Validate
// has already refused any that is not whole.
func seconds(d time.Duration) int {
	return int(d / time.Second)
}
