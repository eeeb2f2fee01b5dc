package contract

import (
	"fmt"
	"strings"
	"time"

	"github.com/mythex/infra/infra"
)

// Term and Relation are package infra's: each invariant is declared there,
// once, and Validate checks the same declaration this package renders.
type (
	Term     = infra.Term
	Relation = infra.Relation
)

// Relations are the invariants of infra.Timing, in the order Validate reports
// them.
var Relations = infra.Relations()

// NeedText is the condition on r's margin, e.g. "≥ NodeSkew 1s" or "> 0".
func NeedText(r Relation, t infra.Timing) string {
	op := "≥"
	if r.Strict {
		op = ">"
	}
	if r.Need == nil {
		return op + " 0"
	}
	return fmt.Sprintf("%s %s %s", op, r.Need.Name, FormatDuration(r.Need.Value(t)))
}

// Line is r in one line, e.g. "Drain 15s vs WorstCaseDetection 13s: margin
// 2s (needs ≥ NodeSkew 1s)".
func Line(r Relation, t infra.Timing) string {
	return fmt.Sprintf("%s %s vs %s %s: margin %s (needs %s)",
		r.Left.Name, FormatDuration(r.Left.Value(t)), r.Right.Name, FormatDuration(r.Right.Value(t)),
		FormatDuration(r.Margin(t)), NeedText(r, t))
}

// LimitRules are the rules that bound single fields (positive, whole seconds,
// AWS's ranges) rather than relate them; they have no margin.
var LimitRules = []infra.Rule{infra.RulePositive, infra.RuleWholeSeconds, infra.RuleAWSRange, infra.RuleSlots, infra.RuleSlotsAgree}

// CountRules are the invariants between counts rather than durations; they
// have no margin, and each says its two sides in one line (CountLine).
var CountRules = []infra.Rule{infra.RuleSlotsRegistered}

// CountLine is a count rule's two sides, e.g. "RegisteredSlots 1 vs Slots
// 1 (needs ≥)"; "" for any other rule.
func CountLine(r infra.Rule, t infra.Timing) string {
	if r == infra.RuleSlotsRegistered {
		return fmt.Sprintf("RegisteredSlots %d vs Slots %d (needs ≥)", t.RegisteredSlots, t.Slots)
	}
	return ""
}

// broken returns the messages of every violation of rule r in vs.
func broken(vs []infra.Violation, r infra.Rule) []string {
	var msgs []string
	for _, v := range vs {
		if v.Rule == r {
			msgs = append(msgs, v.Msg)
		}
	}
	return msgs
}

// FormatDuration prints whole minutes and hours without trailing zero units
// ("2m", not "2m0s") and everything else as time.Duration does.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if d != 0 && d%time.Minute == 0 {
		s = strings.TrimSuffix(s, "0s")
		if d%time.Hour == 0 {
			s = strings.TrimSuffix(s, "0m")
		}
	}
	return s
}
