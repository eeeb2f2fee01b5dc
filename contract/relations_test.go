package contract_test

import (
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

// mutants returns Prod() with each field moved, one at a time, across every
// whole second within 90 s of its value (and each count by up to three),
// so every relation's boundary (margin equal to need) is crossed; then the
// same of Prod() in the slots design, where the relations of that design
// bind.
func mutants() []infra.Timing {
	slots := infra.Prod()
	slots.Slots, slots.RegisteredSlots = 2, 2
	return append(mutantsOf(infra.Prod()), mutantsOf(slots)...)
}

func mutantsOf(base infra.Timing) []infra.Timing {
	var out []infra.Timing
	typ := reflect.TypeOf(infra.Timing{})
	for i := 0; i < typ.NumField(); i++ {
		isDur := typ.Field(i).Type == reflect.TypeOf(time.Duration(0))
		step, span := int64(time.Second), int64(90)
		if !isDur {
			step, span = 1, 3
		}
		for d := -span; d <= span; d++ {
			if d == 0 {
				continue
			}
			t := base
			f := reflect.ValueOf(&t).Elem().Field(i)
			f.SetInt(f.Int() + d*step)
			out = append(out, t)
		}
	}
	return out
}

func TestEveryRuleIsShown(t *testing.T) {
	src := loadSource(t)
	seen := map[infra.Rule]int{}
	for _, r := range contract.Relations {
		seen[r.Rule]++
	}
	for _, r := range contract.LimitRules {
		seen[r]++
	}
	for _, r := range contract.CountRules {
		seen[r]++
	}
	for _, r := range src.Rules {
		assert.Equalf(t, 1, seen[r], "rule %s of package infra must be in exactly one of contract.Relations, contract.LimitRules and contract.CountRules", r)
	}
	declared := map[infra.Rule]bool{}
	for _, r := range src.Rules {
		declared[r] = true
	}
	for r := range seen {
		assert.Truef(t, declared[r], "contract knows rule %s, which package infra does not declare", r)
	}
}

// TestRelationsAgreeWithViolations proves that Violations reports exactly the
// relations whose margin falls short, at the boundary too, each naming the
// fields its relation declares.
func TestRelationsAgreeWithViolations(t *testing.T) {
	type seenAs struct{ holds, broken, boundary int }
	seen := map[infra.Rule]*seenAs{}
	for _, r := range contract.Relations {
		seen[r.Rule] = &seenAs{}
	}
	for _, tm := range append(mutants(), infra.Prod()) {
		vs := tm.Violations()
		for _, r := range contract.Relations {
			var fields []string
			broken := false
			for _, v := range vs {
				if v.Rule == r.Rule {
					broken, fields = true, v.Fields
				}
			}
			require.Equalf(t, !broken, r.Holds(tm), "%s: margin says holds=%v but Violations says broken=%v for %+v (%s)",
				r.Rule, r.Holds(tm), broken, tm, contract.Line(r, tm))
			s := seen[r.Rule]
			if broken {
				s.broken++
				assert.ElementsMatch(t, fields, r.Fields, "%s: Relation.Fields must be the fields its Violation names", r.Rule)
			} else {
				s.holds++
			}
			if r.Binds(tm) && r.Margin(tm) == r.NeedValue(tm) {
				s.boundary++
			}
		}
	}
	for rule, s := range seen {
		assert.Positivef(t, s.holds, "%s never held in the sweep", rule)
		assert.Positivef(t, s.broken, "%s never broke in the sweep: the agreement is untested", rule)
		assert.Positivef(t, s.boundary, "%s never met its boundary in the sweep: strictness is untested", rule)
	}
}

// TestRelationFieldsCoverDependencies: a relation's margin must not move when
// a field outside Fields moves, or a diff would judge it with a field the
// other revision lacks.
func TestRelationFieldsCoverDependencies(t *testing.T) {
	prod := infra.Prod()
	for _, r := range contract.Relations {
		in := map[string]bool{}
		for _, f := range r.Fields {
			in[f] = true
		}
		typ := reflect.TypeOf(prod)
		for i := 0; i < typ.NumField(); i++ {
			name := typ.Field(i).Name
			if in[name] {
				continue
			}
			tm := prod
			f := reflect.ValueOf(&tm).Elem().Field(i)
			f.SetInt(f.Int()*3 + 7)
			assert.Equalf(t, r.Margin(prod), r.Margin(tm), "%s: margin moves with %s, which is not in its Fields", r.Rule, name)
			assert.Equalf(t, r.NeedValue(prod), r.NeedValue(tm), "%s: need moves with %s, which is not in its Fields", r.Rule, name)
		}
	}
}

// TestTermNamesAreTrue: a term printed as "Drain" must be Drain's value.
func TestTermNamesAreTrue(t *testing.T) {
	for _, tm := range append(mutants()[:50], infra.Prod()) {
		snap := contract.TakeSnapshot(tm)
		byName := map[string]int64{}
		for _, v := range append(snap.Fields, snap.Derived...) {
			byName[v.Name] = v.Int
		}
		for _, r := range contract.Relations {
			terms := []contract.Term{r.Left, r.Right}
			if r.Need != nil {
				terms = append(terms, *r.Need)
			}
			for _, term := range terms {
				want, ok := byName[term.Name]
				require.Truef(t, ok, "%s: term %s is neither a field nor a derived value of Timing", r.Rule, term.Name)
				assert.Equalf(t, time.Duration(want), term.Value(tm), "%s: term %s", r.Rule, term.Name)
			}
		}
	}
}

func TestRelationLine(t *testing.T) {
	tm := infra.Prod()
	var r contract.Relation
	for _, rel := range contract.Relations {
		if rel.Rule == infra.RuleDrainOutlasts {
			r = rel
		}
	}
	require.Equal(t, infra.RuleDrainOutlasts, r.Rule)
	want := "Drain " + contract.FormatDuration(tm.Drain) +
		" vs WorstCaseDetection " + contract.FormatDuration(tm.WorstCaseDetection()) +
		": margin " + contract.FormatDuration(tm.DrainMargin()) +
		" (needs ≥ NodeSkew " + contract.FormatDuration(tm.NodeSkew) + ")"
	assert.Equal(t, want, contract.Line(r, tm))
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{13 * time.Second, "13s"},
		{2 * time.Minute, "2m"},
		{150 * time.Second, "2m30s"},
		{-2 * time.Minute, "-2m"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + time.Second, "1h0m1s"},
		{1500 * time.Millisecond, "1.5s"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, contract.FormatDuration(tt.in), "%d", tt.in)
	}
}

