package infra

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Side is what applies a Timing field in production: `pulumi up` or the
// rollout.
type Side string

// The two sides, as a field's `side` tag names them.
const (
	// SideBalancer: the target group and the load balancer.
	SideBalancer Side = "balancer"
	// SideServers: each server's release (compose definition, hooks, the
	// containers' environment).
	SideServers Side = "servers"
)

// FieldSide is one Timing field's `side` tag, read.
type FieldSide struct {
	Field string
	Side  Side
	// Process marks a servers value a running container took from its
	// environment when it started: it keeps the old release's value until
	// the deploy replaces it.
	Process bool
}

// FieldSides reads every Timing field's side, in field order.
func FieldSides() ([]FieldSide, error) {
	return SidesOf(reflect.TypeOf(Timing{}))
}

// tagSides are the values a `side` tag may take.
var tagSides = map[string]FieldSide{
	"balancer":        {Side: SideBalancer},
	"servers":         {Side: SideServers},
	"servers,process": {Side: SideServers, Process: true},
}

// SidesOf reads the `side` tag of every field of the struct type typ; the
// error names every field whose tag is missing or unknown, all at once.
func SidesOf(typ reflect.Type) ([]FieldSide, error) {
	out := make([]FieldSide, 0, typ.NumField())
	var bad []string
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		tag := f.Tag.Get("side")
		s, ok := tagSides[tag]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s (side %q)", f.Name, tag))
		}
		s.Field = f.Name
		out = append(out, s)
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%s: each field needs a tag `side:\"balancer\"`, `side:\"servers\"` or `side:\"servers,process\"`; missing or unknown on %s",
			typ.Name(), strings.Join(bad, ", "))
	}
	return out, nil
}

// Order is a transition's verdict: in which order `pulumi up` (the
// balancer) and the rollout (the servers) may apply it.
type Order string

// The verdicts.
const (
	AnyOrder      Order = "any order"
	ServersFirst  Order = "servers first"
	BalancerFirst Order = "balancer first"
	NoSafeOrder   Order = "unsafe"
)

// State is one mixed state a change passes through, as the timing a server
// and the balancer in front of it live by.
type State struct {
	// Order is the order that passes through the state.
	Order Order
	// Name says which side is at which release.
	Name   string
	Timing Timing
	// Broken are the relations the state breaks (Relations, as Validate
	// checks them).
	Broken []Violation
}

// Transition is the check of one change of the timing while it rolls out.
type Transition struct {
	Old, New Timing
	Order    Order
	// States are the mixed states, servers first's then balancer first's.
	States []State
}

// Breaks returns the states of order o that break a relation.
func (tr Transition) Breaks(o Order) []State {
	var out []State
	for _, s := range tr.States {
		if s.Order == o && len(s.Broken) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// mixedState is one state a rollout passes through: whose balancer, whose
// running containers, whose definition and hooks.
type mixedState struct {
	order           Order
	name            string
	bal, proc, defn func(old, new Timing) Timing
}

func oldOf(old, _ Timing) Timing { return old }
func newOf(_, new Timing) Timing { return new }

// mixedStates are every state between two releases that is neither of them.
// A server being deployed stops its old containers under the new
// definition: the compose file is installed before the containers are
// replaced, and compose stops the old ones with the new stop_grace_period,
// with the new watchdog already on its timer. Servers of both releases share
// the one balancer of the moment, so each server's state is judged against
// it.
var mixedStates = []mixedState{
	{ServersFirst, "servers first, mid-rollout: the old balancer; a server's old containers stop under the new definition", oldOf, oldOf, newOf},
	{ServersFirst, "servers first, before `pulumi up`: the old balancer; servers of the new release", oldOf, newOf, newOf},
	{BalancerFirst, "balancer first, before the rollout: the new balancer; servers of the old release", newOf, oldOf, oldOf},
	{BalancerFirst, "balancer first, mid-rollout: the new balancer; a server's old containers stop under the new definition", newOf, oldOf, newOf},
}

// CheckTransition judges the change from old to new while it rolls out:
// every mixed state is checked with the same relations Validate checks, and
// the verdict says which order of `pulumi up` and the rollout keeps them all.
// Both ends must keep every invariant themselves.
func CheckTransition(old, new Timing) (Transition, error) {
	sides, err := FieldSides()
	if err != nil {
		return Transition{}, err
	}
	var errs []error
	if err := old.ValidateInvariants(); err != nil {
		errs = append(errs, fmt.Errorf("old timing: %w", err))
	}
	if err := new.ValidateInvariants(); err != nil {
		errs = append(errs, fmt.Errorf("new timing: %w", err))
	}
	if len(errs) > 0 {
		return Transition{}, fmt.Errorf("a transition is judged between two valid timings: %w", errors.Join(errs...))
	}
	tr := Transition{Old: old, New: new}
	ok := map[Order]bool{ServersFirst: true, BalancerFirst: true}
	for _, m := range mixedStates {
		t := mix(sides, m.bal(old, new), m.proc(old, new), m.defn(old, new))
		s := State{Order: m.order, Name: m.name, Timing: t, Broken: t.invariantViolations()}
		ok[m.order] = ok[m.order] && len(s.Broken) == 0
		tr.States = append(tr.States, s)
	}
	tr.Order = verdicts[[2]bool{ok[ServersFirst], ok[BalancerFirst]}]
	return tr, nil
}

// verdicts is the order given whether servers first and balancer first
// each keep every relation.
var verdicts = map[[2]bool]Order{
	{true, true}:   AnyOrder,
	{true, false}:  ServersFirst,
	{false, true}:  BalancerFirst,
	{false, false}: NoSafeOrder,
}

// mix is what one server and the balancer in front of it live by: the
// balancer's fields from bal, the values the server's running containers
// hold from proc, the rest of the server's from defn.
func mix(sides []FieldSide, bal, proc, defn Timing) Timing {
	var out Timing
	o := reflect.ValueOf(&out).Elem()
	for i, s := range sides {
		src := defn
		if s.Side == SideBalancer {
			src = bal
		} else if s.Process {
			src = proc
		}
		o.Field(i).Set(reflect.ValueOf(src).Field(i))
	}
	return out
}
