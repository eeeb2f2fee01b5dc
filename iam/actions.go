// Package iam holds the deploy role's policies as code: its OIDC trust
// (deploy-role-trust.json) and its permissions (deploy-role-policy.json), and
// the table this package's test checks the permissions against, of the AWS
// calls the Pulumi program, the deploy workflow and the rollout make.
//
// The test derives the list of calls from the code: the resource types and
// provider functions the program registers under Pulumi's mocks (each
// through ResourceActions and InvokeActions below), the `aws SERVICE
// COMMAND` lines of the deploy workflow and the server hooks, and the
// aws-sdk-go-v2 operations the Go commands call. The policy must allow each
// and nothing else.
package iam

// ResourceActions are the IAM actions the Pulumi AWS provider calls to
// create, read, update and delete (or, retained on delete, let go of) each
// resource type the program registers, tags included. Deleting the access
// log bucket is absent on purpose: the bucket is retained on delete.
var ResourceActions = map[string][]string{
	"aws:ec2/securityGroup:SecurityGroup": {
		"ec2:CreateSecurityGroup", "ec2:DescribeSecurityGroups", "ec2:DeleteSecurityGroup",
		// The provider removes the default allow-all egress rule of a new group.
		"ec2:RevokeSecurityGroupEgress",
		// Deleting a group waits for the network interfaces that hold it.
		"ec2:DescribeNetworkInterfaces",
		"ec2:CreateTags", "ec2:DeleteTags",
	},
	"aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": {
		"ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress",
		"ec2:DescribeSecurityGroupRules", "ec2:ModifySecurityGroupRules", "ec2:CreateTags", "ec2:DeleteTags",
	},
	"aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": {
		"ec2:AuthorizeSecurityGroupEgress", "ec2:RevokeSecurityGroupEgress",
		"ec2:DescribeSecurityGroupRules", "ec2:ModifySecurityGroupRules", "ec2:CreateTags", "ec2:DeleteTags",
	},
	"aws:ec2/networkInterfaceSecurityGroupAttachment:NetworkInterfaceSecurityGroupAttachment": {
		"ec2:DescribeNetworkInterfaces", "ec2:ModifyNetworkInterfaceAttribute",
	},
	"aws:lb/loadBalancer:LoadBalancer": {
		"elasticloadbalancing:CreateLoadBalancer", "elasticloadbalancing:DescribeLoadBalancers",
		"elasticloadbalancing:DescribeLoadBalancerAttributes", "elasticloadbalancing:ModifyLoadBalancerAttributes",
		"elasticloadbalancing:SetSecurityGroups", "elasticloadbalancing:SetSubnets", "elasticloadbalancing:SetIpAddressType",
		"elasticloadbalancing:DeleteLoadBalancer",
		"elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags", "elasticloadbalancing:DescribeTags",
		// The account's first load balancer creates ELB's service-linked
		// role; a fresh account's first `pulumi up` fails without it.
		"iam:CreateServiceLinkedRole",
	},
	"aws:lb/targetGroup:TargetGroup": {
		"elasticloadbalancing:CreateTargetGroup", "elasticloadbalancing:DescribeTargetGroups",
		"elasticloadbalancing:DescribeTargetGroupAttributes", "elasticloadbalancing:ModifyTargetGroup",
		"elasticloadbalancing:ModifyTargetGroupAttributes", "elasticloadbalancing:DeleteTargetGroup",
		"elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags", "elasticloadbalancing:DescribeTags",
	},
	"aws:lb/listener:Listener": {
		"elasticloadbalancing:CreateListener", "elasticloadbalancing:DescribeListeners",
		"elasticloadbalancing:DescribeListenerAttributes", "elasticloadbalancing:ModifyListenerAttributes",
		"elasticloadbalancing:ModifyListener", "elasticloadbalancing:DeleteListener",
		"elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags", "elasticloadbalancing:DescribeTags",
	},
	"aws:lb/targetGroupAttachment:TargetGroupAttachment": {
		"elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets",
		"elasticloadbalancing:DescribeTargetHealth",
	},
	"aws:s3/bucketV2:BucketV2": {
		"s3:CreateBucket", "s3:ListBucket", "s3:GetBucketLocation", "s3:GetBucketTagging", "s3:PutBucketTagging",
		// What the provider reads back of a bucket.
		"s3:GetBucketAcl", "s3:GetBucketCORS", "s3:GetBucketWebsite", "s3:GetBucketVersioning",
		"s3:GetAccelerateConfiguration", "s3:GetBucketRequestPayment", "s3:GetBucketLogging",
		"s3:GetLifecycleConfiguration", "s3:GetReplicationConfiguration", "s3:GetEncryptionConfiguration",
		"s3:GetBucketObjectLockConfiguration", "s3:GetBucketPolicy",
	},
	"aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2": {
		"s3:PutEncryptionConfiguration", "s3:GetEncryptionConfiguration",
	},
	"aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": {
		"s3:PutBucketPublicAccessBlock", "s3:GetBucketPublicAccessBlock",
	},
	"aws:s3/bucketPolicy:BucketPolicy": {
		"s3:PutBucketPolicy", "s3:GetBucketPolicy", "s3:DeleteBucketPolicy",
	},
	"aws:s3/bucketLifecycleConfigurationV2:BucketLifecycleConfigurationV2": {
		"s3:PutLifecycleConfiguration", "s3:GetLifecycleConfiguration",
	},
}

// InvokeActions are the IAM actions of each provider function the program
// calls. getPartition and getServiceAccount are answered by the provider
// itself; sts:GetCallerIdentity needs no permission.
var InvokeActions = map[string][]string{
	"aws:index/getPartition:getPartition":           nil,
	"aws:index/getCallerIdentity:getCallerIdentity": nil,
	"aws:elb/getServiceAccount:getServiceAccount":   nil,
	"aws:ec2/getSubnet:getSubnet":                   {"ec2:DescribeSubnets"},
	"aws:ec2/getInstance:getInstance":               {"ec2:DescribeInstances", "ec2:DescribeInstanceAttribute", "ec2:DescribeTags"},
}

// CLIServices maps an `aws` CLI service name to its IAM service prefix.
var CLIServices = map[string]string{
	"elbv2":      "elasticloadbalancing",
	"ssm":        "ssm",
	"cloudwatch": "cloudwatch",
	"ec2":        "ec2",
	"s3api":      "s3",
}

// CLIExtraActions are the actions a CLI command needs beyond its own: the
// Session Manager plugin ends and resumes the session it started.
var CLIExtraActions = map[string][]string{
	"ssm:StartSession": {"ssm:TerminateSession", "ssm:ResumeSession"},
}

// SDKServices maps an aws-sdk-go-v2 service package to its IAM prefix.
var SDKServices = map[string]string{
	"cloudwatch":             "cloudwatch",
	"elasticloadbalancingv2": "elasticloadbalancing",
	"ec2":                    "ec2",
	"ssm":                    "ssm",
}
