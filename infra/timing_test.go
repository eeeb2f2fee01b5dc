package infra_test

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

// These tests are the invariant gate: change a number in Prod() so that it
// breaks a relation and one of them fails naming that relation. They depend
// on nothing but timing.go, so the mutation run can test them in isolation.

var durationType = reflect.TypeOf(time.Duration(0))

// with returns Prod() with the named fields set, so a test row reads as the
// change it makes.
func with(t *testing.T, changes map[string]any) infra.Timing {
	t.Helper()
	tm := infra.Prod()
	v := reflect.ValueOf(&tm).Elem()
	for name, val := range changes {
		f := v.FieldByName(name)
		require.Truef(t, f.IsValid(), "Timing has no field %s", name)
		f.Set(reflect.ValueOf(val).Convert(f.Type()))
	}
	return tm
}

func violations(t *testing.T, err error) []infra.Violation {
	t.Helper()
	var ite *infra.InvalidTimingError
	require.Truef(t, errors.As(err, &ite), "want *InvalidTimingError, got %T: %v", err, err)
	return ite.Violations
}

// named reports whether some violation of rule r names field.
func named(vs []infra.Violation, r infra.Rule, field string) bool {
	for _, v := range vs {
		if v.Rule != r {
			continue
		}
		for _, f := range v.Fields {
			if f == field {
				return true
			}
		}
	}
	return false
}

func TestProdIsValid(t *testing.T) {
	assert.NoError(t, infra.Prod().Validate())
	assert.NoError(t, infra.Prod().ValidateInvariants())
	assert.Empty(t, infra.Prod().Violations())
}

func TestValidateRejects(t *testing.T) {
	p := infra.Prod()
	tests := []struct {
		name    string
		changes map[string]any
		rule    infra.Rule
		fields  []string
		msg     string
	}{
		{"drain shorter than detection", map[string]any{"Drain": 9 * time.Second},
			infra.RuleDrainOutlasts, []string{"Drain", "HealthCheckInterval", "UnhealthyThreshold", "HealthCheckTimeout"},
			"Drain 9s must exceed worst-case detection 13s (HealthCheckInterval 5s × UnhealthyThreshold 2 + HealthCheckTimeout 3s)"},
		{"drain margin below node skew", map[string]any{"NodeSkew": 3 * time.Second},
			infra.RuleDrainOutlasts, []string{"NodeSkew"}, "by at least NodeSkew 3s; margin is 2s"},
		{"the article's old drain", map[string]any{"Drain": 5 * time.Second, "HealthCheckInterval": 30 * time.Second},
			infra.RuleDrainOutlasts, []string{"Drain"}, "worst-case detection 1m3s"},
		{"drain and shutdown overrun the grace period", map[string]any{"ShutdownTimeout": 22 * time.Second},
			infra.RuleFitsGrace, []string{"Drain", "ShutdownTimeout", "KillMargin", "StopGracePeriod"},
			"Drain 15s + ShutdownTimeout 22s + KillMargin 5s = 42s must fit inside StopGracePeriod 40s"},
		{"max drain and shutdown overrun the grace period", map[string]any{"MaxDrain": 26 * time.Second},
			infra.RuleMaxDrainFits, []string{"MaxDrain", "ShutdownTimeout", "KillMargin", "StopGracePeriod"},
			"MaxDrain 26s + ShutdownTimeout 10s + KillMargin 5s = 41s must fit inside StopGracePeriod 40s"},
		{"max drain below the drain", map[string]any{"MaxDrain": 14 * time.Second},
			infra.RuleMaxDrainCovers, []string{"MaxDrain", "Drain"}, "MaxDrain 14s must not be below Drain 15s"},
		{"quiet window shorter than the node skew", map[string]any{"DrainQuiet": 900 * time.Millisecond},
			infra.RuleQuietCoversSkew, []string{"DrainQuiet", "NodeSkew"}, "DrainQuiet 900ms must cover NodeSkew 1s"},
		{"no room before the kill", map[string]any{"StopGracePeriod": 27 * time.Second},
			infra.RuleFitsGrace, []string{"StopGracePeriod"}, "must fit inside StopGracePeriod 27s"},
		{"slow re-entry", map[string]any{"HealthyThreshold": 5},
			infra.RuleReentryShort, []string{"HealthyThreshold", "HealthCheckInterval", "Drain"},
			"re-entry 25s (HealthyThreshold 5 × HealthCheckInterval 5s) must not exceed Drain 15s"},
		{"keep-alive equal to idle timeout", map[string]any{"AppKeepAlive": 60 * time.Second},
			infra.RuleKeepAlive, []string{"AppKeepAlive", "LBIdleTimeout"}, "AppKeepAlive 1m0s must exceed LBIdleTimeout 1m0s"},
		{"keep-alive shorter than idle timeout", map[string]any{"LBIdleTimeout": 350 * time.Second},
			infra.RuleKeepAlive, []string{"LBIdleTimeout"}, "LBIdleTimeout 5m50s"},
		{"one strike", map[string]any{"WatchdogStrikes": 1},
			infra.RuleWatchdogTolerates, []string{"WatchdogStrikes", "WatchdogInterval", "MaxPlannedDowntime"},
			"watchdog tolerance 0s ((WatchdogStrikes 1 − 1) × WatchdogInterval 1m0s) must exceed MaxPlannedDowntime 2m30s"},
		{"three strikes", map[string]any{"WatchdogStrikes": 3},
			infra.RuleWatchdogTolerates, []string{"WatchdogStrikes"}, "watchdog tolerance 2m0s"},
		{"watchdog too frequent", map[string]any{"WatchdogInterval": 30 * time.Second},
			infra.RuleWatchdogTolerates, []string{"WatchdogInterval"}, "WatchdogInterval 30s"},
		{"deploy downtime beyond the plan", map[string]any{"StartTimeout": 111 * time.Second, "LockWait": 10 * time.Minute},
			infra.RuleDowntimePlanned, []string{"StopGracePeriod", "StartTimeout", "MaxPlannedDowntime"},
			"StopGracePeriod 40s + StartTimeout 1m51s = 2m31s must not exceed MaxPlannedDowntime 2m30s"},
		{"deregistration cuts requests", map[string]any{"DeregistrationDelay": 9 * time.Second},
			infra.RuleDeregCovers, []string{"DeregistrationDelay", "ShutdownTimeout"},
			"DeregistrationDelay 9s must cover ShutdownTimeout 10s"},
		{"lock wait shorter than a watchdog's hold", map[string]any{"LockWait": 114 * time.Second},
			infra.RuleLockOutlasts, []string{"LockWait", "StopGracePeriod", "StartTimeout", "EngineWork"},
			"LockWait 1m54s must cover the longest a watchdog run holds the lock, one restart of every due service at once and its verification: StopGracePeriod 40s + StartTimeout 1m0s + EngineWork 15s = 1m55s"},
		{"deploy hold shorter than its steps", map[string]any{"DeployHold": 5 * time.Minute},
			infra.RuleHoldCoversSteps, []string{"DeployHold", "StartTimeout", "StopGracePeriod", "HealthyThreshold", "HealthCheckInterval", "EngineWork"},
			"DeployHold 5m0s must cover every step a deploy takes under the lock, each at its own bound, and EngineWork 15s for the rest: images 3 × StartTimeout 1m0s + DeployDowntime 1m40s + Reentry 10s = 4m50s, + EngineWork = 5m5s"},
		{"container check slower than the earliest re-entry", map[string]any{"ContainerHealthInterval": 6 * time.Second},
			infra.RuleContainerFaster, []string{"ContainerHealthInterval", "HealthCheckInterval", "HealthyThreshold"},
			"ContainerHealthInterval 6s must not exceed the earliest re-entry 5s ((HealthyThreshold 2 - 1) × HealthCheckInterval 5s)"},
		{"start timeout before the first check", map[string]any{"StartTimeout": 4 * time.Second},
			infra.RuleStartCovers, []string{"StartTimeout", "ContainerHealthInterval", "ContainerHealthTimeout"},
			"StartTimeout 4s must exceed the first container check 4s (ContainerHealthInterval 1s + ContainerHealthTimeout 3s)"},
		{"timeout equal to interval", map[string]any{"HealthCheckTimeout": 5 * time.Second},
			infra.RuleTimeoutBelowInt, []string{"HealthCheckTimeout", "HealthCheckInterval"},
			"HealthCheckTimeout 5s must be below HealthCheckInterval 5s"},
		{"interval below the ALB minimum", map[string]any{"HealthCheckInterval": 4 * time.Second},
			infra.RuleAWSRange, []string{"HealthCheckInterval"}, "HealthCheckInterval 4s must be within 5s–5m0s"},
		{"interval above the ALB maximum", map[string]any{"HealthCheckInterval": 301 * time.Second},
			infra.RuleAWSRange, []string{"HealthCheckInterval"}, "within 5s–5m0s"},
		{"timeout below the ALB minimum", map[string]any{"HealthCheckTimeout": time.Second},
			infra.RuleAWSRange, []string{"HealthCheckTimeout"}, "HealthCheckTimeout 1s must be within 2s–2m0s"},
		{"timeout above the ALB maximum", map[string]any{"HealthCheckTimeout": 121 * time.Second},
			infra.RuleAWSRange, []string{"HealthCheckTimeout"}, "within 2s–2m0s"},
		{"threshold below the ALB minimum", map[string]any{"UnhealthyThreshold": 1},
			infra.RuleAWSRange, []string{"UnhealthyThreshold"}, "UnhealthyThreshold 1 must be within 2–10"},
		{"threshold above the ALB maximum", map[string]any{"HealthyThreshold": 11},
			infra.RuleAWSRange, []string{"HealthyThreshold"}, "HealthyThreshold 11 must be within 2–10"},
		{"deregistration delay above the ALB maximum", map[string]any{"DeregistrationDelay": 3601 * time.Second},
			infra.RuleAWSRange, []string{"DeregistrationDelay"}, "DeregistrationDelay 1h0m1s must be within 0s–1h0m0s"},
		{"idle timeout above the ALB maximum", map[string]any{"LBIdleTimeout": 4001 * time.Second, "AppKeepAlive": 5000 * time.Second},
			infra.RuleAWSRange, []string{"LBIdleTimeout"}, "within 1s–1h6m40s"},
		{"interval in fractions of a second", map[string]any{"HealthCheckInterval": 5500 * time.Millisecond},
			infra.RuleWholeSeconds, []string{"HealthCheckInterval"}, "HealthCheckInterval 5.5s must be whole seconds"},
		{"grace period in fractions of a second", map[string]any{"StopGracePeriod": 30500 * time.Millisecond},
			infra.RuleWholeSeconds, []string{"StopGracePeriod"}, "StopGracePeriod 30.5s must be whole seconds"},
		{"header timeout as long as the shutdown", map[string]any{"ReadHeaderTimeout": 10 * time.Second},
			infra.RuleHeaderBeforeCut, []string{"ReadHeaderTimeout", "ShutdownTimeout"},
			"ReadHeaderTimeout 10s must be below ShutdownTimeout 10s"},
		{"balancer gives up before the longest request", map[string]any{"MaxRequest": 61 * time.Second},
			infra.RuleIdleCoversRequest, []string{"LBIdleTimeout", "MaxRequest"},
			"LBIdleTimeout 1m0s must cover MaxRequest 1m1s"},
		{"deadline within the shutdown timeout", map[string]any{"ShutdownTimeout": 75 * time.Second, "StopGracePeriod": 105 * time.Second,
			"DeregistrationDelay": 75 * time.Second, "MaxPlannedDowntime": 165 * time.Second, "LockWait": 180 * time.Second},
			infra.RuleDeadlineCoversCut, []string{"AppKeepAlive", "ShutdownTimeout"},
			"the request deadline 1m15s (AppKeepAlive) must exceed ShutdownTimeout 1m15s"},

		{"zero drain", map[string]any{"Drain": time.Duration(0)},
			infra.RulePositive, []string{"Drain"}, "Drain 0s must be positive"},
		{"negative shutdown timeout", map[string]any{"ShutdownTimeout": -time.Second},
			infra.RulePositive, []string{"ShutdownTimeout"}, "ShutdownTimeout -1s must be positive"},
		{"zero strikes", map[string]any{"WatchdogStrikes": 0},
			infra.RulePositive, []string{"WatchdogStrikes"}, "WatchdogStrikes 0 must be positive"},
		{"no quiet requests", map[string]any{"QuietRequests": 0},
			infra.RulePositive, []string{"QuietRequests"}, "QuietRequests 0 must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm := with(t, tt.changes)
			err := tm.Validate()
			require.Error(t, err)
			vs := violations(t, err)
			for _, f := range tt.fields {
				assert.Truef(t, named(vs, tt.rule, f), "rule %s should name %s; got %v", tt.rule, f, vs)
			}
			assert.Contains(t, err.Error(), tt.msg)
			assert.Contains(t, err.Error(), string(tt.rule)+": ")
			assert.True(t, infra.HasRule(err, tt.rule))
		})
	}
	require.NoError(t, p.Validate(), "rows start from a valid Prod")
}

