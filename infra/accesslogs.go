package infra

import (
	"encoding/json"
	"fmt"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/s3"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// The access-log bucket's resource types, as the engine names them.
const (
	TypeBucket             = "aws:s3/bucketV2:BucketV2"
	TypeBucketEncryption   = "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2"
	TypeBucketPublicAccess = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
	TypeBucketPolicy       = "aws:s3/bucketPolicy:BucketPolicy"
	TypeBucketLifecycle    = "aws:s3/bucketLifecycleConfigurationV2:BucketLifecycleConfigurationV2"
)

// AccessLogsLifecycleRule is the id of the rule that expires the logs.
const AccessLogsLifecycleRule = "expire-access-logs"

// AccessLogsEncryption is SSE-S3: the only server-side encryption ALB
// access-log delivery writes to (it cannot use a KMS key).
const AccessLogsEncryption = "AES256"

// accessLogBucket is the bucket the ALB writes its access logs to, with
// everything AWS checks before it enables them.
type accessLogBucket struct {
	bucket *s3.BucketV2
	// ready are what the ALB must wait for: AWS checks the policy and the
	// encryption when access logs are enabled, after the ALB exists.
	ready []pulumi.Resource
}

// newAccessLogBucket creates the stack's access-log bucket in the stack's
// region, encrypted with SSE-S3, closed to the public, with a policy that
// lets the region's log writer put objects under prefix/AWSLogs/<account>/
// and nowhere else, and a lifecycle rule that deletes each log expireDays
// after it was written. The bucket is protected and retained on delete: the
// logs outlive the load balancer, for as long as the rule keeps them.
func newAccessLogBucket(ctx *pulumi.Context, name, bucketName, prefix string, expireDays int, facts StackFacts,
	tags pulumi.StringMap, protected, child pulumi.ResourceOption) (*accessLogBucket, error) {
	b, err := s3.NewBucketV2(ctx, name+"-access-logs", &s3.BucketV2Args{
		Bucket:       pulumi.String(bucketName),
		ForceDestroy: pulumi.Bool(false),
		Tags:         tags,
	}, child, protected, pulumi.RetainOnDelete(true))
	if err != nil {
		return nil, fmt.Errorf("create access-log bucket: %w", err)
	}
	enc, err := s3.NewBucketServerSideEncryptionConfigurationV2(ctx, name+"-access-logs-sse", &s3.BucketServerSideEncryptionConfigurationV2Args{
		Bucket: b.ID(),
		Rules: s3.BucketServerSideEncryptionConfigurationV2RuleArray{&s3.BucketServerSideEncryptionConfigurationV2RuleArgs{
			ApplyServerSideEncryptionByDefault: &s3.BucketServerSideEncryptionConfigurationV2RuleApplyServerSideEncryptionByDefaultArgs{
				SseAlgorithm: pulumi.String(AccessLogsEncryption),
			},
		}},
	}, child, protected)
	if err != nil {
		return nil, fmt.Errorf("create access-log bucket encryption: %w", err)
	}
	pab, err := s3.NewBucketPublicAccessBlock(ctx, name+"-access-logs-private", &s3.BucketPublicAccessBlockArgs{
		Bucket:                b.ID(),
		BlockPublicAcls:       pulumi.Bool(true),
		BlockPublicPolicy:     pulumi.Bool(true),
		IgnorePublicAcls:      pulumi.Bool(true),
		RestrictPublicBuckets: pulumi.Bool(true),
	}, child, protected)
	if err != nil {
		return nil, fmt.Errorf("create access-log bucket public access block: %w", err)
	}
	doc, err := AccessLogsPolicy(facts, bucketName, prefix)
	if err != nil {
		return nil, err
	}
	// After the public access block, so S3 never sees the two change at once.
	pol, err := s3.NewBucketPolicy(ctx, name+"-access-logs-policy", &s3.BucketPolicyArgs{
		Bucket: b.ID(),
		Policy: pulumi.String(doc),
	}, child, protected, pulumi.DependsOn([]pulumi.Resource{pab}))
	if err != nil {
		return nil, fmt.Errorf("create access-log bucket policy: %w", err)
	}
	// Only the stack's own prefix: the logs are all the bucket holds, and a
	// bucket shared with another stack keeps that stack's rule for its own.
	if _, err := s3.NewBucketLifecycleConfigurationV2(ctx, name+"-access-logs-lifecycle", &s3.BucketLifecycleConfigurationV2Args{
		Bucket: b.ID(),
		Rules: s3.BucketLifecycleConfigurationV2RuleArray{&s3.BucketLifecycleConfigurationV2RuleArgs{
			Id:         pulumi.String(AccessLogsLifecycleRule),
			Status:     pulumi.String("Enabled"),
			Filter:     &s3.BucketLifecycleConfigurationV2RuleFilterArgs{Prefix: pulumi.String(prefix + "/")},
			Expiration: &s3.BucketLifecycleConfigurationV2RuleExpirationArgs{Days: pulumi.Int(expireDays)},
		}},
	}, child, protected); err != nil {
		return nil, fmt.Errorf("create access-log bucket lifecycle: %w", err)
	}
	return &accessLogBucket{bucket: b, ready: []pulumi.Resource{enc, pol}}, nil
}

// AccessLogsPolicy is the bucket policy that lets the stack region's log
// writer put access logs under prefix/AWSLogs/<account>/ of bucket, as AWS's
// "Access logs for your Application Load Balancer" asks: the region's
// Elastic Load Balancing account where there is one, the log delivery
// service principal elsewhere.
func AccessLogsPolicy(f StackFacts, bucket, prefix string) (string, error) {
	type statement struct {
		Sid       string
		Effect    string
		Principal map[string]string
		Action    string
		Resource  string
	}
	doc := struct {
		Version   string
		Statement []statement
	}{
		Version: "2012-10-17",
		Statement: []statement{{
			Sid:       "ALBAccessLogsWrite",
			Effect:    "Allow",
			Principal: map[string]string{f.LogWriter.Kind: f.LogWriter.ID},
			Action:    "s3:PutObject",
			Resource:  AccessLogsObjectsARN(f, bucket, prefix),
		}},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("encode access-log bucket policy: %w", err)
	}
	return string(b), nil
}

// AccessLogsObjectsARN is where in bucket the ALB writes its access logs.
func AccessLogsObjectsARN(f StackFacts, bucket, prefix string) string {
	return fmt.Sprintf("arn:%s:s3:::%s/%s/AWSLogs/%s/*", f.Partition, bucket, prefix, f.AccountID)
}
