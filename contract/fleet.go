package contract

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/mythex/infra/infra"
)

// ProdStackFile is the stack file, at the module root, whose servers
// TIMING.md and `timing show` count.
const ProdStackFile = "Pulumi.prod.yaml"

// Fleet is the rollout the contract's fleet values are shown for: a stack's
// servers, at most MaxUnavailable of them out of service at once.
type Fleet struct {
	// Stack names the stack the servers are from.
	Stack string
	// Servers is how many servers the stack's balancer fronts (its
	// mythex-infra:instanceIds).
	Servers int
	// MaxUnavailable is the rollout's --max-unavailable, as a count.
	MaxUnavailable int
}

// StackFleet is the rollout of stack's servers at the rollout's default
// --max-unavailable. A stack config the program would refuse is refused
// here too, with every problem.
func StackFleet(stack infra.StackFile) (Fleet, error) {
	cfg, err := infra.ParseStackConfig(stack.Get)
	if err != nil {
		return Fleet{}, fmt.Errorf("servers of stack %s: %w", stack.Stack, err)
	}
	return Fleet{Stack: stack.Stack, Servers: len(cfg.InstanceIDs), MaxUnavailable: infra.DefaultMaxUnavailable}, nil
}

// LoadProdFleet reads the fleet of ProdStackFile at the module root.
func LoadProdFleet(root string) (Fleet, error) {
	stack, err := infra.LoadStackFile(filepath.Join(root, ProdStackFile))
	if err != nil {
		return Fleet{}, fmt.Errorf("the prod fleet: %w", err)
	}
	return StackFleet(stack)
}

// LoadProdFleetHere finds the module root from the working directory and
// reads the prod fleet there.
func LoadProdFleetHere() (Fleet, error) {
	root, err := FindModuleRoot(".")
	if err != nil {
		return Fleet{}, err
	}
	return LoadProdFleet(root)
}

// FleetValue is one number of a fleet's rollout, as the contract shows it.
type FleetValue struct {
	// Call is the function with the fleet's arguments, e.g.
	// "RolloutMin(2, 1)".
	Call string
	// Value is a count or a formatted duration.
	Value string
	// Doc is the function's doc comment: what the value is, and its formula.
	Doc string
}

// BatchCounts are package infra's counts of a fleet's batches, in the order
// the contract shows them, before the durations that multiply them.
var BatchCounts = []struct {
	Name  string
	Count func(servers, maxUnavailable int) int
}{
	{"RolloutBatches", infra.RolloutBatches},
	{"RolloutBatchesMax", infra.RolloutBatchesMax},
	{"RollbackBatchesMax", infra.RollbackBatchesMax},
}

// FleetValues evaluates BatchCounts and every fleet method of
// Timing (src.Fleet, in source order) for f at t. A rollout that
// infra.CheckRollout refuses is an error.
func FleetValues(t infra.Timing, f Fleet, src *Source) ([]FleetValue, error) {
	if err := infra.CheckRollout(f.Servers, f.MaxUnavailable); err != nil {
		return nil, fmt.Errorf("stack %s: %w", f.Stack, err)
	}
	call := func(name string) string { return fmt.Sprintf("%s(%d, %d)", name, f.Servers, f.MaxUnavailable) }
	var out []FleetValue
	for _, c := range BatchCounts {
		out = append(out, FleetValue{
			Call:  call(c.Name),
			Value: strconv.Itoa(c.Count(f.Servers, f.MaxUnavailable)),
			Doc:   src.FuncDoc[c.Name],
		})
	}
	args := []reflect.Value{reflect.ValueOf(f.Servers), reflect.ValueOf(f.MaxUnavailable)}
	for _, name := range src.Fleet {
		m := reflect.ValueOf(t).MethodByName(name)
		if !m.IsValid() {
			return nil, fmt.Errorf("the source declares Timing.%s, the compiled Timing has no such method", name)
		}
		d := m.Call(args)[0].Interface().(time.Duration)
		out = append(out, FleetValue{Call: call(name), Value: FormatDuration(d), Doc: src.FleetDoc[name]})
	}
	return out, nil
}

// fleetMethods lists, in name order, the compiled Timing's methods that
// take two ints and return a time.Duration.
func fleetMethods() []string {
	intType := reflect.TypeOf(0)
	typ := reflect.TypeOf(infra.Timing{})
	var names []string
	for i := 0; i < typ.NumMethod(); i++ {
		m := typ.Method(i).Type // the receiver is its first input
		if m.NumIn() == 3 && m.In(1) == intType && m.In(2) == intType && m.NumOut() == 1 && m.Out(0) == durationType {
			names = append(names, typ.Method(i).Name)
		}
	}
	slices.Sort(names)
	return names
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}