// TestBoundaries decides every equality: a relation that may hold with
// equality accepts it; a strict one rejects it.
func TestBoundaries(t *testing.T) {
	p := infra.Prod()
	tests := []struct {
		name    string
		changes map[string]any
		rule    infra.Rule
		broken  bool
	}{
		{"drain margin exactly NodeSkew", map[string]any{"NodeSkew": p.DrainMargin()}, infra.RuleDrainOutlasts, false},
		{"drain margin a nanosecond short", map[string]any{"NodeSkew": p.DrainMargin() + 1}, infra.RuleDrainOutlasts, true},
		{"kill slack exactly KillMargin", map[string]any{"KillMargin": p.KillSlack()}, infra.RuleFitsGrace, false},
		{"kill slack a nanosecond short", map[string]any{"KillMargin": p.KillSlack() + 1}, infra.RuleFitsGrace, true},
		{"re-entry exactly the drain", map[string]any{"Drain": p.Reentry(), "NodeSkew": time.Nanosecond, "HealthCheckTimeout": 2 * time.Second}, infra.RuleReentryShort, false},
		{"re-entry a nanosecond over the drain", map[string]any{"Drain": p.Reentry() - 1}, infra.RuleReentryShort, true},
		{"keep-alive a second over idle", map[string]any{"AppKeepAlive": p.LBIdleTimeout + time.Second}, infra.RuleKeepAlive, false},
		{"keep-alive equal to idle", map[string]any{"AppKeepAlive": p.LBIdleTimeout}, infra.RuleKeepAlive, true},
		{"tolerance equal to planned downtime", map[string]any{"MaxPlannedDowntime": p.WatchdogTolerance()}, infra.RuleWatchdogTolerates, true},
		{"tolerance a nanosecond over planned downtime", map[string]any{"MaxPlannedDowntime": p.WatchdogTolerance() - 1}, infra.RuleWatchdogTolerates, false},
		{"deploy downtime exactly planned", map[string]any{"MaxPlannedDowntime": p.DeployDowntime()}, infra.RuleDowntimePlanned, false},
		{"deploy downtime a nanosecond over", map[string]any{"MaxPlannedDowntime": p.DeployDowntime() - 1}, infra.RuleDowntimePlanned, true},
		{"deregistration exactly the shutdown timeout", map[string]any{"DeregistrationDelay": p.ShutdownTimeout}, infra.RuleDeregCovers, false},
		{"deregistration a nanosecond short", map[string]any{"DeregistrationDelay": p.ShutdownTimeout - 1}, infra.RuleDeregCovers, true},
		{"lock wait exactly the watchdog's hold", map[string]any{"LockWait": p.WatchdogHold()}, infra.RuleLockOutlasts, false},
		{"lock wait a nanosecond short", map[string]any{"LockWait": p.WatchdogHold() - 1}, infra.RuleLockOutlasts, true},
		{"engine work a nanosecond too long", map[string]any{"EngineWork": p.LockWait - p.DeployDowntime() + 1}, infra.RuleLockOutlasts, true},
		{"deploy hold exactly its steps and the engine's work", map[string]any{"DeployHold": p.DeploySteps() + p.EngineWork}, infra.RuleHoldCoversSteps, false},
		{"deploy hold a nanosecond short", map[string]any{"DeployHold": p.DeploySteps() + p.EngineWork - 1}, infra.RuleHoldCoversSteps, true},
		{"a start timeout the hold no longer covers", map[string]any{"StartTimeout": p.StartTimeout + (p.DeployHold-p.DeploySteps()-p.EngineWork)/4 + 1, "LockWait": 10 * time.Minute, "MaxPlannedDowntime": 10 * time.Minute, "WatchdogInterval": 10 * time.Minute},
			infra.RuleHoldCoversSteps, true},
		{"container check exactly the earliest re-entry", map[string]any{"ContainerHealthInterval": p.EarliestReentry()}, infra.RuleContainerFaster, false},
		{"container check a nanosecond slower", map[string]any{"ContainerHealthInterval": p.EarliestReentry() + 1}, infra.RuleContainerFaster, true},
		{"start a nanosecond past the first check", map[string]any{"StartTimeout": p.FirstContainerCheck() + 1}, infra.RuleStartCovers, false},
		{"start exactly at the first check", map[string]any{"StartTimeout": p.FirstContainerCheck()}, infra.RuleStartCovers, true},
		{"first check a nanosecond inside the start", map[string]any{"ContainerHealthTimeout": p.StartTimeout - p.ContainerHealthInterval - 1}, infra.RuleStartCovers, false},
		{"first check as long as the start", map[string]any{"ContainerHealthTimeout": p.StartTimeout - p.ContainerHealthInterval}, infra.RuleStartCovers, true},
		{"timeout a second below interval", map[string]any{"HealthCheckTimeout": p.HealthCheckInterval - time.Second, "Drain": 15 * time.Second}, infra.RuleTimeoutBelowInt, false},
		{"timeout equal to interval", map[string]any{"HealthCheckTimeout": p.HealthCheckInterval}, infra.RuleTimeoutBelowInt, true},
		{"header timeout a nanosecond below shutdown", map[string]any{"ReadHeaderTimeout": p.ShutdownTimeout - 1}, infra.RuleHeaderBeforeCut, false},
		{"header timeout equal to shutdown", map[string]any{"ReadHeaderTimeout": p.ShutdownTimeout}, infra.RuleHeaderBeforeCut, true},
		{"idle timeout exactly the longest request", map[string]any{"LBIdleTimeout": p.MaxRequest}, infra.RuleIdleCoversRequest, false},
		{"idle timeout a nanosecond short", map[string]any{"LBIdleTimeout": p.MaxRequest - 1}, infra.RuleIdleCoversRequest, true},
		{"deadline a nanosecond past the shutdown timeout", map[string]any{"AppKeepAlive": p.ShutdownTimeout + 1}, infra.RuleDeadlineCoversCut, false},
		{"deadline equal to the shutdown timeout", map[string]any{"AppKeepAlive": p.ShutdownTimeout}, infra.RuleDeadlineCoversCut, true},
		{"max drain exactly fits the grace", map[string]any{"MaxDrain": p.StopGracePeriod - p.ShutdownTimeout - p.KillMargin}, infra.RuleMaxDrainFits, false},
		{"max drain a nanosecond past the grace", map[string]any{"MaxDrain": p.StopGracePeriod - p.ShutdownTimeout - p.KillMargin + 1}, infra.RuleMaxDrainFits, true},
		{"max drain equal to the drain", map[string]any{"MaxDrain": p.Drain}, infra.RuleMaxDrainCovers, false},
		{"max drain a nanosecond below the drain", map[string]any{"MaxDrain": p.Drain - 1}, infra.RuleMaxDrainCovers, true},
		{"quiet window equal to the node skew", map[string]any{"DrainQuiet": p.NodeSkew}, infra.RuleQuietCoversSkew, false},
		{"quiet window a nanosecond short of the node skew", map[string]any{"DrainQuiet": p.NodeSkew - 1}, infra.RuleQuietCoversSkew, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm := with(t, tt.changes)
			got := false
			for _, v := range tm.Violations() {
				got = got || v.Rule == tt.rule
			}
			assert.Equalf(t, tt.broken, got, "rule %s; violations: %v", tt.rule, tm.Violations())
		})
	}
}

