package infra

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/elb"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// The provider functions (invokes) the program looks the stack's inputs up
// with, as the engine names them.
const (
	InvokePartition         = "aws:index/getPartition:getPartition"
	InvokeCallerIdentity    = "aws:index/getCallerIdentity:getCallerIdentity"
	InvokeELBServiceAccount = "aws:elb/getServiceAccount:getServiceAccount"
	InvokeSubnet            = "aws:ec2/getSubnet:getSubnet"
	InvokeInstance          = "aws:ec2/getInstance:getInstance"
)

// StackFacts is what the program learns from AWS about the stack's inputs
// before it creates anything.
type StackFacts struct {
	// Partition is the ARN partition of the account (aws, aws-cn, aws-us-gov).
	Partition string
	// AccountID is the account the stack deploys into; the access logs go
	// under AWSLogs/<AccountID>/ in the bucket.
	AccountID string
	// LogWriter is who writes the access logs in the stack's region.
	LogWriter LogWriter
	// SubnetZones is each public subnet's availability zone, in config order.
	SubnetZones []string
	// InstanceENIs is each instance's primary network interface, in config
	// order: the servers' security group is attached there.
	InstanceENIs []string
}

// LogWriter is the principal the bucket policy lets write access logs.
type LogWriter struct {
	// Kind is "AWS" (the region's Elastic Load Balancing account) or
	// "Service" (the log delivery service principal).
	Kind string
	// ID is the account's ARN or the service principal's name.
	ID string
}

// LogDeliveryPrincipal writes the access logs in regions opened from August
// 2022 on, which have no Elastic Load Balancing account of their own.
const LogDeliveryPrincipal = "logdelivery.elasticloadbalancing.amazonaws.com"

// elbAccountRegions are the regions available before August 2022, where AWS
// delivers access logs from the region's own Elastic Load Balancing account
// (elb.GetServiceAccount knows it); every later region uses
// LogDeliveryPrincipal, and the provider's lookup has no account for it.
var elbAccountRegions = []string{
	"us-east-1", "us-east-2", "us-west-1", "us-west-2",
	"af-south-1", "ap-east-1", "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
	"ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ca-central-1",
	"eu-central-1", "eu-west-1", "eu-west-2", "eu-west-3", "eu-south-1", "eu-north-1",
	"me-south-1", "sa-east-1", "us-gov-west-1", "us-gov-east-1", "cn-north-1", "cn-northwest-1",
}

// UsesELBAccount reports whether access logs in region are written by the
// region's Elastic Load Balancing account rather than LogDeliveryPrincipal.
func UsesELBAccount(region string) bool {
	return slices.Contains(elbAccountRegions, region)
}

// LookupStack asks AWS (through the provider's data sources) what a stack
// config alone cannot tell: that each public subnet is in the VPC and in
// which availability zone (an ALB needs two), that each instance exists in
// the VPC and which is its primary network interface, the account and
// partition, and who writes access logs in the region. Every problem is
// reported at once, as a StackConfigError. The certificate's status is not
// looked up: the provider finds certificates by domain, not by ARN.
func LookupStack(ctx *pulumi.Context, s StackConfig) (StackFacts, error) {
	var f StackFacts
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if p, err := aws.GetPartition(ctx, &aws.GetPartitionArgs{}); err != nil {
		fail("look up the account's partition: %v", err)
	} else {
		f.Partition = p.Partition
	}
	if id, err := aws.GetCallerIdentity(ctx, &aws.GetCallerIdentityArgs{}); err != nil {
		fail("look up the account: %v", err)
	} else {
		f.AccountID = id.AccountId
	}
	if UsesELBAccount(s.Region) {
		region := s.Region
		if sa, err := elb.GetServiceAccount(ctx, &elb.GetServiceAccountArgs{Region: &region}); err != nil {
			fail("%s %s: look up the region's Elastic Load Balancing account for the access logs: %v", KeyRegion, s.Region, err)
		} else {
			f.LogWriter = LogWriter{Kind: "AWS", ID: sa.Arn}
		}
	} else {
		f.LogWriter = LogWriter{Kind: "Service", ID: LogDeliveryPrincipal}
	}

	zones := map[string][]string{} // zone → subnets in it
	for i, id := range s.PublicSubnetIDs {
		id, vpc := id, s.VPCID
		sn, err := ec2.LookupSubnet(ctx, &ec2.LookupSubnetArgs{Id: &id, VpcId: &vpc})
		if err != nil {
			fail("%s [%d] %q: no such subnet in %s %s: %v", KeyPublicSubnetIDs, i, id, KeyVPCID, vpc, err)
			continue
		}
		if sn.VpcId != vpc {
			fail("%s [%d] %q is in VPC %s, not in %s %s", KeyPublicSubnetIDs, i, id, sn.VpcId, KeyVPCID, vpc)
		}
		f.SubnetZones = append(f.SubnetZones, sn.AvailabilityZone)
		zones[sn.AvailabilityZone] = append(zones[sn.AvailabilityZone], id)
	}
	if len(f.SubnetZones) == len(s.PublicSubnetIDs) && len(zones) < 2 {
		fail("%s %s are all in availability zone %s: an internet-facing ALB needs subnets in at least two availability zones",
			KeyPublicSubnetIDs, strings.Join(s.PublicSubnetIDs, ", "), f.SubnetZones[0])
	}

	for i, id := range s.InstanceIDs {
		id := id
		in, err := ec2.LookupInstance(ctx, &ec2.LookupInstanceArgs{
			InstanceId: &id,
			Filters:    []ec2.GetInstanceFilter{{Name: "vpc-id", Values: []string{s.VPCID}}},
		})
		if err != nil {
			fail("%s [%d] %q: no such instance in %s %s: %v", KeyInstanceIDs, i, id, KeyVPCID, s.VPCID, err)
			continue
		}
		switch {
		case in.InstanceState == "shutting-down" || in.InstanceState == "terminated":
			fail("%s [%d] %q is %s", KeyInstanceIDs, i, id, in.InstanceState)
		case in.NetworkInterfaceId == "":
			fail("%s [%d] %q has no primary network interface to attach the servers' security group to", KeyInstanceIDs, i, id)
		}
		f.InstanceENIs = append(f.InstanceENIs, in.NetworkInterfaceId)
	}
	if len(problems) > 0 {
		return StackFacts{}, &StackConfigError{Problems: problems}
	}
	return f, nil
}
