// Package contract shows the deploy timing contract to people: every value of
// infra.Timing with the reason given for it in infra/timing.go, every
// invariant with its margin, and the drain timeline, as text for a terminal
// and as the markdown of TIMING.md. It also compares the contract at two git
// revisions (Diff), for the timing diff posted on every pull request.
//
// Nothing here holds a number: values come from infra.Timing and its
// methods, words from the comments of package infra, read with go/parser.
package contract

import (
	"bufio"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/mythex/infra/infra"
)

// GenerateCommand regenerates TIMING.md; it is printed in the file and in
// the staleness test's failure.
const GenerateCommand = "go run ./cmd/timing markdown -o TIMING.md"

// Write prints the contract t as text: values with reasons, derived values,
// the rollout of fleet f, invariants with margins, limits and the drain
// timeline. It reads the reasons from the module the working directory is
// in.
func Write(w io.Writer, t infra.Timing, f Fleet) error {
	src, err := LoadSourceHere()
	if err != nil {
		return err
	}
	return WriteText(w, t, src, f)
}

// RuleStatus is one rule of infra with its margin, when it has one.
type RuleStatus struct {
	Rule infra.Rule
	// Relation is nil for a limit rule.
	Relation *Relation
	// Broken holds the messages of every violation of the rule; empty when it holds.
	Broken []string
	// Idle marks a relation of another design than t's (Relation.Applies):
	// it holds whatever its margin.
	Idle bool
}

// Statuses returns every rule declared in src, in order, with what
// infra.Timing.Violations says about t.
func Statuses(t infra.Timing, src *Source) []RuleStatus {
	vs := t.Violations()
	out := make([]RuleStatus, 0, len(src.Rules))
	for _, r := range src.Rules {
		st := RuleStatus{Rule: r, Broken: broken(vs, r)}
		for i := range Relations {
			if Relations[i].Rule == r {
				st.Relation = &Relations[i]
				st.Idle = !Relations[i].Binds(t)
			}
		}
		out = append(out, st)
	}
	return out
}

func (s RuleStatus) word() string {
	switch {
	case len(s.Broken) > 0:
		return "BROKEN"
	case s.Idle:
		return "idle"
	}
	return "holds"
}

// fieldValue prints field name of t.
func fieldValue(t infra.Timing, name string) string {
	for _, v := range TakeSnapshot(t).Fields {
		if v.Name == name {
			return valueText(v)
		}
	}
	return "?"
}

func valueText(v Value) string {
	if v.Kind == "duration" {
		return FormatDuration(time.Duration(v.Int))
	}
	return v.Text
}

// reason is the reason for field name, flagged when t's value is not the one
// the reason was written for.
func reason(t infra.Timing, src *Source, name string) string {
	if prod := fieldValue(infra.Prod(), name); prod != fieldValue(t, name) {
		return fmt.Sprintf("(Prod has %s) %s", prod, src.Reason[name])
	}
	return src.Reason[name]
}

// fleetHead says whose rollout the fleet values are; code marks up names.
func fleetHead(f Fleet, code func(string) string) string {
	dflt := ""
	if f.MaxUnavailable == infra.DefaultMaxUnavailable {
		dflt = ", the default"
	}
	servers := "servers"
	if f.Servers == 1 {
		servers = "server"
	}
	return fmt.Sprintf("stack %s's %d %s (%s in %s) at %s%s",
		code(f.Stack), f.Servers, servers, code(infra.KeyInstanceIDs), code("Pulumi."+f.Stack+".yaml"),
		code(fmt.Sprintf("--max-unavailable %d", f.MaxUnavailable)), dflt)
}

func plain(s string) string { return s }

func backticks(s string) string { return "`" + s + "`" }