// TestAWSRangeBoundaries: both ends of each ALB range are accepted, one step
// past is not. Only the range rule is asserted: other rules may break.
func TestAWSRangeBoundaries(t *testing.T) {
	tests := []struct {
		field     string
		low, high any
		below     any
		above     any
	}{
		{"HealthCheckInterval", 5 * time.Second, 300 * time.Second, 4 * time.Second, 301 * time.Second},
		{"HealthCheckTimeout", 2 * time.Second, 120 * time.Second, time.Second, 121 * time.Second},
		{"DeregistrationDelay", time.Duration(0), 3600 * time.Second, -time.Second, 3601 * time.Second},
		{"LBIdleTimeout", time.Second, 4000 * time.Second, time.Duration(0), 4001 * time.Second},
		{"UnhealthyThreshold", 2, 10, 1, 11},
		{"HealthyThreshold", 2, 10, 1, 11},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			for _, c := range []struct {
				v      any
				broken bool
			}{{tt.low, false}, {tt.high, false}, {tt.below, true}, {tt.above, true}} {
				tm := with(t, map[string]any{tt.field: c.v})
				assert.Equalf(t, c.broken, named(tm.Violations(), infra.RuleAWSRange, tt.field),
					"%s = %v; violations: %v", tt.field, c.v, tm.Violations())
			}
		})
	}
}

func TestWholeSeconds(t *testing.T) {
	for _, field := range []string{"HealthCheckInterval", "HealthCheckTimeout", "DeregistrationDelay", "LBIdleTimeout", "StopGracePeriod"} {
		t.Run(field, func(t *testing.T) {
			p := reflect.ValueOf(infra.Prod()).FieldByName(field).Interface().(time.Duration)
			off := with(t, map[string]any{field: p + time.Millisecond})
			assert.Truef(t, named(off.Violations(), infra.RuleWholeSeconds, field), "%v", off.Violations())
			on := with(t, map[string]any{field: p + time.Second})
			assert.Falsef(t, named(on.Violations(), infra.RuleWholeSeconds, field), "%v", on.Violations())
		})
	}
	// The drain is not an AWS or Docker value: fractions are fine.
	tm := with(t, map[string]any{"Drain": 14500 * time.Millisecond})
	assert.NoError(t, tm.Validate())
}

