package infra

import (
	"fmt"
	"strings"
	"sync"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// PlannedResource is one resource the program registered with the mock
// engine, with the inputs it would send to AWS.
type PlannedResource struct {
	Type   string
	Name   string
	Parent string // the parent's URN; empty for the stack's children
	Custom bool   // false for components, which AWS never sees
	Inputs resource.PropertyMap
	// Protect is Pulumi's protect option: the engine refuses to delete or
	// replace the resource until it is unprotected.
	Protect bool
	// RetainOnDelete: a delete removes it from the stack, not from AWS.
	RetainOnDelete bool
	// DependsOn are the URNs of every resource it waits for: those named in
	// pulumi.DependsOn and those whose outputs are among its inputs.
	DependsOn []string
	// ID and ARN are the placeholders the mock engine answered with; other
	// resources' inputs carry them where they refer to this one.
	ID, ARN string
	// Deps maps each top-level input to the URNs of the resources its value
	// came from (Pulumi's property dependencies).
	Deps map[string][]string
}

// Recorder is a Pulumi mock engine (pulumi.MockResourceMonitor) that records
// every resource registered with it and answers like AWS would, with
// placeholder identities: an id, an arn, and for a load balancer a dnsName,
// zoneId and arnSuffix, all marked dry-plan. The dry plan and the tests run
// the stack's program against it; nothing leaves the process.
type Recorder struct {
	// Lookups answers the program's provider functions (its lookups of
	// subnets, instances, the account); nil means DryLookups.
	Lookups func(pulumi.MockCallArgs) (resource.PropertyMap, error)

	mu        sync.Mutex
	resources []PlannedResource
	calls     []pulumi.MockCallArgs
}

var _ pulumi.MockResourceMonitor = (*Recorder)(nil)

// NewResource records args and returns the inputs as the resource's state.
func (r *Recorder) NewResource(args pulumi.MockResourceArgs) (string, resource.PropertyMap, error) {
	parent := ""
	if args.RegisterRPC != nil {
		parent = args.RegisterRPC.GetParent()
	}
	r.mu.Lock()
	pr := PlannedResource{
		Type:   args.TypeToken,
		Name:   args.Name,
		Parent: parent,
		Custom: args.Custom,
		Inputs: args.Inputs.Copy(),
	}
	if rpc := args.RegisterRPC; rpc != nil {
		pr.Protect = rpc.GetProtect()
		pr.RetainOnDelete = rpc.GetRetainOnDelete()
		pr.DependsOn = rpc.GetDependencies()
		pr.Deps = map[string][]string{}
		for k, d := range rpc.GetPropertyDependencies() {
			pr.Deps[k] = d.GetUrns()
		}
	}
	if args.Custom {
		pr.ID, pr.ARN = "dry-plan-"+args.Name, "arn:dry-plan:"+args.Name
	}
	r.resources = append(r.resources, pr)
	r.mu.Unlock()

	state := args.Inputs.Copy()
	if !args.Custom {
		return "", state, nil
	}
	state["arn"] = resource.NewProperty(pr.ARN)
	switch args.TypeToken {
	case TypeLoadBalancer:
		state["dnsName"] = resource.NewProperty(args.Name + ".dry-plan.invalid")
		state["zoneId"] = resource.NewProperty("dry-plan-zone-" + args.Name)
		state["arnSuffix"] = resource.NewProperty("app/" + args.Name + "/dry-plan")
	case TypeTargetGroup:
		state["arnSuffix"] = resource.NewProperty("targetgroup/" + args.Name + "/dry-plan")
	}
	return pr.ID, state, nil
}

// Call answers the program's provider functions with r.Lookups, or
// DryLookups when it is nil, and records each call.
func (r *Recorder) Call(args pulumi.MockCallArgs) (resource.PropertyMap, error) {
	r.mu.Lock()
	r.calls = append(r.calls, args)
	lookups := r.Lookups
	r.mu.Unlock()
	if lookups == nil {
		lookups = DryLookups
	}
	return lookups(args)
}

// Calls returns the provider functions called so far, in order.
func (r *Recorder) Calls() []pulumi.MockCallArgs {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]pulumi.MockCallArgs(nil), r.calls...)
}

// DryAccountID is the account every dry lookup answers with: AWS's own
// documentation placeholder, the one Pulumi.prod.yaml's placeholders use.
const DryAccountID = "123456789012"

// DryLookups answers each lookup the program makes as a well-set-up account
// would, from the lookup's own arguments: a subnet is in the VPC asked for,
// each in an availability zone of its own; an instance is running in the
// VPC asked for, with a primary network interface; the ELB log-delivery
// account of a region is a placeholder. The dry plan shows what the program
// does with such answers; only `pulumi preview` asks AWS.
func DryLookups(args pulumi.MockCallArgs) (resource.PropertyMap, error) {
	str := func(k string) string {
		if v, ok := args.Args[resource.PropertyKey(k)]; ok && v.IsString() {
			return v.StringValue()
		}
		return ""
	}
	out := func(m map[string]any) (resource.PropertyMap, error) {
		return resource.NewPropertyMapFromMap(m), nil
	}
	switch args.Token {
	case InvokePartition:
		return out(map[string]any{"id": "aws", "partition": "aws", "dnsSuffix": "amazonaws.com"})
	case InvokeCallerIdentity:
		return out(map[string]any{"id": DryAccountID, "accountId": DryAccountID,
			"arn": "arn:aws:iam::" + DryAccountID + ":user/dry-plan", "userId": "dry-plan"})
	case InvokeELBServiceAccount:
		region := str("region")
		return out(map[string]any{"id": "dry-plan-elb-account-" + region, "region": region,
			"arn": "arn:aws:iam::dry-plan-elb-account-of-" + region + ":root"})
	case InvokeSubnet:
		id := str("id")
		return out(map[string]any{"id": id, "vpcId": str("vpcId"), "availabilityZone": "dry-plan-az-of-" + id,
			"state": "available"})
	case InvokeInstance:
		id := str("instanceId")
		return out(map[string]any{"id": id, "instanceId": id, "instanceState": "running",
			"networkInterfaceId": "dry-plan-eni-of-" + id})
	}
	return nil, fmt.Errorf("the dry plan has no answer for %s(%s)", args.Token, strings.Join(keys(args.Args), ", "))
}

func keys(m resource.PropertyMap) []string {
	out := make([]string, 0, len(m))
	for _, k := range m.StableKeys() {
		out = append(out, string(k))
	}
	return out
}

// Resources returns what was registered so far, in order.
func (r *Recorder) Resources() []PlannedResource {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PlannedResource, len(r.resources))
	copy(out, r.resources)
	return out
}

// WithConfig sets the stack config the program reads, as the engine would
// from the stack file.
func WithConfig(cfg map[string]string) pulumi.RunOption {
	return func(info *pulumi.RunInfo) {
		info.Config = cfg
	}
}
