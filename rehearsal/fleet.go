package rehearsal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
)

// The fleet scenarios: the rollout's batches, canary and rollback, through
// the rollout CI runs, under load, behind the balancer nodes.
const (
	// FleetBatched rolls a good release out in batches (Config's
	// MaxUnavailable) after the canary.
	FleetBatched = "fleet-batched"
	// FleetNeverHealthy rolls out a release whose api never becomes
	// healthy.
	FleetNeverHealthy = "fleet-never-healthy"
	// FleetCrashes rolls out a release whose api starts healthy and
	// crashes a moment later.
	FleetCrashes = "fleet-crashes"
)

// DefaultFleetServers and DefaultFleetMaxUnavailable are the batched
// scenario's fleet: three batches after the canary at two at once.
// DefaultFleetScale is the smallest scale at which the crash scenario's
// crash fits between Docker's first check and a node's admission
// (crashAfter).
const (
	DefaultFleetServers        = 6
	DefaultFleetMaxUnavailable = "2"
	DefaultFleetScale          = 0.4
)

// FleetRow is one scenario as rehearsed.
type FleetRow struct {
	Scenario string `json:"scenario"`
	Expected string `json:"expected"`
	Observed string `json:"observed"`
	// RolloutSeconds is the rollout's wall time, from its start to its exit.
	RolloutSeconds float64 `json:"rollout_s"`
	// Batches is infra.RolloutBatches: the canary, then batches of N.
	Batches int `json:"batches"`
	// RolloutMinSeconds is infra's RolloutMin (Batches × ServerDeployMin):
	// the floor, since no batch is shorter than one server's drain and
	// re-entry. CeilSeconds is ⌈K/N⌉ × ServerDeployMin, the batches without
	// a canary.
	RolloutMinSeconds float64 `json:"rollout_min_s"`
	CeilSeconds       float64 `json:"ceil_k_over_n_min_s"`
	// Timeline is where the rollout's time went: its questions to the
	// servers before and after, and each batch.
	Timeline Timeline `json:"timeline"`
	// Capacity is each balancer node's fewest servers in service through
	// the rollout, from its own log (FewestIn), the instant measured from
	// the rollout's start. CapacityRequired is the fewest the verdict
	// allows (capacityFloor), where the scenario is judged on it.
	Capacity         []NodeLow `json:"capacity,omitempty"`
	CapacityRequired int       `json:"capacity_required,omitempty"`
	// Table is the rollout's own final table.
	Table   string `json:"rollout_table"`
	Verdict string `json:"verdict"`
	Error   string `json:"error,omitempty"`
}

// FleetReport is the fleet rehearsal: a row per scenario and the deploys'
// counts.
type FleetReport struct {
	Date           string     `json:"date"`
	Servers        int        `json:"servers"`
	MaxUnavailable int        `json:"max_unavailable"`
	Rows           []FleetRow `json:"rows"`
	Report         Report     `json:"report"`
}

// Failed reports whether any scenario did not pass.
func (r FleetReport) Failed() bool {
	for _, row := range r.Rows {
		if row.Verdict != "pass" {
			return true
		}
	}
	return len(r.Rows) == 0
}

// fleetCase is one scenario: its fault (none for the batched one) and what
// it must show.
type fleetCase struct {
	name     string
	fault    hooks.Fault
	expected string
}

// fleetCases are the scenarios in the order they run.
func fleetCases() []fleetCase {
	return []fleetCase{
		{FleetBatched, "", "no 502, no 504, every server on the release and verified, no rollback, no node ever routing to fewer servers than required"},
		{FleetNeverHealthy, hooks.FaultNeverHealthy,
			"the canary's deploy fails (api never healthy), it alone is rolled back, no other server touched; no 502, no 504, every server verified on the old release"},
		{FleetCrashes, hooks.FaultCrashes,
			"the canary's deploy fails (api crashed once), it alone is rolled back, no other server touched; no 502, no 504, every server verified on the old release"},
	}
}

// capacityFloor is the fewest servers a balancer node may route to during
// a rollout of k servers at max-unavailable n: today's design takes each
// batch out of service, so k − n (the canary, a batch of one, k − 1). The
// slots design (docs/capacity.md) keeps every server in service: k.
func capacityFloor(k, n int) int {
	return k - n
}

