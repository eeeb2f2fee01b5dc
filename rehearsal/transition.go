package rehearsal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

// The transition rehearsal rolls one change of the timing out in both
// orders through the real balancer nodes, each order on fresh servers under
// the same load: `pulumi up` (every node reloads the new balancer numbers
// while it runs, Balancer.Reload) and the rollout of the new release (each
// server gets the new compose definition and hooks just before its deploy,
// rollout.shipping). infra.CheckTransition says which order is safe; the
// rehearsal shows it on the symptom: the order whose mixed states break a
// relation answers 502s, the safe one none.

// The example change of the rollout order (docs/timing.md, "A change is
// checked while it rolls out"): the balancer checks half as often, and the drain
// grows to outlast the slower detection (2 × 10 s + 3 s = 23 s, plus
// NodeSkew).
const (
	exampleHealthCheckInterval = 10 * time.Second
	exampleDrain               = 30 * time.Second
)

// ExampleChange is the change the transition rehearsal rolls out: from
// production to production with exampleHealthCheckInterval and
// exampleDrain, its upper bound MaxDrain raised to it, and the stop grace
// period that the longer drain needs to keep drain-fits-grace (drain +
// shutdown timeout + kill margin, 45 s).
// Every other number, the deregistration delay included, stays: no other
// relation needs it to move.
func ExampleChange() (old, new infra.Timing) {
	old = infra.Prod()
	new = old
	new.HealthCheckInterval = exampleHealthCheckInterval
	new.Drain = exampleDrain
	new.MaxDrain = exampleDrain
	new.StopGracePeriod = new.ShutdownDeadline() + new.KillMargin
	return old, new
}

// The transition rehearsal's size unless told otherwise. Two servers: the
// fewest that keep one serving while the other deploys. Twelve nodes: the
// unsafe order's 502s come by chance, since a node is late for a draining
// server only when its checks' own schedule puts its second failed check
// past the listener's close (for the example, half the time), and a late
// node answers 502 only if a request falls in its gap. Every node is
// another chance, and a node is a cheap process where a server is four
// containers.
const (
	TransitionServers = 2
	TransitionNodes   = 12
)

// The orders, as the transition's profiles are named.
var orderProfiles = map[infra.Order]string{
	infra.BalancerFirst: "balancer-first",
	infra.ServersFirst:  "servers-first",
}

// rehearsableBreaks are the relations whose breaking the transition
// rehearsal shows: a drain shorter than detection answers 502s (the short
// re-entry that comes with it costs time, not requests). A change whose
// unsafe order breaks anything else needs a symptom of its own here.
var rehearsableBreaks = map[infra.Rule]bool{infra.RuleDrainOutlasts: true, infra.RuleReentryShort: true}

// transitionCase is a change, judged, and its orders as profiles.
type transitionCase struct {
	// tr is the verdict on the production timings.
	tr infra.Transition
	// scaledOld and scaledNew are the timings that run.
	scaledOld, scaledNew infra.Timing
	profiles             []Profile
	orders               []infra.Order
}

