package infra

import (
	"fmt"
	"math/bits"
	"reflect"
)

// MaxSplitFields bounds ProposeSplit's search, which tries every subset of
// the changed fields (2^n of them).
const MaxSplitFields = 16

// Split is a change made in two: old → Mid first, Mid → new next, each step
// with a safe order of its own.
type Split struct {
	Mid         Timing
	First, Next Transition
}

// ProposeSplit looks for an intermediate timing that turns a change with no
// safe order into two changes that each have one. Every field of the
// intermediate is either old's or new's value, and the first step changes as
// few fields as it can (e.g. raise the drain first, change the interval
// next). ok is false when no such intermediate exists.
func ProposeSplit(old, new Timing) (split Split, ok bool, err error) {
	if _, err := CheckTransition(old, new); err != nil {
		return Split{}, false, err
	}
	o, n := reflect.ValueOf(old), reflect.ValueOf(new)
	var changed []int
	for i := 0; i < o.NumField(); i++ {
		if o.Field(i).Interface() != n.Field(i).Interface() {
			changed = append(changed, i)
		}
	}
	if len(changed) > MaxSplitFields {
		return Split{}, false, fmt.Errorf("%d fields changed at once, more than the %d a split is searched for: change fewer at a time", len(changed), MaxSplitFields)
	}
	full := 1<<len(changed) - 1
	for size := 1; size < len(changed); size++ {
		for set := 1; set < full; set++ {
			if bits.OnesCount(uint(set)) != size {
				continue
			}
			mid := old
			m := reflect.ValueOf(&mid).Elem()
			for j, i := range changed {
				if set&(1<<j) != 0 {
					m.Field(i).Set(n.Field(i))
				}
			}
			first, err := CheckTransition(old, mid)
			if err != nil || first.Order == NoSafeOrder {
				continue // mid itself breaks a relation, or old → mid has no safe order
			}
			next, err := CheckTransition(mid, new)
			if err != nil || next.Order == NoSafeOrder {
				continue
			}
			return Split{Mid: mid, First: first, Next: next}, true, nil
		}
	}
	return Split{}, false, nil
}
