package contract

import (
	"bufio"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/mythex/infra/infra"
)

// Verdict is the rollout order of a change of the timing: the transition
// check (infra.CheckTransition) and, when no order is safe, the two-step
// split proposed instead (infra.ProposeSplit).
type Verdict struct {
	// Transition is nil when the change could not be judged; NotJudged says
	// why.
	Transition *infra.Transition
	NotJudged  string
	// Split is the proposal for a change with no safe order; nil when none
	// was found, and NoSplit says why.
	Split   *infra.Split
	NoSplit string
	// Added are fields the old revision does not have, judged at their new
	// value on both sides.
	Added []string
}

// JudgeTransition checks the change from old to new while it rolls out.
func JudgeTransition(old, new infra.Timing) Verdict {
	tr, err := infra.CheckTransition(old, new)
	if err != nil {
		return Verdict{NotJudged: err.Error()}
	}
	v := Verdict{Transition: &tr}
	if tr.Order != infra.NoSafeOrder {
		return v
	}
	split, ok, err := infra.ProposeSplit(old, new)
	switch {
	case err != nil:
		v.NoSplit = err.Error()
	case !ok:
		v.NoSplit = "no intermediate timing made of the old and new values gives two steps that each have a safe order: split it by hand"
	default:
		v.Split = &split
	}
	return v
}

// Judged reports whether the change has a verdict.
func (v Verdict) Judged() bool { return v.Transition != nil }

// Safe reports whether some order rolls the change out safely.
func (v Verdict) Safe() bool { return v.Judged() && v.Transition.Order != infra.NoSafeOrder }

// PulumiUp is when the deploy runs `pulumi up`: "before" the rollout or
// "after" it; empty when the change must not be deployed.
func (v Verdict) PulumiUp() string {
	if !v.Safe() {
		return ""
	}
	if v.Transition.Order == infra.ServersFirst {
		return "after"
	}
	return "before"
}

// Slug is the verdict as one machine-readable word: any-order,
// servers-first, balancer-first, unsafe or not-judged.
func (v Verdict) Slug() string {
	if !v.Judged() {
		return "not-judged"
	}
	return strings.ReplaceAll(string(v.Transition.Order), " ", "-")
}

// Reason is the verdict in one line, with what makes it so.
func (v Verdict) Reason() string {
	if !v.Judged() {
		return "not judged: " + v.NotJudged
	}
	tr := v.Transition
	breaks := func(o infra.Order) string {
		var vs []infra.Violation
		for _, s := range tr.Breaks(o) {
			vs = append(vs, s.Broken...)
		}
		return ruleList(vs)
	}
	switch tr.Order {
	case infra.AnyOrder:
		return "any order: every state between the two releases keeps every invariant"
	case infra.ServersFirst:
		return "servers first: roll the servers out, then run `pulumi up`; balancer first would break " + breaks(infra.BalancerFirst)
	case infra.BalancerFirst:
		return "balancer first: run `pulumi up`, then roll the servers out; servers first would break " + breaks(infra.ServersFirst)
	}
	return "unsafe in either order: servers first would break " + breaks(infra.ServersFirst) +
		", balancer first " + breaks(infra.BalancerFirst) + "; split the change in two"
}

func ruleList(vs []infra.Violation) string {
	seen := map[infra.Rule]bool{}
	var names []string
	for _, v := range vs {
		if !seen[v.Rule] {
			seen[v.Rule] = true
			names = append(names, "`"+string(v.Rule)+"`")
		}
	}
	return strings.Join(names, ", ")
}

// WriteVerdict prints the verdict as markdown: the order, what each side
// changes, every relation each unsafe order breaks with its values, and the
// two-step proposal when there is no safe order.
func WriteVerdict(w io.Writer, v Verdict) error {
	bw := bufio.NewWriter(w)
	writeVerdict(bw, v)
	if len(v.Added) > 0 {
		fmt.Fprintf(bw, "\nNew in this change, so judged at the new value on both sides: `%s`.\n", strings.Join(v.Added, "`, `"))
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write verdict: %w", err)
	}
	return nil
}

func writeVerdict(w io.Writer, v Verdict) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	if !v.Judged() {
		p("#### Rollout order: not judged\n\n%s\n", oneLine(v.NotJudged))
		return
	}
	tr := v.Transition
	p("#### Rollout order: **%s**\n\n%s.\n\n", tr.Order, v.Reason())
	writeSides(w, tr.Old, tr.New)
	for _, o := range []infra.Order{infra.ServersFirst, infra.BalancerFirst} {
		states := tr.Breaks(o)
		if len(states) == 0 {
			continue
		}
		p("\n%s breaks:\n\n", capitalize(string(o)))
		for _, s := range states {
			for _, vi := range s.Broken {
				p("- %s: `%s`: %s\n", s.Name, vi.Rule, vi.Msg)
			}
		}
	}
	if tr.Order != infra.NoSafeOrder {
		return
	}
	if v.Split == nil {
		p("\n**No two-step split proposed:** %s.\n", oneLine(v.NoSplit))
		return
	}
	p("\n**Split it in two changes, each deployed on its own:**\n\n")
	p("1. %s (**%s**)\n", changeList(tr.Old, v.Split.Mid), v.Split.First.Order)
	p("2. then %s (**%s**)\n", changeList(v.Split.Mid, tr.New), v.Split.Next.Order)
}

// writeSides says what `pulumi up` and what the rollout change.
func writeSides(w io.Writer, old, new infra.Timing) {
	sides, err := infra.FieldSides()
	if err != nil {
		fmt.Fprintf(w, "%s\n", err)
		return
	}
	by := map[infra.Side][]string{}
	o, n := TakeSnapshot(old).Fields, TakeSnapshot(new).Fields
	for i, s := range sides {
		if o[i].Int != n[i].Int {
			by[s.Side] = append(by[s.Side], fmt.Sprintf("`%s` %s → %s", s.Field, valueText(o[i]), valueText(n[i])))
		}
	}
	line := func(s infra.Side) string {
		if len(by[s]) == 0 {
			return "nothing"
		}
		return strings.Join(by[s], ", ")
	}
	fmt.Fprintf(w, "`pulumi up` changes the balancer: %s. The rollout changes the servers, one at a time: %s.\n",
		line(infra.SideBalancer), line(infra.SideServers))
}

// changeList lists the fields that differ between two timings.
func changeList(from, to infra.Timing) string {
	f, t := TakeSnapshot(from).Fields, TakeSnapshot(to).Fields
	var out []string
	typ := reflect.TypeOf(from)
	for i := range f {
		if f[i].Int != t[i].Int {
			out = append(out, fmt.Sprintf("`%s` %s → %s", typ.Field(i).Name, valueText(f[i]), valueText(t[i])))
		}
	}
	return "change " + strings.Join(out, ", ")
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