func TestAllViolationsAtOnce(t *testing.T) {
	tm := with(t, map[string]any{
		"Drain":              12 * time.Second,
		"AppKeepAlive":       30 * time.Second,
		"WatchdogStrikes":    1,
		"HealthCheckTimeout": 7 * time.Second,
	})
	err := tm.Validate()
	require.Error(t, err)
	vs := violations(t, err)
	for _, r := range []infra.Rule{infra.RuleDrainOutlasts, infra.RuleKeepAlive, infra.RuleWatchdogTolerates, infra.RuleTimeoutBelowInt} {
		assert.Truef(t, infra.HasRule(err, r), "missing %s in %v", r, err)
	}
	assert.Len(t, vs, 4, "%v", err)
	assert.True(t, strings.HasPrefix(err.Error(), "invalid timing: 4 rule(s) broken\n  - "), err.Error())
	assert.Equal(t, 5, strings.Count(err.Error(), "\n")+1, "one line per violation plus the heading")
}

// TestValidateInvariants: a scaled timing keeps the relations but not AWS's
// limits; non-positive values and broken relations are still reported.
func TestValidateInvariants(t *testing.T) {
	scaled := infra.Prod().Scaled(0.2)
	require.Error(t, scaled.Validate(), "AWS's minimum interval rejects a scaled timing")
	assert.NoError(t, scaled.ValidateInvariants())

	zero := scaled
	zero.Drain = 0
	err := zero.ValidateInvariants()
	assert.True(t, infra.HasRule(err, infra.RulePositive), "%v", err)
	assert.True(t, infra.HasRule(err, infra.RuleDrainOutlasts), "%v", err)
	assert.False(t, infra.HasRule(err, infra.RuleAWSRange), "%v", err)
	assert.False(t, infra.HasRule(err, infra.RuleWholeSeconds), "%v", err)
}

func TestHasRule(t *testing.T) {
	assert.False(t, infra.HasRule(nil, infra.RulePositive))
	assert.False(t, infra.HasRule(errors.New("drain-outlasts-detection"), infra.RuleDrainOutlasts))
	wrapped := fmt.Errorf("stack: %w", with(t, map[string]any{"Drain": time.Second}).Validate())
	assert.True(t, infra.HasRule(wrapped, infra.RuleDrainOutlasts))
	assert.False(t, infra.HasRule(wrapped, infra.RuleKeepAlive))
}

func TestDerived(t *testing.T) {
	tm := infra.Timing{
		HealthCheckInterval: 7 * time.Second, HealthCheckTimeout: 2 * time.Second,
		UnhealthyThreshold: 3, HealthyThreshold: 4,
		Drain: 30 * time.Second, ShutdownTimeout: 11 * time.Second, StopGracePeriod: 50 * time.Second,
		DrainQuiet: 1500 * time.Millisecond, MaxDrain: 36 * time.Second,
		LBIdleTimeout: 40 * time.Second, AppKeepAlive: 45 * time.Second,
		StartTimeout: 20 * time.Second, LockWait: 3 * time.Minute,
		WatchdogInterval: 30 * time.Second, WatchdogStrikes: 5,
		ContainerHealthInterval: 2 * time.Second, ContainerHealthTimeout: 4 * time.Second,
		EngineWork: 9 * time.Second, DeployHold: 3 * time.Minute,
	}
	assert.Equal(t, 23*time.Second, tm.WorstCaseDetection(), "7s × 3 + 2s")
	assert.Equal(t, 7*time.Second, tm.DrainMargin(), "30s − 23s")
	assert.Equal(t, 28*time.Second, tm.Reentry(), "4 × 7s")
	assert.Equal(t, 21*time.Second, tm.EarliestReentry(), "(4 − 1) × 7s")
	assert.Equal(t, 3, tm.SettleChecks(), "the unhealthy threshold: compose's retries")
	assert.Equal(t, 30*time.Second, tm.ReentryBound())
	assert.Equal(t, 7*time.Second, tm.ReentryPoll(), "the health-check interval")
	tm.NodeSkew = time.Second
	assert.Equal(t, 66*time.Second, tm.ReentryWait(), "2 × 28s + 2s + 1s + 7s")
	assert.Equal(t, 30*time.Second, tm.ListenerCloses())
	assert.Equal(t, 41*time.Second, tm.ShutdownDeadline(), "30s + 11s")
	assert.Equal(t, 9*time.Second, tm.KillSlack(), "50s − 41s")
	assert.Equal(t, 15500*time.Millisecond, tm.EarliestDrainEnd(), "(3 − 1) × 7s + 1.5s")
	assert.Equal(t, 47*time.Second, tm.MaxShutdownDeadline(), "36s + 11s")
	assert.Equal(t, 5*time.Second, tm.KeepAliveMargin(), "45s − 40s")
	assert.Equal(t, 2*time.Minute, tm.WatchdogTolerance(), "(5 − 1) × 30s")
	assert.Equal(t, 70*time.Second, tm.DeployDowntime(), "50s + 20s")
	assert.Equal(t, 79*time.Second, tm.WatchdogHold(), "70s + 9s")
	assert.Equal(t, 6*time.Second, tm.FirstContainerCheck(), "2s + 4s")
	assert.Equal(t, 58*time.Second, tm.ServerDeployMin(), "30s + 28s")
	assert.Equal(t, 158*time.Second, tm.DeploySteps(), "3 × 20s + 70s + 28s")
	assert.Equal(t, 200*time.Second, tm.RemoteHold(), "20s + 3m")
	assert.Equal(t, 360*time.Second, tm.ServerDeployMax(), "3m + 3m")
	// The rollout's own bounds (rollout.go).
	assert.Equal(t, 23*time.Second, tm.SSHConnectTimeout(), "WorstCaseDetection")
	assert.Equal(t, 7*time.Second, tm.SSHAliveInterval(), "the health-check interval")
	assert.Equal(t, 3, tm.SSHAliveCountMax(), "the unhealthy threshold")
	assert.Equal(t, 212*time.Second, tm.StatusMax(), "23s + 3m + 9s")
	assert.Equal(t, 403*time.Second, tm.RemoteDeployMax(), "23s + 3m + 200s")
	assert.Equal(t, 7*time.Second, tm.ReentryCallMax(), "ReentryPoll")
	assert.Equal(t, 73*time.Second, tm.ReentryWaitMax(), "66s + 7s")
	assert.Equal(t, 476*time.Second, tm.RolloutBatchMax(), "403s + 73s")
	assert.Equal(t, 45*time.Second, tm.RequestDeadline(), "AppKeepAlive")
	// The slots design's (docs/capacity.md).
	assert.Equal(t, 14*time.Second, tm.EarliestRemoval(), "(3 − 1) × 7s")
	assert.Equal(t, 30*time.Second, tm.AdmissionMax(), "28s + 2s")
	assert.Equal(t, 42*time.Second, tm.HandoverRemoval(), "28s + 14s")
	assert.Equal(t, 58*time.Second, tm.SlotDeployMin(), "28s + 30s")
	assert.Equal(t, 118*time.Second, tm.SlotOverlapMax(), "2 × 20s + 28s + 50s")
}

