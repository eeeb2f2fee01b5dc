package contract

import (
	"fmt"
	"strings"
	"time"

	"github.com/mythex/infra/infra"
)

// Term is one side of a relation: a field or a derived value of Timing.
type Term struct {
	Name  string
	Value func(infra.Timing) time.Duration
}

// Relation is an invariant of package infra written as a margin: Left must
// exceed Right by at least Need (strictly, when Strict). Whether it holds is
// always taken from infra's own Violations; the margin is what a reviewer
// reads, and tests keep the two in agreement.
type Relation struct {
	Rule infra.Rule
	// Fields are the Timing fields the rule reads, as its Violation names them.
	Fields []string
	Left   Term
	Right  Term
	// Need is the least margin; nil means zero.
	Need   *Term
	Strict bool
}

// Margin is how far Left exceeds Right.
func (r Relation) Margin(t infra.Timing) time.Duration {
	return r.Left.Value(t) - r.Right.Value(t)
}

// NeedValue is the least margin the rule accepts (exclusive when Strict).
func (r Relation) NeedValue(t infra.Timing) time.Duration {
	if r.Need == nil {
		return 0
	}
	return r.Need.Value(t)
}

// Holds computes the relation by itself. Rendering uses infra's Violations
// instead; this exists so tests can prove the two agree.
func (r Relation) Holds(t infra.Timing) bool {
	if r.Strict {
		return r.Margin(t) > r.NeedValue(t)
	}
	return r.Margin(t) >= r.NeedValue(t)
}

// NeedText is the condition on the margin, e.g. "≥ NodeSkew 1s" or "> 0".
func (r Relation) NeedText(t infra.Timing) string {
	op := "≥"
	if r.Strict {
		op = ">"
	}
	if r.Need == nil {
		return op + " 0"
	}
	return fmt.Sprintf("%s %s %s", op, r.Need.Name, FormatDuration(r.Need.Value(t)))
}

// Line is the relation in one line, e.g. "Drain 15s vs WorstCaseDetection
// 13s: margin 2s (needs ≥ NodeSkew 1s)".
func (r Relation) Line(t infra.Timing) string {
	return fmt.Sprintf("%s %s vs %s %s: margin %s (needs %s)",
		r.Left.Name, FormatDuration(r.Left.Value(t)), r.Right.Name, FormatDuration(r.Right.Value(t)),
		FormatDuration(r.Margin(t)), r.NeedText(t))
}

func field(name string, get func(infra.Timing) time.Duration) Term {
	return Term{Name: name, Value: get}
}

// Relations are the invariants of infra.Timing, in the order Violations
// checks them. A test fails when package infra declares a rule that is
// neither here nor in LimitRules.
var Relations = []Relation{
	{
		Rule:   infra.RuleTimeoutBelowInt,
		Fields: []string{"HealthCheckTimeout", "HealthCheckInterval"},
		Left:   field("HealthCheckInterval", func(t infra.Timing) time.Duration { return t.HealthCheckInterval }),
		Right:  field("HealthCheckTimeout", func(t infra.Timing) time.Duration { return t.HealthCheckTimeout }),
		Strict: true,
	},
	{
		Rule:   infra.RuleDrainOutlasts,
		Fields: []string{"Drain", "HealthCheckInterval", "UnhealthyThreshold", "HealthCheckTimeout", "NodeSkew"},
		Left:   field("Drain", func(t infra.Timing) time.Duration { return t.Drain }),
		Right:  Term{"WorstCaseDetection", infra.Timing.WorstCaseDetection},
		Need:   &Term{"NodeSkew", func(t infra.Timing) time.Duration { return t.NodeSkew }},
	},
	{
		Rule:   infra.RuleFitsGrace,
		Fields: []string{"Drain", "ShutdownTimeout", "KillMargin", "StopGracePeriod"},
		Left:   field("StopGracePeriod", func(t infra.Timing) time.Duration { return t.StopGracePeriod }),
		Right:  Term{"ShutdownDeadline", infra.Timing.ShutdownDeadline},
		Need:   &Term{"KillMargin", func(t infra.Timing) time.Duration { return t.KillMargin }},
	},
	{
		Rule:   infra.RuleReentryShort,
		Fields: []string{"HealthyThreshold", "HealthCheckInterval", "Drain"},
		Left:   Term{"ReentryBound", infra.Timing.ReentryBound},
		Right:  Term{"Reentry", infra.Timing.Reentry},
	},
	{
		Rule:   infra.RuleKeepAlive,
		Fields: []string{"AppKeepAlive", "LBIdleTimeout"},
		Left:   field("AppKeepAlive", func(t infra.Timing) time.Duration { return t.AppKeepAlive }),
		Right:  field("LBIdleTimeout", func(t infra.Timing) time.Duration { return t.LBIdleTimeout }),
		Strict: true,
	},
	{
		Rule:   infra.RuleWatchdogTolerates,
		Fields: []string{"WatchdogStrikes", "WatchdogInterval", "MaxPlannedDowntime"},
		Left:   Term{"WatchdogTolerance", infra.Timing.WatchdogTolerance},
		Right:  field("MaxPlannedDowntime", func(t infra.Timing) time.Duration { return t.MaxPlannedDowntime }),
		Strict: true,
	},
	{
		Rule:   infra.RuleDowntimePlanned,
		Fields: []string{"StopGracePeriod", "StartTimeout", "MaxPlannedDowntime"},
		Left:   field("MaxPlannedDowntime", func(t infra.Timing) time.Duration { return t.MaxPlannedDowntime }),
		Right:  Term{"DeployDowntime", infra.Timing.DeployDowntime},
	},
	{
		Rule:   infra.RuleDeregCovers,
		Fields: []string{"DeregistrationDelay", "ShutdownTimeout"},
		Left:   field("DeregistrationDelay", func(t infra.Timing) time.Duration { return t.DeregistrationDelay }),
		Right:  field("ShutdownTimeout", func(t infra.Timing) time.Duration { return t.ShutdownTimeout }),
	},
	{
		Rule:   infra.RuleLockOutlasts,
		Fields: []string{"LockWait", "StopGracePeriod", "StartTimeout"},
		Left:   field("LockWait", func(t infra.Timing) time.Duration { return t.LockWait }),
		Right:  Term{"DeployDowntime", infra.Timing.DeployDowntime},
	},
	{
		Rule:   infra.RuleContainerFaster,
		Fields: []string{"ContainerHealthInterval", "HealthCheckInterval"},
		Left:   field("HealthCheckInterval", func(t infra.Timing) time.Duration { return t.HealthCheckInterval }),
		Right:  field("ContainerHealthInterval", func(t infra.Timing) time.Duration { return t.ContainerHealthInterval }),
		Strict: true,
	},
	{
		Rule:   infra.RuleStartCovers,
		Fields: []string{"StartTimeout", "ContainerHealthInterval"},
		Left:   field("StartTimeout", func(t infra.Timing) time.Duration { return t.StartTimeout }),
		Right:  field("ContainerHealthInterval", func(t infra.Timing) time.Duration { return t.ContainerHealthInterval }),
		Strict: true,
	},
}

// LimitRules are the rules that bound single fields (positive, whole seconds,
// AWS's ranges) rather than relate them; they have no margin.
var LimitRules = []infra.Rule{infra.RulePositive, infra.RuleWholeSeconds, infra.RuleAWSRange}

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