// fleetN reads c.MaxUnavailable as the fleet rehearsal takes it: a count
// (Validate checks it as the rollout does).
func (c Config) fleetN() (int, error) {
	n, err := strconv.Atoi(c.MaxUnavailable)
	if err != nil {
		return 0, fieldErr("MaxUnavailable", "%q must be a count for the fleet rehearsal", c.MaxUnavailable)
	}
	return n, nil
}

// crashAfter is when FleetCrashes' api crashes: after Docker's first check
// has called it healthy, and before a balancer node can have admitted it
// (HealthyThreshold passes, the first no sooner than the api listens), so no
// request is in flight to it when it dies. A crash the balancer saw would
// be 502s, which is what a canary is for, but not what this scenario
// judges.
func crashAfter(t infra.Timing) (time.Duration, error) {
	admitted := time.Duration(t.HealthyThreshold-1) * t.HealthCheckInterval
	window := admitted - t.ContainerHealthInterval
	if window < 500*time.Millisecond {
		return 0, fmt.Errorf("%s: at this scale a node may admit the api (after %v) within half a second of Docker's first health check (after %v): no crash fits between; rehearse it at a scale of 0.4 or more",
			FleetCrashes, admitted, t.ContainerHealthInterval)
	}
	return t.ContainerHealthInterval + window/2, nil
}

// ValidateFleet reports every reason c cannot rehearse the fleet, before
// anything runs.
func (c Config) ValidateFleet() error {
	_, _, _, err := c.fleet()
	return err
}

// fleet is c as the fleet rehearsal runs it, its scenarios' profiles, and
// where their steps leave the rollout's facts for the judge, by profile.
func (c Config) fleet() (Config, []Profile, map[string]*fleetStep, error) {
	// Each scenario rolls out once, and rolls back at most once.
	c.Profiles, c.Deploys = []string{ProfileProd}, 2
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SSH {
		errs = append(errs, errors.New("rehearsal config: the fleet rehearsal builds broken releases itself; it does not run over ssh"))
	}
	n, err := c.fleetN()
	if err != nil {
		errs = append(errs, err)
	}
	profiles, err := Profiles(c.Scale, ProfileProd)
	if err != nil {
		return c, nil, nil, errors.Join(append(errs, err)...)
	}
	prod := profiles[0]
	var delay time.Duration
	if delay, err = crashAfter(prod.Timing); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return c, nil, nil, err
	}
	var out []Profile
	facts := map[string]*fleetStep{}
	for _, fc := range fleetCases() {
		p := prod
		p.Name = fc.name
		facts[fc.name] = &fleetStep{}
		p.steps = fc.steps(n, delay, facts[fc.name])
		out = append(out, p)
	}
	return c, out, facts, nil
}