// TestProdSlotNumbers pins the slots design's numbers at production values,
// as docs/capacity.md derives them.
func TestProdSlotNumbers(t *testing.T) {
	p := infra.Prod()
	assert.Equal(t, 5*time.Second, p.EarliestRemoval())
	assert.Equal(t, 6*time.Second, p.EarliestDrainEnd(), "EarliestRemoval + DrainQuiet")
	assert.Equal(t, 13*time.Second, p.AdmissionMax())
	assert.Equal(t, 15*time.Second, p.HandoverRemoval())
	assert.Equal(t, 25*time.Second, p.SlotDeployMin(), "ServerDeployMin's halves swapped")
	assert.Equal(t, p.ServerDeployMin(), p.SlotDeployMin())
	assert.Equal(t, 170*time.Second, p.SlotOverlapMax())
	assert.Equal(t, 1, p.Slots, "today's design until the hooks run slots")
	assert.Equal(t, p.Slots, p.RegisteredSlots)
}

// TestSlots: a release runs one slot or two, and both sides of it agree;
// the handover relation binds only a timing of two slots.
func TestSlots(t *testing.T) {
	// NodeSkew past what a 4 s timeout leaves of a 5 s interval: the drain
	// is long enough for it, the handover is not.
	tight := map[string]any{"NodeSkew": 1500 * time.Millisecond, "DrainQuiet": 1500 * time.Millisecond,
		"Drain": 16 * time.Second, "HealthCheckTimeout": 4 * time.Second}
	two := func(m map[string]any) map[string]any {
		out := map[string]any{"Slots": 2, "RegisteredSlots": 2}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	tests := []struct {
		name    string
		changes map[string]any
		rules   []infra.Rule
		msg     string
	}{
		{name: "two slots", changes: two(nil)},
		{name: "one slot, a handover that would not keep capacity", changes: tight},
		{name: "two slots, a handover that does not keep capacity", changes: two(tight),
			rules: []infra.Rule{infra.RuleHandoverCapacity},
			msg:   "the old slot leaves a node no sooner than 15s after the new slot answers (Reentry 10s + EarliestRemoval 5s), which must exceed the latest every node routes to the new slot, 14s (AdmissionMax: Reentry + HealthCheckTimeout 4s), by at least NodeSkew 1.5s, or a node routes to neither slot; margin is 1s"},
		{name: "three slots", changes: map[string]any{"Slots": 3, "RegisteredSlots": 3},
			rules: []infra.Rule{infra.RuleSlots, infra.RuleSlots},
			msg:   "Slots 3 must be 1 (a deploy drains the server) or 2 (a deploy swaps slots): no design has more"},
		{name: "the balancer registers more than the servers run", changes: map[string]any{"RegisteredSlots": 2},
			rules: []infra.Rule{infra.RuleSlotsAgree},
			msg:   "RegisteredSlots 2 must equal Slots 1 in a release"},
		{name: "the servers run more than the balancer registers", changes: map[string]any{"Slots": 2},
			rules: []infra.Rule{infra.RuleSlotsAgree, infra.RuleSlotsRegistered},
			msg:   "RegisteredSlots 1 must not be below Slots 2: a server hands over to a slot no balancer node checks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := with(t, tt.changes).Violations()
			var got []infra.Rule
			for _, v := range vs {
				got = append(got, v.Rule)
			}
			assert.ElementsMatch(t, tt.rules, got, "%v", vs)
			if tt.msg != "" {
				assert.Contains(t, with(t, tt.changes).Validate().Error(), tt.msg)
			}
		})
	}
	// At the boundary: a margin of exactly NodeSkew keeps capacity.
	edge := two(tight)
	edge["NodeSkew"], edge["DrainQuiet"] = time.Second, time.Second
	assert.NoError(t, with(t, edge).Validate(), "a margin of NodeSkew holds")
	// Scaled keeps the design: counts are not the timeline's.
	assert.NoError(t, with(t, two(nil)).Scaled(0.2).ValidateInvariants())
	assert.Equal(t, 2, with(t, two(nil)).Scaled(0.2).Slots)
}

func TestAsReleasedWithout(t *testing.T) {
	p := infra.Prod()
	before := p.AsReleasedWithout([]string{"MaxDrain", "DrainQuiet", "NodeSkew"})
	assert.Equal(t, p.Drain, before.MaxDrain, "a release without MaxDrain never drained past Drain")
	want := p
	want.MaxDrain = p.Drain
	assert.Equal(t, want, before, "fields without a meaning in an older release keep their value")
	assert.Equal(t, p, p.AsReleasedWithout(nil))
	assert.Equal(t, p, p.AsReleasedWithout([]string{"DrainQuiet"}))
	// A release before the slots design ran one slot, registered once.
	two := with(t, map[string]any{"Slots": 2, "RegisteredSlots": 2})
	old := two.AsReleasedWithout([]string{"Slots", "RegisteredSlots"})
	assert.Equal(t, 1, old.Slots)
	assert.Equal(t, 1, old.RegisteredSlots)
}

func TestScaled(t *testing.T) {
	// Every duration field is scaled and every count is kept: found by
	// reflection, so a new field Scaled forgets fails here.
	var tm infra.Timing
	v := reflect.ValueOf(&tm).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).Type() == durationType {
			v.Field(i).SetInt(int64(3 * time.Second))
		} else {
			v.Field(i).SetInt(3)
		}
	}
	// The durations that are the host's, not the timeline's.
	hostBound := map[string]bool{"ContainerHealthInterval": true, "ContainerHealthTimeout": true, "EngineWork": true}
	s := reflect.ValueOf(tm.Scaled(0.5))
	for i := 0; i < s.NumField(); i++ {
		name := s.Type().Field(i).Name
		if name == "DeployHold" {
			// The scaled steps (3 × 1.5 s + 1.5 s + 1.5 s + 3 × 1.5 s),
			// EngineWork kept (3 s), and half the margin past them
			// (3 s − 27 s).
			assert.Equal(t, int64(3*time.Second), s.Field(i).Int(), "DeployHold: the steps scaled, EngineWork kept, the margin scaled")
		} else if name == "LockWait" {
			// The scaled hold (1.5 s + 1.5 s + 3 s) and half the margin
			// past it (3 s − 9 s).
			assert.Equal(t, int64(3*time.Second), s.Field(i).Int(), "LockWait: the hold kept whole, its margin scaled")
		} else if hostBound[name] {
			assert.Equalf(t, int64(3*time.Second), s.Field(i).Int(), "%s is the host's and is kept", name)
		} else if s.Field(i).Type() == durationType {
			assert.Equalf(t, int64(1500*time.Millisecond), s.Field(i).Int(), "%s is scaled", name)
		} else {
			assert.Equalf(t, int64(3), s.Field(i).Int(), "%s is a count and is kept", name)
		}
	}
	// Rounded to the nearest nanosecond, not truncated.
	odd := infra.Timing{Drain: 2}
	assert.Equal(t, time.Duration(1), odd.Scaled(0.3).Drain, "0.6ns rounds to 1ns")
	assert.Equal(t, 3*time.Second, infra.Prod().Scaled(0.2).Drain)
}