// newTransitionCase judges the change from old to new and scales it by f.
// Both timings must be valid as production would run them and stay valid
// scaled, and the scaled change must get the same verdict, or the rehearsal
// would not show what production risks. The new timing is rendered by the
// ordinary renderer, which refuses an invalid one.
func newTransitionCase(old, new infra.Timing, f float64) (transitionCase, error) {
	var errs []error
	for _, side := range []struct {
		name string
		t    infra.Timing
	}{{"old", old}, {"new", new}} {
		if err := side.t.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s timing: %w", side.name, err))
		}
		if err := CheckScale(side.t, f); err != nil {
			errs = append(errs, fmt.Errorf("%s timing: %w", side.name, err))
		} else if err := side.t.Scaled(f).ValidateInvariants(); err != nil {
			errs = append(errs, fmt.Errorf("%s timing scaled by %v: %w", side.name, f, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return transitionCase{}, fmt.Errorf("transition: %w", err)
	}
	tc := transitionCase{scaledOld: old.Scaled(f), scaledNew: new.Scaled(f)}
	var err error
	if tc.tr, err = infra.CheckTransition(old, new); err != nil {
		return transitionCase{}, fmt.Errorf("transition: %w", err)
	}
	scaled, err := infra.CheckTransition(tc.scaledOld, tc.scaledNew)
	if err != nil {
		return transitionCase{}, fmt.Errorf("transition scaled by %v: %w", f, err)
	}
	if scaled.Order != tc.tr.Order {
		return transitionCase{}, fmt.Errorf("transition: scaled by %v the verdict is %q, not %q: the rehearsal would not show what production risks", f, scaled.Order, tc.tr.Order)
	}
	for _, o := range []infra.Order{infra.BalancerFirst, infra.ServersFirst} {
		for _, s := range tc.tr.Breaks(o) {
			for _, v := range s.Broken {
				if !rehearsableBreaks[v.Rule] {
					errs = append(errs, fmt.Errorf("%s breaks %s, whose symptom the transition rehearsal does not judge", o, v.Rule))
				}
			}
		}
		tc.orders = append(tc.orders, o)
		tc.profiles = append(tc.profiles, Profile{
			Name: orderProfiles[o], Unscaled: old, Timing: tc.scaledOld,
			steps: tc.steps(o),
			// A quiet spell (a twentieth of the rate for most of an idle
			// timeout, for the keep-alive race, which this change does not
			// touch) could leave a server's drain all but unobserved.
			steady: true,
		})
	}
	if err := errors.Join(errs...); err != nil {
		return transitionCase{}, fmt.Errorf("transition: %w", err)
	}
	return tc, nil
}

// The steps' names, as reports show them.
const (
	stepPulumiUp = "pulumi up: every balancer node reloads the new numbers"
	stepRollout  = "rollout: the new release, server by server"
)

// steps are order o's two steps, `pulumi up` and the rollout, in o's order.
func (tc transitionCase) steps(o infra.Order) func(context.Context, *fleet) ([]DeployReport, error) {
	return func(ctx context.Context, f *fleet) ([]DeployReport, error) {
		seq := []func(int) (DeployReport, error){
			func(n int) (DeployReport, error) { return tc.pulumiUp(ctx, f, n) },
			// Under the new balancer numbers.
			func(n int) (DeployReport, error) { return tc.rollout(ctx, f, n, tc.scaledNew) },
		}
		if o == infra.ServersFirst {
			seq = []func(int) (DeployReport, error){
				func(n int) (DeployReport, error) { return tc.rollout(ctx, f, n, tc.scaledOld) },
				func(n int) (DeployReport, error) { return tc.pulumiUp(ctx, f, n) },
			}
		}
		var out []DeployReport
		for i, step := range seq {
			dr, err := step(i + 1)
			out = append(out, dr)
			f.c.logf("%s: step %d, %s: %d requests, %d 2xx, %d 502, %d 503, %d 504, %d client errors; watchdog %d runs, %d restarts",
				f.p.Name, i+1, dr.Step, dr.Requests, dr.OK, dr.BadGateway, dr.Unavailable, dr.Timeout, dr.ClientErrors,
				dr.WatchdogRuns, dr.WatchdogRestarts)
			if err != nil {
				return out, err
			}
		}
		return out, nil
	}
}

// pulumiUp reloads every node with the new balancer numbers, each after a
// random delay within one new interval: ALB nodes check on schedules of
// their own, and HAProxy starts a node's checks at fixed offsets from its
// (re)start, so nodes reloaded at once would check in step, as one.
func (tc transitionCase) pulumiUp(ctx context.Context, f *fleet, n int) (DeployReport, error) {
	t := tc.scaledNew
	dr := DeployReport{Deploy: n, Step: stepPulumiUp, Version: f.version}
	err := observe(ctx, &dr, f.servers, f.lbs, f.load, t, false, func() error {
		errs := make([]error, len(f.lbs))
		var wg sync.WaitGroup
		for i, b := range f.lbs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-time.After(rand.N(t.HealthCheckInterval)):
				case <-ctx.Done():
					errs[i] = ctx.Err()
					return
				}
				errs[i] = b.Reload(ctx, t)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	return dr, err
}

// rollout deploys the new release to every server with the rollout CI runs,
// its transport shipping the release to each server just before its
// deploy, under the balancer numbers of live.
func (tc transitionCase) rollout(ctx context.Context, f *fleet, n int, live infra.Timing) (DeployReport, error) {
	// One build for both orders: the release is the same.
	version := f.id + "-new"
	dr := DeployReport{Deploy: n, Step: stepRollout, Version: version,
		// The old containers drain as the old release says; the new ones
		// come back at the pace of the live balancer.
		ServerDeployMin: (tc.scaledOld.Drain + live.Reentry()).Seconds()}
	if err := f.img.tag(ctx, version); err != nil {
		return dr, err
	}
	release := filepath.Join(f.dir, "release-new")
	if err := os.MkdirAll(release, 0o755); err != nil {
		return dr, fmt.Errorf("release dir: %w", err)
	}
	if err := writeRelease(release, Profile{Name: f.p.Name + " (new release)", Timing: tc.scaledNew}); err != nil {
		return dr, err
	}
	f.ro.shipping(release, tc.scaledNew)
	err := observe(ctx, &dr, f.servers, f.lbs, f.load, tc.scaledNew, true, func() error {
		var err error
		dr.HookSeconds, dr.ServerSeconds, err = f.ro.run(ctx, version, infra.DefaultMaxUnavailable)
		return err
	})
	if err == nil {
		f.version = version
	}
	return dr, err
}

// TransitionReport is a transition rehearsal: the change, its verdict, and
// each order judged on what the load and the nodes saw.
type TransitionReport struct {
	Date string `json:"date"`
	// Change lists every field the change moves, unscaled, with its side.
	Change []string `json:"change"`
	// Verdict is infra.CheckTransition's order for the production timings,
	// and Reason says why, as `timing diff` does.
	Verdict string        `json:"verdict"`
	Reason  string        `json:"reason"`
	Nodes   int           `json:"balancer_nodes"`
	Orders  []OrderResult `json:"orders"`
	// Report has a profile per order, a deploy row per step.
	Report Report `json:"report"`
}

// OrderResult is one order of the change, as rehearsed.
type OrderResult struct {
	Order string `json:"order"`
	// Breaks are the relations the order's mixed states break.
	Breaks   []string `json:"breaks,omitempty"`
	Expected string   `json:"expected"`
	Observed string   `json:"observed"`
	// Verdict is "pass" when a safe order shows no 502 and an unsafe one
	// shows 502s, as CheckTransition said, else "FAIL".
	Verdict string `json:"verdict"`
	Error   string `json:"error,omitempty"`
}

// Failed reports whether any order's verdict is not pass.
func (r TransitionReport) Failed() bool {
	for _, o := range r.Orders {
		if o.Verdict != "pass" {
			return true
		}
	}
	return len(r.Orders) == 0
}

// RunTransition rehearses ExampleChange in both orders, one after the other
// on fresh servers and nodes, with c's servers, nodes, rate and scale
// (c.Profiles and c.Deploys do not apply: each order rolls the new release
// out once), and judges each order against CheckTransition's verdict.
func RunTransition(ctx context.Context, c Config) (TransitionReport, error) {
	old, new := ExampleChange()
	return runTransition(ctx, c, old, new)
}

// ValidateTransition reports every reason c cannot rehearse ExampleChange,
// before anything runs.
func (c Config) ValidateTransition() error {
	old, new := ExampleChange()
	_, _, err := c.transition(old, new)
	return err
}

// transition is c as a transition rehearsal runs it, and the change judged.
func (c Config) transition(old, new infra.Timing) (Config, transitionCase, error) {
	// Each order takes two steps, each bounded as a deploy of every server
	// (the load's bound).
	c.Profiles, c.Deploys = []string{ProfileProd}, 2
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SSH {
		errs = append(errs, errors.New("rehearsal config: the transition rehearsal ships the new release itself; it does not run over ssh"))
	}
	tc, err := newTransitionCase(old, new, c.Scale)
	if err != nil {
		errs = append(errs, err)
	}
	return c, tc, errors.Join(errs...)
}

func runTransition(ctx context.Context, c Config, old, new infra.Timing) (TransitionReport, error) {
	c, tc, err := c.transition(old, new)
	if err != nil {
		return TransitionReport{}, err
	}
	rep := TransitionReport{
		Date:    time.Now().UTC().Format("2006-01-02"),
		Change:  changedFields(old, new),
		Verdict: string(tc.tr.Order),
		Reason:  contract.JudgeTransition(old, new).Reason(),
		Nodes:   c.nodes(),
	}
	r, runErrs := c.run(ctx, tc.profiles, true)
	rep.Report = r
	for i, o := range tc.orders {
		var pr *ProfileReport
		if i < len(r.Profiles) {
			pr = &r.Profiles[i]
		}
		rep.Orders = append(rep.Orders, tc.judge(o, pr, profileErr(runErrs, orderProfiles[o])))
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	if len(rep.Report.Profiles) == 0 {
		return rep, errors.Join(runErrs...)
	}
	return rep, nil
}

// judge says whether order o showed what CheckTransition says of it: when
// its states keep every relation, no 502, no 504, no request lost to the
// reload (client errors), every node taking every server out on its drain's
// 503 (none late, so the zero is no luck) and every service verified after
// every step; when they do not, 502s, counted alike by the load and the
// nodes' logs.
func (tc transitionCase) judge(o infra.Order, pr *ProfileReport, runErr error) OrderResult {
	res := OrderResult{Order: string(o), Verdict: "FAIL"}
	seen := map[infra.Rule]bool{}
	for _, s := range tc.tr.Breaks(o) {
		for _, v := range s.Broken {
			if !seen[v.Rule] {
				seen[v.Rule] = true
				res.Breaks = append(res.Breaks, string(v.Rule))
			}
		}
	}
	safe := len(res.Breaks) == 0
	res.Expected = "no 502, no 504, no client error, every service verified after each step"
	if !safe {
		res.Expected = "502s: a server's listener closes while a node still sends to it"
	}
	if runErr != nil {
		res.Error = runErr.Error()
	}
	if pr == nil {
		res.Observed = "not run"
		return res
	}
	t := total(pr.Deploys)
	var pairs []string
	for _, d := range pr.Deploys {
		for _, k := range sortedKeys(d.BadGatewayBy) {
			pairs = append(pairs, fmt.Sprintf("%s %d", k, d.BadGatewayBy[k]))
		}
	}
	res.Observed = fmt.Sprintf("%d 502 (%d GET, %d POST) in %d requests, %d 504, %d client errors, verified %s, %d watchdog restarts; %d of %d node/server take-outs late (the listener had closed)",
		t.BadGateway, t.ByMethod["GET"].BadGateway, t.ByMethod["POST"].BadGateway, t.Requests, t.Timeout, t.ClientErrors,
		yesNo(t.Verified), t.WatchdogRestarts, len(t.LateOut), t.TakenOut)
	if len(pairs) > 0 {
		res.Observed += "; 502s by node/server: " + strings.Join(pairs, ", ")
	}
	ran := len(pr.Deploys) == 2 && runErr == nil && len(pr.CrossCheck) == 0
	shown := t.BadGateway > 0
	if safe {
		shown = t.BadGateway+t.Timeout+t.ClientErrors > 0 || len(t.LateOut) > 0 || !t.Verified || t.WatchdogRestarts > 0
	}
	if ran && shown != safe {
		res.Verdict = "pass"
	}
	return res
}

// changedFields lists the fields old and new differ in, with their side.
func changedFields(old, new infra.Timing) []string {
	sides, _ := infra.FieldSides()
	o, n := reflect.ValueOf(old), reflect.ValueOf(new)
	var out []string
	for i := 0; i < o.NumField(); i++ {
		a, b := o.Field(i).Interface(), n.Field(i).Interface()
		if a == b {
			continue
		}
		side := ""
		if i < len(sides) {
			side = " (" + string(sides[i].Side) + ")"
		}
		out = append(out, fmt.Sprintf("%s %v → %v%s", o.Type().Field(i).Name, a, b, side))
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// WriteTable writes r: the change and its verdict, each order's steps as
// the load saw them, and each order judged.
func (r TransitionReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	rep := r.Report
	fmt.Fprintf(&b, "Transition rehearsal, %s: %s.\n", r.Date, strings.Join(r.Change, ", "))
	fmt.Fprintf(&b, "%d servers, %d balancer nodes, up to %d requests/s of GET and POST %s, every duration × %g, %s; each order on fresh servers.\n",
		rep.Servers, r.Nodes, rep.Rate, rep.Path, rep.Scale, rep.Balancer)
	fmt.Fprintf(&b, "CheckTransition: %s\n\n", r.Reason)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "order\tstep\trequests\t2xx\t502\t503\t504\tclient errors\ts/server\ttaken out\tlate\twatchdog restarts\tverified\t")
	for _, p := range rep.Profiles {
		for _, d := range p.Deploys {
			secs := "-"
			if len(d.ServerSeconds) > 0 {
				secs = fmt.Sprintf("%.2f", d.MeanServerSeconds())
			}
			fmt.Fprintf(tw, "%s\t%d. %s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t\n",
				p.Profile, d.Deploy, d.Step, d.Requests, d.OK, d.BadGateway, d.Unavailable, d.Timeout, d.ClientErrors,
				secs, d.TakenOut, len(d.LateOut), d.WatchdogRestarts, yesNo(d.Verified))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write transition: %w", err)
	}
	for _, p := range rep.Profiles {
		for _, pr := range p.CrossCheck {
			fmt.Fprintf(&b, "  %s: CROSS-CHECK: %s\n", p.Profile, pr)
		}
		for _, d := range p.Deploys {
			for _, pr := range d.Problems {
				fmt.Fprintf(&b, "  %s step %d: %s\n", p.Profile, d.Deploy, firstLine(pr))
			}
		}
	}
	b.WriteString("\n")
	for _, o := range r.Orders {
		breaks := strings.Join(o.Breaks, ", ")
		if breaks == "" {
			breaks = "nothing"
		}
		fmt.Fprintf(&b, "%s (breaks %s): %s\n  expected: %s\n  observed: %s\n", o.Order, breaks, o.Verdict, o.Expected, o.Observed)
		if o.Error != "" {
			fmt.Fprintf(&b, "  stopped: %s\n", firstLine(o.Error))
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write transition: %w", err)
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func (r TransitionReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write transition: %w", err)
	}
	return nil
}
