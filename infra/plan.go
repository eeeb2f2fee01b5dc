package infra

import (
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
}

// Recorder is a Pulumi mock engine (pulumi.MockResourceMonitor) that records
// every resource registered with it and answers like AWS would, with
// placeholder identities: an id, an arn, and for a load balancer a dnsName,
// all marked dry-plan. The dry plan and the tests run the stack's program
// against it; nothing leaves the process.
type Recorder struct {
	mu        sync.Mutex
	resources []PlannedResource
}

var _ pulumi.MockResourceMonitor = (*Recorder)(nil)

// NewResource records args and returns the inputs as the resource's state.
func (r *Recorder) NewResource(args pulumi.MockResourceArgs) (string, resource.PropertyMap, error) {
	parent := ""
	if args.RegisterRPC != nil {
		parent = args.RegisterRPC.GetParent()
	}
	r.mu.Lock()
	r.resources = append(r.resources, PlannedResource{
		Type:   args.TypeToken,
		Name:   args.Name,
		Parent: parent,
		Custom: args.Custom,
		Inputs: args.Inputs.Copy(),
	})
	r.mu.Unlock()

	state := args.Inputs.Copy()
	if !args.Custom {
		return "", state, nil
	}
	state["arn"] = resource.NewProperty("arn:dry-plan:" + args.Name)
	if args.TypeToken == TypeLoadBalancer {
		state["dnsName"] = resource.NewProperty(args.Name + ".dry-plan.invalid")
	}
	return "dry-plan-" + args.Name, state, nil
}

// Call answers provider functions, which the program does not use.
func (r *Recorder) Call(pulumi.MockCallArgs) (resource.PropertyMap, error) {
	return resource.PropertyMap{}, nil
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