func TestDrainConfig(t *testing.T) {
	tm := with(t, map[string]any{"Drain": 14 * time.Second, "ShutdownTimeout": 9 * time.Second, "AppKeepAlive": 70 * time.Second,
		"MaxRequest": 50 * time.Second, "ReadHeaderTimeout": 4 * time.Second,
		"HealthCheckInterval": 6 * time.Second, "HealthCheckTimeout": 2 * time.Second, "UnhealthyThreshold": 3,
		"DrainQuiet": 1500 * time.Millisecond, "QuietRequests": 12, "MaxDrain": 24 * time.Second})
	assert.Equal(t, drain.Config{
		HealthPath:          infra.HealthPath,
		HealthyStatus:       infra.HealthyStatus,
		Drain:               14 * time.Second,
		ShutdownTimeout:     9 * time.Second,
		KeepAlive:           70 * time.Second,
		ReadHeaderTimeout:   4 * time.Second,
		ReadTimeout:         70 * time.Second,
		WriteTimeout:        70 * time.Second,
		MaxHeaderBytes:      64 << 10,
		MaxRequest:          50 * time.Second,
		Evidence:            true,
		HealthCheckInterval: 6 * time.Second,
		HealthCheckTimeout:  2 * time.Second,
		UnhealthyThreshold:  3,
		DrainQuiet:          1500 * time.Millisecond,
		QuietRequests:       12,
		MaxDrain:            24 * time.Second,
	}, tm.DrainConfig())
	require.NoError(t, tm.DrainConfig().Validate())
	assert.Equal(t, tm.EarliestDrainEnd(), tm.DrainConfig().EarliestEnd(), "the library's lower bound is the contract's")
}

// TestEveryDurationMustBePositive finds the duration fields by reflection,
// so a new field that Validate forgets to check fails here.
func TestEveryDurationMustBePositive(t *testing.T) {
	typ := reflect.TypeOf(infra.Timing{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		for _, bad := range []int64{0, -1} {
			tm := infra.Prod()
			reflect.ValueOf(&tm).Elem().Field(i).SetInt(bad)
			assert.Truef(t, named(tm.Violations(), infra.RulePositive, f.Name),
				"%s = %d must break %s; got %v", f.Name, bad, infra.RulePositive, tm.Violations())
			assert.Truef(t, infra.HasRule(tm.ValidateInvariants(), infra.RulePositive),
				"%s = %d must break %s for a scaled timing too", f.Name, bad, infra.RulePositive)
		}
	}
}

// wrongValues lists, for every field of Timing, values that must be
// rejected: zero, negative, and one step past each boundary the field takes
// part in. They are computed from Prod, so they stay just past the boundary
// when a number changes.
func wrongValues(p infra.Timing) map[string][]any {
	whole := func(d time.Duration) time.Duration { return d.Truncate(time.Second) }
	u := time.Duration(p.UnhealthyThreshold)
	return map[string][]any{
		"HealthCheckInterval": {0, -time.Second, 4 * time.Second, 301 * time.Second, p.HealthCheckInterval + time.Second/2,
			p.HealthCheckTimeout, p.ContainerHealthInterval,
			whole((p.Drain-p.NodeSkew-p.HealthCheckTimeout)/u) + time.Second},
		"HealthCheckTimeout": {0, -time.Second, time.Second, 121 * time.Second, p.HealthCheckTimeout + time.Second/2,
			p.HealthCheckInterval, p.Drain - p.NodeSkew - p.HealthCheckInterval*u + 1},
		"UnhealthyThreshold": {0, -1, 1, 11,
			int((p.Drain-p.NodeSkew-p.HealthCheckTimeout)/p.HealthCheckInterval) + 1},
		"HealthyThreshold": {0, -1, 1, 11, int(p.ReentryBound()/p.HealthCheckInterval) + 1},
		"NodeSkew":         {0, -time.Nanosecond, p.DrainMargin() + 1, p.DrainQuiet + 1},
		"Drain": {0, -time.Second, p.WorstCaseDetection() + p.NodeSkew - 1,
			p.StopGracePeriod - p.ShutdownTimeout - p.KillMargin + 1, p.Reentry() - 1, p.MaxDrain + 1},
		"DrainQuiet":    {0, -time.Nanosecond, p.NodeSkew - 1},
		"QuietRequests": {0, -1},
		"MaxDrain":      {0, -time.Nanosecond, p.Drain - 1, p.StopGracePeriod - p.ShutdownTimeout - p.KillMargin + 1},
		"ShutdownTimeout": {0, -time.Second, p.StopGracePeriod - p.Drain - p.KillMargin + 1, p.DeregistrationDelay + 1,
			p.ReadHeaderTimeout, p.AppKeepAlive, p.StopGracePeriod - p.MaxDrain - p.KillMargin + 1},
		"KillMargin": {0, -time.Second, p.KillSlack() + 1, p.StopGracePeriod - p.MaxShutdownDeadline() + 1},
		"StopGracePeriod": {0, -time.Second, p.StopGracePeriod + time.Second/2,
			whole(p.ShutdownDeadline() + p.KillMargin - time.Second), whole(p.MaxShutdownDeadline() + p.KillMargin - time.Second),
			p.MaxPlannedDowntime - p.StartTimeout + time.Second, p.LockWait - p.StartTimeout - p.EngineWork + time.Second},
		"DeregistrationDelay": {-time.Second, p.ShutdownTimeout - time.Second, 3601 * time.Second,
			p.DeregistrationDelay + time.Second/2},
		"LBIdleTimeout": {0, -time.Second, p.AppKeepAlive, 4001 * time.Second, p.LBIdleTimeout + time.Second/2,
			p.MaxRequest - time.Second},
		"ReadHeaderTimeout":       {0, -time.Nanosecond, p.ShutdownTimeout},
		"MaxRequest":              {0, -time.Nanosecond, p.LBIdleTimeout + 1},
		"AppKeepAlive":            {0, -time.Second, p.LBIdleTimeout, p.ShutdownTimeout},
		"ContainerHealthInterval": {0, -time.Nanosecond, p.EarliestReentry() + 1, p.StartTimeout - p.ContainerHealthTimeout},
		"ContainerHealthTimeout":  {0, -time.Nanosecond, p.StartTimeout - p.ContainerHealthInterval},
		"StartTimeout": {0, -time.Second, p.FirstContainerCheck(), p.MaxPlannedDowntime - p.StopGracePeriod + 1,
			p.LockWait - p.StopGracePeriod - p.EngineWork + 1},
		"EngineWork":         {0, -time.Nanosecond, p.LockWait - p.DeployDowntime() + 1},
		"LockWait":           {0, -time.Second, p.WatchdogHold() - 1},
		"DeployHold":         {0, -time.Second, p.DeploySteps() + p.EngineWork - 1},
		"WatchdogInterval":   {0, -time.Second, p.MaxPlannedDowntime / time.Duration(p.WatchdogStrikes-1)},
		"WatchdogStrikes":    {0, -1, p.WatchdogStrikes - 1},
		"MaxPlannedDowntime": {0, -time.Second, p.WatchdogTolerance(), p.DeployDowntime() - 1},
		"Slots":              {0, -1, p.RegisteredSlots + 1, infra.MaxSlots + 1},
		"RegisteredSlots":    {0, -1, p.Slots + 1, infra.MaxSlots + 1},
	}
}

// TestMutationSweep is the article's hand mutation test, made exhaustive:
// every field of Timing, found by reflection, set to each of its wrong values,
// must be rejected by a rule that names that field. A new field without wrong
// values fails the sweep.
func TestMutationSweep(t *testing.T) {
	p := infra.Prod()
	wrong := wrongValues(p)
	typ := reflect.TypeOf(p)
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Name
		t.Run(name, func(t *testing.T) {
			values, ok := wrong[name]
			require.Truef(t, ok, "field %s has no wrong values in the mutation sweep", name)
			require.NotEmpty(t, values)
			for _, val := range values {
				tm := with(t, map[string]any{name: val})
				got := reflect.ValueOf(tm).Field(i).Interface()
				require.NotEqualf(t, reflect.ValueOf(p).Field(i).Interface(), got, "%s: the wrong value equals Prod's", name)
				vs := tm.Violations()
				fields := map[string]bool{}
				for _, v := range vs {
					for _, f := range v.Fields {
						fields[f] = true
					}
				}
				assert.Truef(t, fields[name], "%s = %v must be rejected by a rule naming it; got %v", name, got, vs)
			}
		})
	}
	assert.Len(t, wrong, typ.NumField(), "the sweep lists a field Timing does not have")
}

