// Package rehearsal rehearses rolling deploys on one host and counts the
// requests that reached nothing.
//
// K simulated servers (each a compose project started by the real hooks) sit
// behind two HAProxy nodes that health-check them independently, as ALB
// nodes do, with every health-check number taken from infra.Timing. A load
// generator sends a steady rate of requests through both balancers while the
// rollout CI runs (package rollout) runs the real deploy hook on every
// server in turn, D times, waiting between servers until both balancer
// nodes have the new one back; the real watchdog runs on every server on
// its own timer. Each
// response is classified (2xx, 502, 503, 504, other, client error) and
// reported per deploy.
//
// Two profiles run side by side: prod, the timing contract, and before, the
// article's old setup (a 5 s drain against a balancer that needed up to a
// minute to notice). prod must show no 502 or 504; before must show the bug.
package rehearsal

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/mythex/infra/infra"
)

// Profile names.
const (
	ProfileProd   = "prod"
	ProfileBefore = "before"
	// ProfileEvidence is prod's timing with every balancer node naming
	// itself in its checks, as an ALB node does by its own address when a
	// server can see it: the servers tell the nodes apart and the evidence
	// drain may end a drain before the fixed one. Prod's nodes reach the
	// servers through Docker's userland proxy, one peer to them: the fixed
	// drain. Run side by side, the two show what the evidence drain buys.
	ProfileEvidence = "evidence"
)

// The article's old setup, in its own words: the server drained for 5
// seconds, while the balancer checked every 30 seconds and needed two failed
// checks, "up to about 60 seconds end to end". These are the only numbers the
// before profile changes; everything else is Prod's.
const (
	beforeDrain               = 5 * time.Second
	beforeHealthCheckInterval = 30 * time.Second
	beforeUnhealthyThreshold  = 2
)

// beforeBreaks are the relations the old setup breaks: its drain is shorter
// than detection, and shorter than re-entry.
var beforeBreaks = []infra.Rule{infra.RuleDrainOutlasts, infra.RuleReentryShort}

// Profile is one timing a rehearsal deploys with.
type Profile struct {
	// Name is ProfileProd or ProfileBefore.
	Name string
	// Unscaled is the timing as production would run it.
	Unscaled infra.Timing
	// Timing is Unscaled scaled by the rehearsal's factor: what actually runs.
	Timing infra.Timing
	// Violations are the rules Unscaled breaks: none for prod, the reasons
	// for the 502s for before.
	Violations []infra.Violation
	// Breaks names the relations the profile breaks on purpose; its release
	// is rendered only if it breaks those and no other.
	Breaks []infra.Rule
	// steps, when set, is what the profile does under the load once its
	// servers and nodes run, in place of Config.Deploys deploys; it returns
	// a report per step (a transition's orders, transition.go).
	steps func(context.Context, *fleet) ([]DeployReport, error)
	// steady keeps the load at its rate throughout, without quiet spells.
	steady bool
	// slots gives each server a second, idle slot behind every node: the
	// slots design's prototype (slots.go). No watchdog runs: it knows one
	// slot, and would restart the one a swap stopped.
	slots bool
	// nodes is how the profile's balancer nodes differ from plain ones,
	// its lag scaled with Timing.
	nodes NodeBehaviour
}

// nodeOptions are the options of the profile's n balancer nodes, lb1 to
// lbn: all named if the profile's nodes are, the last one lagging if they
// lag. A profile whose nodes are plain gets plain nodes.
func (p Profile) nodeOptions(n int) []NodeOptions {
	out := make([]NodeOptions, n)
	for i := range out {
		out[i] = NodeOptions{Name: fmt.Sprintf("lb%d", i+1), Named: p.nodes.Named}
	}
	if n > 0 {
		out[n-1].Lag = p.nodes.Lag
	}
	return out
}

// Before returns the article's old setup: Prod with only the numbers the
// article changed put back.
func Before() infra.Timing {
	t := infra.Prod()
	t.Drain = beforeDrain
	t.HealthCheckInterval = beforeHealthCheckInterval
	t.UnhealthyThreshold = beforeUnhealthyThreshold
	return t
}

// CheckScale reports why f cannot scale t for a rehearsal, or nil. Every
// duration is scaled by the same f; Docker takes the stop grace period in
// whole seconds, so the scaled StopGracePeriod must be whole or Docker's kill
// would come at a different moment than the timing says.
func CheckScale(t infra.Timing, f float64) error {
	if math.IsNaN(f) || f <= 0 || f > 1 {
		return fmt.Errorf("scale %v must be within (0, 1]", f)
	}
	s := t.Scaled(f)
	if s.StopGracePeriod < time.Second || s.StopGracePeriod%time.Second != 0 {
		return fmt.Errorf("scale %v makes StopGracePeriod %v × %v = %v, but Docker's stop grace period has one-second resolution: choose a scale that makes it whole seconds (e.g. %v)",
			f, t.StopGracePeriod, f, s.StopGracePeriod, suggestScale(t.StopGracePeriod, f))
	}
	return nil
}

// suggestScale returns the scale nearest f that makes d whole seconds.
func suggestScale(d time.Duration, f float64) float64 {
	secs := math.Max(1, math.Round(d.Seconds()*f))
	return secs / d.Seconds()
}

// Profiles returns the named profiles scaled by f. prod's scaled timing must
// keep every invariant; before's unscaled violations are carried along to be
// reported, because breaking them is what the before profile is for.
func Profiles(f float64, names ...string) ([]Profile, error) {
	var out []Profile
	var errs []error
	for _, name := range names {
		var base infra.Timing
		switch name {
		case ProfileProd:
			base = infra.Prod()
		case ProfileBefore:
			base = Before()
		case ProfileEvidence:
			base = infra.Prod()
		default:
			errs = append(errs, fmt.Errorf("profile %q: unknown (want %s, %s or %s)", name, ProfileProd, ProfileBefore, ProfileEvidence))
			continue
		}
		if err := CheckScale(base, f); err != nil {
			errs = append(errs, fmt.Errorf("profile %s: %w", name, err))
			continue
		}
		p := Profile{Name: name, Unscaled: base, Timing: base.Scaled(f), Violations: base.Violations()}
		if name == ProfileBefore {
			p.Breaks = beforeBreaks
		}
		if name == ProfileEvidence {
			p.nodes = NodeBehaviour{Named: true}
		}
		if name == ProfileProd || name == ProfileEvidence {
			if err := p.Timing.ValidateInvariants(); err != nil {
				errs = append(errs, fmt.Errorf("profile prod scaled by %v: %w", f, err))
				continue
			}
		}
		out = append(out, p)
	}
	if len(names) == 0 {
		errs = append(errs, errors.New("no profile given"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