// WriteText is Write with the source already loaded.
func WriteText(w io.Writer, t infra.Timing, src *Source, f Fleet) error {
	fleet, err := FleetValues(t, f, src)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p("Deploy timing contract (infra/timing.go)\n\n")
	p("Health check: GET %s, healthy = %d\n\n", infra.HealthPath, infra.HealthyStatus)

	p("Values, the side that applies them (and why: the comments in Prod)\n")
	for _, v := range TakeSnapshot(t).Fields {
		writeWrapped(bw, fmt.Sprintf("  %-24s %-6s %-17s ", v.Name, valueText(v), sideText(v.Name)), reason(t, src, v.Name), 110)
	}

	p("\nDerived values\n")
	for _, name := range src.Derived {
		d := reflect.ValueOf(t).MethodByName(name).Call(nil)[0].Int()
		writeWrapped(bw, fmt.Sprintf("  %-24s %-6s ", name, FormatDuration(time.Duration(d))), src.DerivedDoc[name], 110)
	}

	p("\nFleet rollout: %s\n", fleetHead(f, plain))
	for _, v := range fleet {
		writeWrapped(bw, fmt.Sprintf("  %-24s %-6s ", v.Call, v.Value), v.Doc, 110)
	}

	p("\nInvariants (margin = how far the left side exceeds the right)\n")
	for _, s := range Statuses(t, src) {
		if isLimit(s.Rule) {
			continue
		}
		line := CountLine(s.Rule, t)
		if s.Relation != nil {
			line = Line(*s.Relation, t)
			if s.Idle {
				line += "; binds with " + s.Relation.AppliesWhen
			}
		}
		p("  %-6s  %-32s %s\n", s.word(), s.Rule, line)
		for _, msg := range s.Broken {
			writeWrapped(bw, "          ", msg, 110)
		}
	}

	p("\nLimits\n")
	for _, s := range Statuses(t, src) {
		if !isLimit(s.Rule) {
			continue
		}
		p("  %-6s  %s\n", s.word(), s.Rule)
		for _, msg := range s.Broken {
			writeWrapped(bw, "          ", msg, 110)
		}
	}

	p("\nDrain timeline (after SIGTERM)\n")
	if err := writeTimelineText(bw, t, "  "); err != nil {
		return err
	}
	if n := len(t.Violations()); n > 0 {
		p("\nINVALID: %d rule(s) broken\n", n)
	} else {
		p("\nValid: every rule holds.\n")
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write contract: %w", err)
	}
	return nil
}

func isLimit(r infra.Rule) bool {
	for _, l := range LimitRules {
		if l == r {
			return true
		}
	}
	return false
}

// writeWrapped writes head, then text word-wrapped to width with every
// continuation line indented to the width of head.
func writeWrapped(w io.Writer, head, text string, width int) {
	indent := strings.Repeat(" ", len([]rune(head)))
	line := head
	n := len([]rune(head))
	fresh := true
	for _, word := range strings.Fields(text) {
		wl := len([]rune(word))
		if !fresh && n+1+wl > width {
			fmt.Fprintln(w, line)
			line, n, fresh = indent, len(indent), true
		}
		if !fresh {
			line += " "
			n++
		}
		line += word
		n += wl
		fresh = false
	}
	fmt.Fprintln(w, line)
}