// RunFleet rehearses the fleet scenarios, one after the other on fresh
// servers and nodes, with c's servers, MaxUnavailable, rate and scale, and
// judges each.
func RunFleet(ctx context.Context, c Config) (FleetReport, error) {
	c, profiles, facts, err := c.fleet()
	if err != nil {
		return FleetReport{}, err
	}
	n, _ := c.fleetN()
	required := capacityFloor(c.Servers, n)
	rep := FleetReport{Date: time.Now().UTC().Format("2006-01-02"), Servers: c.Servers, MaxUnavailable: n}
	r, runErrs := c.run(ctx, profiles, true)
	rep.Report = r
	for i, fc := range fleetCases() {
		var pr *ProfileReport
		if i < len(r.Profiles) {
			pr = &r.Profiles[i]
		}
		rep.Rows = append(rep.Rows, fc.judge(pr, profileErr(runErrs, fc.name), facts[fc.name], profiles[i].Timing, c.Servers, n, required))
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	if len(r.Profiles) == 0 {
		return rep, errors.Join(runErrs...)
	}
	return rep, nil
}

// fleetStep is the one row a scenario's steps report, with what the
// rollout printed and how long it took.
type fleetStep struct {
	seconds float64
	output  string
	// rolledBack counts the servers the rollout rolled back.
	rolledBack int
	// rolloutErr is how the rollout ended.
	rolloutErr error
	// timeline is where the rollout's time went.
	timeline Timeline
	// capacity is each node's fewest servers in service from the
	// rollout's start to its end.
	capacity []NodeLow
}

// steps rolls the scenario's release out once with -max-unavailable n.
func (fc fleetCase) steps(n int, delay time.Duration, st *fleetStep) func(context.Context, *fleet) ([]DeployReport, error) {
	return func(ctx context.Context, f *fleet) ([]DeployReport, error) {
		t := f.p.Timing
		old := f.version
		version := f.id + "-" + f.p.Name
		dr := DeployReport{Deploy: 1, Version: version, ServerDeployMin: t.ServerDeployMin().Seconds()}
		var err error
		if fc.fault == "" {
			err = f.img.tag(ctx, version)
		} else {
			err = f.img.broken(ctx, version, fc.fault, delay)
			// What every server must run when the rollout is done.
			dr.Version = old
			dr.Step = fmt.Sprintf("rollout of %s (api %s), rolled back", version, fc.fault)
		}
		if err != nil {
			return []DeployReport{dr}, err
		}
		names := map[string]string{}
		for _, s := range f.servers {
			names[s.addr] = s.name
		}
		err = observe(ctx, &dr, f.servers, f.lbs, f.load, t, fc.fault == "", func() error {
			start := time.Now()
			dr.HookSeconds, dr.ServerSeconds, st.rolloutErr = f.ro.run(ctx, version, n)
			st.seconds = time.Since(start).Seconds()
			// Read at the rollout's end: what follows (verification) is
			// not the rollout's.
			st.capacity = FewestIn(f.lbs, names, start)
			st.output = f.ro.lastOutput()
			st.rolledBack = f.ro.rolledBack()
			st.timeline = f.ro.lastTimeline()
			if fc.fault == "" {
				return st.rolloutErr
			}
			if st.rolloutErr == nil {
				return fmt.Errorf("the rollout of %s, whose api %s, succeeded", version, fc.fault)
			}
			return nil
		})
		if err == nil && fc.fault == "" {
			f.version = version
		}
		f.c.logf("%s: %d requests, %d 2xx, %d 502, %d 503, %d 504, %d client errors; rollout %.2fs, %d rolled back",
			f.p.Name, dr.Requests, dr.OK, dr.BadGateway, dr.Unavailable, dr.Timeout, dr.ClientErrors, st.seconds, st.rolledBack)
		return []DeployReport{dr}, err
	}
}

// judge says whether the scenario showed what it must. required is the
// fewest servers any node may route to during the batched rollout; the
// broken releases' capacity is reported, not judged.
func (fc fleetCase) judge(pr *ProfileReport, runErr error, st *fleetStep, t infra.Timing, k, n, required int) FleetRow {
	row := FleetRow{Scenario: fc.name, Expected: fc.expected, Verdict: "FAIL"}
	if runErr != nil {
		row.Error = runErr.Error()
	}
	if pr == nil || len(pr.Deploys) == 0 {
		row.Observed = "did not run"
		return row
	}
	dr := pr.Deploys[0]
	row.RolloutSeconds = st.seconds
	row.Batches = infra.RolloutBatches(k, n)
	row.RolloutMinSeconds = t.RolloutMin(k, n).Seconds()
	row.CeilSeconds = math.Ceil(float64(k)/float64(n)) * t.ServerDeployMin().Seconds()
	row.Table = finalTable(st.output)
	row.Timeline = st.timeline
	row.Capacity = st.capacity
	untouched := strings.Count(row.Table, "not started")
	observed := fmt.Sprintf("%d 502, %d 504 in %d requests; verified %s on %s", dr.BadGateway, dr.Timeout, dr.Requests, yesNo(dr.Verified), dr.Version)
	ok := runErr == nil && dr.ReachedNothing() == 0 && dr.Verified
	if fc.fault == "" {
		observed += fmt.Sprintf("; rollout %.1fs = %.2f× RolloutMin (%d batches × ServerDeployMin %.1fs), %.2f× ⌈K/N⌉ × ServerDeployMin; %d rolled back",
			st.seconds, st.seconds/row.RolloutMinSeconds, row.Batches, dr.ServerDeployMin, st.seconds/row.CeilSeconds, st.rolledBack)
		if len(st.timeline.BatchesSeconds) > 0 {
			observed += "; " + st.timeline.String()
		}
		ok = ok && st.rolloutErr == nil && st.rolledBack == 0 && len(dr.ServerSeconds) == k
		row.CapacityRequired = required
		if line := capacityLine(st.capacity); line != "" {
			observed += fmt.Sprintf("; %s, at least %d required", line, required)
		}
		if short := capacityShort(st.capacity, required); short != "" {
			observed += "; " + short
			ok = false
		}
	} else {
		failed := "succeeded"
		if st.rolloutErr != nil {
			failed = "failed"
		}
		observed += fmt.Sprintf("; rollout %s, %d rolled back, %d not started, %.1fs", failed, st.rolledBack, untouched, st.seconds)
		ok = ok && st.rolloutErr != nil && st.rolledBack == 1 && untouched == k-1
		if line := capacityLine(st.capacity); line != "" {
			observed += "; " + line
		}
	}
	row.Observed = observed
	if ok {
		row.Verdict = "pass"
	}
	return row
}

// capacityLine is the nodes' minimums in one line: the fewest servers any
// node routed to, and each node's own fewest, when and which were out.
func capacityLine(lows []NodeLow) string {
	if len(lows) == 0 {
		return ""
	}
	fewest := lows[0]
	var nodes []string
	for _, l := range lows {
		if l.Fewest < fewest.Fewest {
			fewest = l
		}
		if len(l.Out) == 0 {
			nodes = append(nodes, fmt.Sprintf("%s %d throughout", l.Node, l.Fewest))
			continue
		}
		nodes = append(nodes, fmt.Sprintf("%s %d at +%.2fs: %s out", l.Node, l.Fewest, l.AtSeconds, strings.Join(l.Out, ", ")))
	}
	return fmt.Sprintf("capacity: every node routed to at least %d of %d servers (%s)", fewest.Fewest, fewest.Servers, strings.Join(nodes, "; "))
}

// capacityShort names every node that routed to fewer than required
// servers, with the instant and the servers out; empty when none did. No
// measurement is a failure: the rule would go unchecked.
func capacityShort(lows []NodeLow, required int) string {
	if len(lows) == 0 {
		return "CAPACITY NOT MEASURED: no node's log was read"
	}
	var short []string
	for _, l := range lows {
		if l.Fewest < required {
			short = append(short, fmt.Sprintf("%s routed to %d of %d servers at %s (+%.2fs), %s out",
				l.Node, l.Fewest, l.Servers, l.At.UTC().Format("15:04:05.000"), l.AtSeconds, strings.Join(l.Out, ", ")))
		}
	}
	if len(short) == 0 {
		return ""
	}
	return fmt.Sprintf("CAPACITY BELOW %d: %s", required, strings.Join(short, "; "))
}

// finalTable is the rollout's final table from its output: the lines from
// its header on.
func finalTable(out string) string {
	i := strings.LastIndex(out, "release before")
	if i < 0 {
		return ""
	}
	out = out[strings.LastIndex(out[:i], "\n")+1:]
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		// The rollout's own log lines start with a time stamp.
		if l == "" || (len(l) > 4 && l[4] == '-' && strings.Contains(l, " rollout: ")) {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// WriteTable writes the fleet rehearsal as text: a row per scenario, and
// each rollout's own table.
func (r FleetReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Fleet rollouts, %s: %d servers, -max-unavailable %d after a canary of one, up to %d requests/s, every duration × %g, %s.\n",
		r.Date, r.Servers, r.MaxUnavailable, r.Report.Rate, r.Report.Scale, r.Report.Balancer)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\texpected\tobserved\tverdict")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", row.Scenario, row.Expected, row.Observed, row.Verdict)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write fleet report: %w", err)
	}
	for _, row := range r.Rows {
		if row.Error != "" {
			fmt.Fprintf(&b, "  %s stopped: %s\n", row.Scenario, firstLine(row.Error))
		}
		if row.Table != "" {
			fmt.Fprintf(&b, "%s, the rollout's table:\n", row.Scenario)
			for _, l := range strings.Split(row.Table, "\n") {
				fmt.Fprintf(&b, "  %s\n", l)
			}
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write fleet report: %w", err)
	}
	return nil
}

// WriteJSON writes the fleet rehearsal as JSON.
func (r FleetReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write fleet report: %w", err)
	}
	return nil
}
