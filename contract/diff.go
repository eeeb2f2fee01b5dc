package contract

import (
	"bufio"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/mythex/infra/infra"
)

// judged is one side of a diff rebuilt as this build's Timing, so that this
// build's rules and margins apply to it.
type judged struct {
	Side
	t infra.Timing
	// present names the fields the side has with the kind this build expects;
	// anything that reads another field is not judged.
	present map[string]bool
	// broken are this build's violations of the side's values, keeping only
	// those whose fields the side has.
	broken []infra.Violation
}

func judge(s Side) judged {
	j := judged{Side: s, present: map[string]bool{}}
	v := reflect.ValueOf(&j.t).Elem()
	for _, f := range s.Snap.Fields {
		fv := v.FieldByName(f.Name)
		if !fv.IsValid() || f.Kind == "other" || valueOf(f.Name, fv).Kind != f.Kind {
			continue
		}
		fv.SetInt(f.Int)
		j.present[f.Name] = true
	}
	for _, vi := range j.t.Violations() {
		if j.has(vi.Fields) {
			j.broken = append(j.broken, vi)
		}
	}
	return j
}

func (j judged) has(fields []string) bool {
	for _, f := range fields {
		if !j.present[f] {
			return false
		}
	}
	return true
}

func (j judged) missing(fields []string) []string {
	var out []string
	for _, f := range fields {
		if !j.present[f] {
			out = append(out, f)
		}
	}
	return out
}

func (j judged) brokenRule(r infra.Rule) bool {
	for _, v := range j.broken {
		if v.Rule == r {
			return true
		}
	}
	return false
}

// margin prints r's margin at j, or why there is none.
func (j judged) margin(r Relation) string {
	if m := j.missing(r.Fields); len(m) > 0 {
		return "n/a (no " + strings.Join(m, ", ") + ")"
	}
	return FormatDuration(r.Margin(j.t))
}

func (j judged) status(r Relation) string {
	switch {
	case !j.has(r.Fields):
		return "n/a"
	case j.brokenRule(r.Rule):
		return "**BROKEN**"
	default:
		return "holds"
	}
}

type row struct {
	name     string
	old, new string
}

func (r row) changed() bool { return r.old != r.new }

// rows pairs values by name: new's order first, then names only old has.
func rows(old, new []Value) []row {
	text := func(vs []Value) map[string]string {
		m := map[string]string{}
		for _, v := range vs {
			m[v.Name] = valueText(v)
		}
		return m
	}
	o, n := text(old), text(new)
	get := func(m map[string]string, name string) string {
		if v, ok := m[name]; ok {
			return v
		}
		return "—"
	}
	var out []row
	for _, v := range new {
		out = append(out, row{v.Name, get(o, v.Name), get(n, v.Name)})
	}
	for _, v := range old {
		if _, ok := n[v.Name]; !ok {
			out = append(out, row{v.Name, get(o, v.Name), "—"})
		}
	}
	return out
}

func change(r row) string {
	switch {
	case r.old == "—":
		return "added"
	case r.new == "—":
		return "removed"
	case r.changed():
		return "changed"
	}
	return ""
}