// cell escapes text for a markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// WriteMarkdown writes TIMING.md for t and fleet f.
func WriteMarkdown(w io.Writer, t infra.Timing, src *Source, f Fleet) error {
	fleet, err := FleetValues(t, f, src)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p("<!-- Code generated by `%s`. DO NOT EDIT. -->\n\n", GenerateCommand)
	p("# Deploy timing contract\n\n")
	p("Every number a rolling deploy behind the load balancer depends on, from `infra.Prod()` in\n")
	p("[infra/timing.go](infra/timing.go), with the reason written there for each. To change a number, change it\n")
	p("there together with the numbers it is related to, then run `%s`.\n", GenerateCommand)
	p("`go test ./...` fails while this file is stale, so every change to the contract shows in this file's diff;\n")
	p("`go run ./cmd/timing diff <rev>` compares the contract with any other revision.\n\n")
	p("Health check: `GET %s`, healthy = `%d`; a draining server answers `503` there while it keeps serving.\n\n",
		infra.HealthPath, infra.HealthyStatus)

	p("## Drain timeline\n\n")
	if err := writeGantt(bw, t); err != nil {
		return err
	}
	p("\n| t | | |\n|---:|---|---|\n")
	for _, e := range Timeline(t) {
		p("| %s | `%s` | %s |\n", FormatDuration(e.At), e.Term, cell(e.What))
	}

	p("\n## Invariants\n\n")
	p("Margin is how far the left side exceeds the right. The rules are in `Timing.Violations`; `go test ./...` fails\n")
	p("when one is broken.\n\n")
	p("| Rule | Relation | Margin | Needs | Status |\n|---|---|---:|---|---|\n")
	for _, s := range Statuses(t, src) {
		if isLimit(s.Rule) {
			continue
		}
		if s.Relation == nil {
			p("| `%s` | %s | | | %s |\n", s.Rule, CountLine(s.Rule, t), s.word())
			continue
		}
		r := s.Relation
		p("| `%s` | %s %s vs %s %s | %s | %s | %s |\n", s.Rule,
			r.Left.Name, FormatDuration(r.Left.Value(t)), r.Right.Name, FormatDuration(r.Right.Value(t)),
			FormatDuration(r.Margin(t)), NeedText(*r, t), statusCell(s))
	}
	p("\nLimits on single values (AWS's API ranges, whole seconds, positive): ")
	var limitsBroken []string
	for _, s := range Statuses(t, src) {
		if isLimit(s.Rule) {
			limitsBroken = append(limitsBroken, s.Broken...)
		}
	}
	if len(limitsBroken) == 0 {
		p("all hold.\n")
	} else {
		p("**%d broken**:\n\n", len(limitsBroken))
		for _, msg := range limitsBroken {
			p("- %s\n", msg)
		}
	}

	p("\n## Values\n\nSide: what applies the value, `pulumi up` (balancer) or the rollout (servers); \"servers, process\" is held by a\n")
	p("running container from its start. A change that moves both sides needs an order (`go run ./cmd/timing diff` says which).\n")
	p("\n| Field | Value | Side | What it is | Why this value |\n|---|---:|---|---|---|\n")
	for _, v := range TakeSnapshot(t).Fields {
		p("| `%s` | %s | %s | %s | %s |\n", v.Name, valueText(v), sideText(v.Name), cell(src.Meaning[v.Name]), cell(reason(t, src, v.Name)))
	}

	p("\n## Derived values\n\n| Method | Value | What it is |\n|---|---:|---|\n")
	for _, name := range src.Derived {
		d := reflect.ValueOf(t).MethodByName(name).Call(nil)[0].Int()
		p("| `%s()` | %s | %s |\n", name, FormatDuration(time.Duration(d)), cell(src.DerivedDoc[name]))
	}

	p("\n## Fleet rollout\n\n")
	p("For %s.\n\n", fleetHead(f, backticks))
	p("The rollout deploys a canary batch of one server, then batches of up to `--max-unavailable`, each waiting for the\n")
	p("balancer's re-entry verdicts before the next. On a failed server it sends every server it touched back to its\n")
	p("previous release, in reverse order, in batches of up to `--max-unavailable`. `infra.CheckRollout` refuses a rollout\n")
	p("that could take every server out at once: an ALB whose targets are all unhealthy fails open.\n\n")
	p("| Function | Value | What it is |\n|---|---:|---|\n")
	for _, v := range fleet {
		p("| `%s` | %s | %s |\n", v.Call, v.Value, cell(v.Doc))
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write markdown: %w", err)
	}
	return nil
}

// sideText is a field's side as its tag declares it.
func sideText(field string) string {
	sides, err := infra.FieldSides()
	if err != nil {
		return "?"
	}
	for _, s := range sides {
		if s.Field == field && s.Process {
			return string(s.Side) + ", process"
		}
		if s.Field == field {
			return string(s.Side)
		}
	}
	return "?"
}

func statusCell(s RuleStatus) string {
	if len(s.Broken) == 0 && s.Idle {
		return "binds with " + s.Relation.AppliesWhen
	}
	if len(s.Broken) == 0 {
		return "holds"
	}
	return "**BROKEN**: " + cell(strings.Join(s.Broken, "; "))
}