func TestSnapshotReadsEveryField(t *testing.T) {
	tm := infra.Prod()
	snap := contract.TakeSnapshot(tm)
	typ := reflect.TypeOf(tm)
	require.Len(t, snap.Fields, typ.NumField())
	for i, v := range snap.Fields {
		assert.Equal(t, typ.Field(i).Name, v.Name)
		assert.Equal(t, reflect.ValueOf(tm).Field(i).Int(), v.Int, v.Name)
	}
	var names []string
	for _, v := range snap.Derived {
		names = append(names, v.Name)
		got := reflect.ValueOf(tm).MethodByName(v.Name).Call(nil)[0].Int()
		assert.Equal(t, got, v.Int, v.Name)
	}
	assert.True(t, sort.StringsAreSorted(names))
	assert.ElementsMatch(t, loadSource(t).Derived, names)
	assert.True(t, snap.HasViolations)
	assert.Empty(t, snap.Violations)

	broken := tm
	broken.Drain = tm.WorstCaseDetection()
	snap = contract.TakeSnapshot(broken)
	require.Len(t, snap.Violations, len(broken.Violations()))
	assert.Contains(t, snap.Violations[0], string(infra.RuleDrainOutlasts))

	type old struct {
		Drain time.Duration
		Name  string
	}
	snap = contract.TakeSnapshot(old{Drain: time.Second, Name: "x"})
	assert.Equal(t, []contract.Value{
		{Name: "Drain", Kind: "duration", Int: int64(time.Second), Text: "1s"},
		{Name: "Name", Kind: "other", Text: "x"},
	}, snap.Fields)
	assert.False(t, snap.HasViolations)
}