// TestSweepStepsInwardAreValid checks that the sweep probes real boundaries:
// a value one step inward from each boundary is valid.
func TestSweepStepsInwardAreValid(t *testing.T) {
	p := infra.Prod()
	tests := []struct {
		field string
		value any
	}{
		{"NodeSkew", min(p.DrainMargin(), p.DrainQuiet)},
		{"Drain", p.WorstCaseDetection() + p.NodeSkew},
		{"Drain", min(p.StopGracePeriod-p.ShutdownTimeout-p.KillMargin, p.MaxDrain)},
		{"ShutdownTimeout", p.StopGracePeriod - p.MaxDrain - p.KillMargin},
		{"KillMargin", p.StopGracePeriod - p.MaxShutdownDeadline()},
		{"DrainQuiet", p.NodeSkew},
		{"QuietRequests", 1},
		{"MaxDrain", p.Drain},
		{"MaxDrain", p.StopGracePeriod - p.ShutdownTimeout - p.KillMargin},
		{"StartTimeout", p.LockWait - p.StopGracePeriod - p.EngineWork},
		{"EngineWork", p.LockWait - p.DeployDowntime()},
		{"LockWait", p.WatchdogHold()},
		{"DeployHold", p.DeploySteps() + p.EngineWork},
		{"ContainerHealthInterval", p.EarliestReentry()},
		{"WatchdogInterval", p.MaxPlannedDowntime/time.Duration(p.WatchdogStrikes-1) + time.Second},
		{"MaxPlannedDowntime", p.WatchdogTolerance() - 1},
		{"MaxPlannedDowntime", p.DeployDowntime()},
		{"AppKeepAlive", p.LBIdleTimeout + 1},
		{"DeregistrationDelay", p.ShutdownTimeout},
		{"ContainerHealthInterval", p.HealthCheckInterval - 1},
		{"ContainerHealthTimeout", p.StartTimeout - p.ContainerHealthInterval - 1},
		{"ReadHeaderTimeout", p.ShutdownTimeout - 1},
		{"LBIdleTimeout", p.MaxRequest},
		{"MaxRequest", p.LBIdleTimeout},
	}
	for _, tt := range tests {
		tm := with(t, map[string]any{tt.field: tt.value})
		assert.NoErrorf(t, tm.Validate(), "%s = %v is on the valid side of its boundary", tt.field, tt.value)
	}
}

func TestScaledRehearsalKeepsInvariants(t *testing.T) {
	// The rehearsal's scale: Docker's stop grace period stays whole seconds.
	s := infra.Prod().Scaled(0.2)
	require.NoError(t, s.ValidateInvariants())
	assert.Zero(t, s.StopGracePeriod%time.Second, "stop grace %v must stay whole seconds", s.StopGracePeriod)
	assert.InDelta(t, 0.2, float64(s.Drain)/float64(infra.Prod().Drain), 1e-9)
	assert.Equal(t, float64(infra.Prod().ServerDeployMin())*0.2, math.Round(float64(s.ServerDeployMin())))
}

func TestCheckRollout(t *testing.T) {
	tests := []struct {
		name                    string
		servers, maxUnavailable int
		problems                []string // nil: accepted
	}{
		{name: "a lone server", servers: 1, maxUnavailable: 1},
		{name: "a lone server is the whole fleet whatever N says", servers: 1, maxUnavailable: 3},
		{name: "two servers, one at a time", servers: 2, maxUnavailable: 1},
		{name: "all but one", servers: 10, maxUnavailable: 9},
		{name: "N equal to K", servers: 2, maxUnavailable: 2,
			problems: []string{"maxUnavailable 2 must be below servers 2: an ALB whose targets are all unhealthy fails open"}},
		{name: "N above K", servers: 3, maxUnavailable: 5, problems: []string{"maxUnavailable 5 must be below servers 3"}},
		{name: "N zero", servers: 2, maxUnavailable: 0, problems: []string{"maxUnavailable 0 must be at least 1"}},
		{name: "N zero, one server", servers: 1, maxUnavailable: 0, problems: []string{"maxUnavailable 0 must be at least 1"}},
		{name: "N negative", servers: 4, maxUnavailable: -1, problems: []string{"maxUnavailable -1 must be at least 1"}},
		{name: "no servers", servers: 0, maxUnavailable: 1, problems: []string{"servers 0 must be at least 1"}},
		{name: "everything wrong, all named", servers: -2, maxUnavailable: 0,
			problems: []string{"servers -2 must be at least 1", "maxUnavailable 0 must be at least 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := infra.CheckRollout(tt.servers, tt.maxUnavailable)
			if tt.problems == nil {
				require.NoError(t, err)
				return
			}
			var ire *infra.InvalidRolloutError
			require.ErrorAs(t, err, &ire)
			assert.Equal(t, tt.servers, ire.Servers)
			assert.Equal(t, tt.maxUnavailable, ire.MaxUnavailable)
			require.Len(t, ire.Problems, len(tt.problems), "one problem each: %v", ire.Problems)
			for i, want := range tt.problems {
				assert.Contains(t, ire.Problems[i], want)
			}
			assert.True(t, strings.HasPrefix(err.Error(),
				fmt.Sprintf("invalid rollout of servers %d with maxUnavailable %d: %s", tt.servers, tt.maxUnavailable, ire.Problems[0])), err.Error())
			assert.Contains(t, err.Error(), strings.Join(ire.Problems, "; "))
		})
	}
}

// batchSizes is the rollout's plan spelled out: ones batches of one
// server, then up to n at a time.
func batchSizes(k, ones, n int) []int {
	var sizes []int
	left := k
	for ; left > 0 && len(sizes) < ones; left-- {
		sizes = append(sizes, 1)
	}
	for ; left > 0; left -= n {
		sizes = append(sizes, min(n, left))
	}
	return sizes
}