// WriteDiff compares the contract at two revisions as markdown, for a
// terminal or a pull-request comment: every field and derived value (old →
// new, changed ones marked), every invariant's margin under this build's
// rules, each invariant broken at either side, and last the rollout order
// the change needs (WriteVerdict).
func WriteDiff(w io.Writer, oldSide, newSide Side) error {
	o, n := judge(oldSide), judge(newSide)
	fields := rows(o.Snap.Fields, n.Snap.Fields)
	derived := rows(o.Snap.Derived, n.Snap.Derived)
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }

	p("### Timing contract: `%s` → `%s`\n\n", o.Label, n.Label)
	var changes []string
	for _, r := range fields {
		if c := change(r); c != "" {
			changes = append(changes, fmt.Sprintf("`%s` %s → %s", r.name, r.old, r.new))
		}
	}
	if len(changes) == 0 {
		p("No timing value changed.\n")
	} else {
		p("**%d value(s) changed:** %s.\n", len(changes), strings.Join(changes, ", "))
	}
	var margins []string
	for _, r := range Relations {
		if om, nm := o.margin(r), n.margin(r); om != nm {
			margins = append(margins, fmt.Sprintf("`%s` %s → %s", r.Rule, om, nm))
		}
	}
	if len(margins) > 0 {
		p("**%d margin(s) changed:** %s.\n", len(margins), strings.Join(margins, ", "))
	}
	// A formula can change with no value changing; it shows here.
	var derivedChanges []string
	for _, r := range derived {
		if c := change(r); c != "" {
			derivedChanges = append(derivedChanges, fmt.Sprintf("`%s()` %s → %s", r.name, r.old, r.new))
		}
	}
	if len(derivedChanges) > 0 {
		p("**%d derived value(s) changed:** %s.\n", len(derivedChanges), strings.Join(derivedChanges, ", "))
	}
	p("\n%s\n%s\n", brokenSummary(o), brokenSummary(n))

	p("\n#### Invariants (this build's rules applied to both sides)\n\n")
	p("| Rule | Relation | `%s` margin | `%s` margin | Needs | `%s` | `%s` |\n", o.Label, n.Label, o.Label, n.Label)
	p("|---|---|---:|---:|---|---|---|\n")
	for _, r := range Relations {
		mark := ""
		if o.margin(r) != n.margin(r) {
			mark = " (changed)"
		}
		need := "n/a"
		if n.has(r.Fields) {
			need = NeedText(r, n.t)
		}
		p("| `%s`%s | %s vs %s | %s | %s | %s | %s | %s |\n", r.Rule, mark, r.Left.Name, r.Right.Name,
			o.margin(r), n.margin(r), need, o.status(r), n.status(r))
	}

	p("\n#### Values\n\n| Field | `%s` | `%s` | |\n|---|---:|---:|---|\n", o.Label, n.Label)
	writeRows(bw, fields, "`%s`")
	p("\n#### Derived values (each revision's own methods)\n\n| Method | `%s` | `%s` | |\n|---|---:|---:|---|\n", o.Label, n.Label)
	writeRows(bw, derived, "`%s()`")

	for _, j := range []judged{o, n} {
		if len(j.broken) == 0 {
			continue
		}
		p("\n#### Broken at `%s`\n\n", j.Label)
		for _, v := range j.broken {
			p("- `%s`: %s\n", v.Rule, v.Msg)
		}
	}
	for _, j := range []judged{o, n} {
		if !j.Snap.HasViolations {
			p("\n`%s` has no `Timing.Violations`: only this build's rules judged it.\n", j.Label)
			continue
		}
		if own := ownDiffers(j); len(own) > 0 {
			p("\n#### What `%s` reports about itself, by its own rules\n\n", j.Label)
			for _, msg := range own {
				p("- %s\n", msg)
			}
		}
	}
	p("\n")
	if err := WriteVerdict(bw, diffVerdict(o, n)); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write diff: %w", err)
	}
	return nil
}

// DiffVerdict is the rollout order of the change from oldSide to newSide,
// judged with this build's fields, sides and rules.
func DiffVerdict(oldSide, newSide Side) Verdict {
	return diffVerdict(judge(oldSide), judge(newSide))
}

func diffVerdict(o, n judged) Verdict {
	var all []string
	for _, v := range TakeSnapshot(infra.Timing{}).Fields {
		all = append(all, v.Name)
	}
	if m := n.missing(all); len(m) > 0 {
		return Verdict{NotJudged: fmt.Sprintf("`%s` has no %s as this build knows it: the rollout order is judged on every field",
			n.Label, strings.Join(m, ", "))}
	}
	// A field the old revision lacks had no value there to change from: it
	// is judged at its new value on both sides, or at what the old release
	// behaved as when the field has a meaning there (AsReleasedWithout), and
	// the verdict says so.
	old := o.t
	added := o.missing(all)
	ov, nv := reflect.ValueOf(&old).Elem(), reflect.ValueOf(n.t)
	for _, f := range added {
		ov.FieldByName(f).Set(nv.FieldByName(f))
	}
	old = old.AsReleasedWithout(added)
	v := JudgeTransition(old, n.t)
	v.Added = added
	return v
}

// ownDiffers returns the side's own violation report when it says something
// other than this build's rules do; nil when they agree.
func ownDiffers(j judged) []string {
	ours := map[string]bool{}
	for _, v := range j.broken {
		ours[v.Error()] = true
	}
	same := len(ours) == len(j.Snap.Violations)
	for _, msg := range j.Snap.Violations {
		same = same && ours[msg]
	}
	if same {
		return nil
	}
	if len(j.Snap.Violations) == 0 {
		return []string{"no rule broken"}
	}
	return j.Snap.Violations
}

func brokenSummary(j judged) string {
	if len(j.broken) == 0 {
		return fmt.Sprintf("Broken at `%s`: none.", j.Label)
	}
	seen := map[infra.Rule]bool{}
	var names []string
	for _, v := range j.broken {
		if !seen[v.Rule] {
			seen[v.Rule] = true
			names = append(names, "`"+string(v.Rule)+"`")
		}
	}
	return fmt.Sprintf("**Broken at `%s`: %s.**", j.Label, strings.Join(names, ", "))
}

func writeRows(w io.Writer, rs []row, nameFormat string) {
	for _, r := range rs {
		name := fmt.Sprintf(nameFormat, r.name)
		c := change(r)
		if c != "" {
			name = "**" + name + "**"
			c = "**" + c + "**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", name, r.old, r.new, c)
	}
}