func TestRolloutBatches(t *testing.T) {
	// batches: a canary of one, then N at a time (a fleet all in service).
	// most: at worst a check batch of one, the canary, the last server
	// already out alone, then N at a time. rollback: the same without the
	// check.
	tests := []struct {
		servers, maxUnavailable, batches, most, rollback int
	}{
		{1, 1, 1, 1, 1},  // the canary is the fleet
		{1, 4, 1, 1, 1},  // so is it whatever N says
		{2, 1, 2, 2, 2},  // production today: 1, 1
		{3, 1, 3, 3, 3},  // 1, 1, 1: with N = 1 the worst case is the plan
		{3, 2, 2, 3, 3},  // 1, 2; at worst 1, 1, 1
		{4, 2, 3, 4, 3},  // 1, 2, 1: one more than ⌈K / N⌉; at worst 1, 1, 1, 1 and 1, 1, 2
		{5, 2, 3, 4, 4},  // 1, 2, 2; at worst 1, 1, 1, 2 and 1, 1, 2, 1
		{4, 3, 2, 4, 3},  // 1, 3; at worst 1, 1, 1, 1 and 1, 1, 2
		{10, 3, 4, 6, 5}, // 1, 3, 3, 3; at worst 1, 1, 1, 3, 3, 1 and 1, 1, 3, 3, 2
		{10, 4, 4, 5, 4}, // 1, 4, 4, 1; at worst 1, 1, 1, 4, 3 and 1, 1, 4, 4
		{10, 9, 2, 4, 3}, // 1, 9; at worst 1, 1, 1, 7 and 1, 1, 8
		{100, 25, 5, 7, 6},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("K=%d,N=%d", tt.servers, tt.maxUnavailable), func(t *testing.T) {
			k, n := tt.servers, tt.maxUnavailable
			assert.Equal(t, tt.batches, infra.RolloutBatches(k, n), "1 + ⌈(K − 1) / N⌉")
			assert.Equal(t, tt.most, infra.RolloutBatchesMax(k, n), "min(K, 3) + ⌈(K − min(K, 3)) / N⌉")
			assert.Equal(t, tt.rollback, infra.RollbackBatchesMax(k, n), "min(K, 2) + ⌈(K − min(K, 2)) / N⌉")
			for _, c := range []struct {
				ones, want int
			}{{1, tt.batches}, {3, tt.most}, {2, tt.rollback}} {
				sizes := batchSizes(k, c.ones, n)
				assert.Len(t, sizes, c.want, "%d batch(es) of one, then %d at a time: %v", c.ones, n, sizes)
				sum := 0
				for _, s := range sizes {
					sum += s
				}
				assert.Equal(t, k, sum, "every server once: %v", sizes)
			}
			assert.LessOrEqual(t, tt.batches, tt.most, "the plan is one of the cases the worst case covers")
			assert.LessOrEqual(t, tt.rollback, tt.most, "a rollback goes back through deployed batches only")
		})
	}
}

func TestRolloutFunctionsRefuseWhatCheckRolloutRefuses(t *testing.T) {
	tm := infra.Prod()
	for _, kn := range [][2]int{{2, 2}, {2, 0}, {0, 1}, {3, 4}} {
		k, n := kn[0], kn[1]
		want := infra.CheckRollout(k, n)
		require.Error(t, want)
		assert.PanicsWithErrorf(t, want.Error(), func() { infra.RolloutBatches(k, n) }, "RolloutBatches(%d, %d)", k, n)
		assert.PanicsWithErrorf(t, want.Error(), func() { infra.RolloutBatchesMax(k, n) }, "RolloutBatchesMax(%d, %d)", k, n)
		assert.PanicsWithErrorf(t, want.Error(), func() { infra.RollbackBatchesMax(k, n) }, "RollbackBatchesMax(%d, %d)", k, n)
		assert.Panicsf(t, func() { tm.RolloutMin(k, n) }, "RolloutMin(%d, %d)", k, n)
		assert.Panicsf(t, func() { tm.RolloutMax(k, n) }, "RolloutMax(%d, %d)", k, n)
		assert.Panicsf(t, func() { tm.RollbackBound(k, n) }, "RollbackBound(%d, %d)", k, n)
		assert.Panicsf(t, func() { tm.FailedRolloutMax(k, n) }, "FailedRolloutMax(%d, %d)", k, n)
	}
}

func TestRolloutDurations(t *testing.T) {
	// Apart from Prod, so a factor the formulas drop shows: ServerDeployMin
	// 58s, StatusMax 212s, RolloutBatchMax 476s (TestDerived).
	tm := infra.Timing{
		HealthCheckInterval: 7 * time.Second, HealthCheckTimeout: 2 * time.Second,
		UnhealthyThreshold: 3, HealthyThreshold: 4,
		NodeSkew: time.Second, Drain: 30 * time.Second, StopGracePeriod: 50 * time.Second,
		StartTimeout: 20 * time.Second, LockWait: 3 * time.Minute, EngineWork: 9 * time.Second,
		DeployHold: 3 * time.Minute,
	}
	const deployMin, statusMax, batchMax = 58 * time.Second, 212 * time.Second, 476 * time.Second
	require.Equal(t, deployMin, tm.ServerDeployMin())
	require.Equal(t, statusMax, tm.StatusMax())
	require.Equal(t, batchMax, tm.RolloutBatchMax())
	tests := []struct {
		servers, maxUnavailable    int
		min, max, rollback, failed time.Duration
	}{
		// 1 batch; at worst 1, and 1 rolled back.
		{1, 1, 58 * time.Second, 900 * time.Second, 476 * time.Second, 1376 * time.Second},
		// 2 × 58s; 2 × 212s + 2 × 476s; 2 × 476s.
		{2, 1, 116 * time.Second, 1376 * time.Second, 952 * time.Second, 2328 * time.Second},
		// 2 × 58s; 2 × 212s + 3 × 476s; 3 × 476s.
		{3, 2, 116 * time.Second, 1852 * time.Second, 1428 * time.Second, 3280 * time.Second},
		// 3 × 58s; 2 × 212s + 4 × 476s; 3 × 476s.
		{4, 2, 174 * time.Second, 2328 * time.Second, 1428 * time.Second, 3756 * time.Second},
		// 4 × 58s; 2 × 212s + 5 × 476s; 4 × 476s.
		{10, 4, 232 * time.Second, 2804 * time.Second, 1904 * time.Second, 4708 * time.Second},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("K=%d,N=%d", tt.servers, tt.maxUnavailable), func(t *testing.T) {
			k, n := tt.servers, tt.maxUnavailable
			assert.Equal(t, tt.min, tm.RolloutMin(k, n), "RolloutBatches %d × ServerDeployMin", infra.RolloutBatches(k, n))
			assert.Equal(t, tt.max, tm.RolloutMax(k, n), "2 × StatusMax + RolloutBatchesMax %d × RolloutBatchMax", infra.RolloutBatchesMax(k, n))
			assert.Equal(t, tt.rollback, tm.RollbackBound(k, n), "RollbackBatchesMax %d × RolloutBatchMax", infra.RollbackBatchesMax(k, n))
			assert.Equal(t, tt.failed, tm.FailedRolloutMax(k, n), "RolloutMax + RollbackBound")
		})
	}
}

func TestProdRollout(t *testing.T) {
	p := infra.Prod()
	require.NoError(t, infra.CheckRollout(2, infra.DefaultMaxUnavailable))
	assert.Equal(t, 1, infra.DefaultMaxUnavailable, "one server out at a time unless the rollout is told otherwise")
	assert.Equal(t, 148*time.Second, p.StatusMax(), "13s + 2m + 15s")
	assert.Equal(t, 290*time.Second, p.DeploySteps(), "3 × 60s + 100s + 10s")
	assert.Equal(t, 480*time.Second, p.ServerDeployMax(), "2m + 6m")
	assert.Equal(t, 553*time.Second, p.RemoteDeployMax(), "13s + 2m + (1m + 6m)")
	assert.Equal(t, 587*time.Second, p.RolloutBatchMax(), "553s + (29s + 5s)")
	assert.Equal(t, 50*time.Second, p.RolloutMin(2, 1), "2 × 25s")
	assert.Equal(t, 1470*time.Second, p.RolloutMax(2, 1), "2 × 148s + 2 × 587s")
	assert.Equal(t, 1174*time.Second, p.RollbackBound(2, 1), "2 × 587s")
	assert.Equal(t, 2644*time.Second, p.FailedRolloutMax(2, 1), "1470s + 1174s: 44m4s")
}
