package rehearsal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// CountingNote says what the columns count, in the article's terms.
const CountingNote = "502 and 504 are requests that reached nothing: the balancer sent them to a server that was not listening, or got no answer. " +
	"503 is the balancer having no healthy server at all. " +
	"A draining server's own 503s on the health endpoint are not counted and never seen here: the load asks only real routes through the balancers, never the health endpoint."

// Report is a whole rehearsal.
type Report struct {
	Servers int     `json:"servers"`
	Deploys int     `json:"deploys"`
	Rate    int     `json:"rate_per_second"`
	Scale   float64 `json:"scale"`
	Path    string  `json:"path"`
	// Balancer is the balancer nodes' version.
	Balancer string          `json:"balancer"`
	Note     string          `json:"note"`
	Profiles []ProfileReport `json:"profiles"`
}

// ProfileReport is every deploy of one profile.
type ProfileReport struct {
	Profile string `json:"profile"`
	// Timing is the scaled timing that ran, durations in seconds.
	Timing TimingSummary `json:"timing"`
	// Violations are the rules the unscaled timing breaks.
	Violations []string `json:"violations,omitempty"`
	// IdleDownSeconds is, in a slots profile, how long after its nodes
	// started every node had every idle slot down.
	IdleDownSeconds float64        `json:"idle_down_s,omitempty"`
	Deploys         []DeployReport `json:"deploys"`
	Total           DeployReport   `json:"total"`
	// Errors are the distinct client errors and unexpected statuses seen.
	Errors map[string]int64 `json:"errors,omitempty"`
	// ByMethod is what the load saw over the whole profile, per method.
	ByMethod map[string]Counts `json:"by_method"`
	// Balancers is what the balancer nodes' own logs say, per method, each
	// answer classified as the ALB would have answered it.
	Balancers map[string]Counts `json:"balancer_logs"`
	// CrossCheck lists every disagreement between the nodes' logs and the
	// load, and every answer a node sent differently from the ALB.
	CrossCheck []string `json:"cross_check,omitempty"`
	// Terminations counts the nodes' answers per HAProxy termination state
	// ("--" normal, "SC" refused, "SH" closed with the request outstanding).
	Terminations map[string]int64 `json:"terminations"`
	// LaggingNodes are the nodes that acted Lag seconds after the servers
	// answered their checks; NamedNodes says every node named itself in
	// its checks (NodeOptions).
	LaggingNodes []string `json:"lagging_nodes,omitempty"`
	Lag          float64  `json:"lag_s,omitempty"`
	NamedNodes   bool     `json:"named_nodes,omitempty"`
}

// TimingSummary is the part of a timing a reader needs to judge a run.
type TimingSummary struct {
	Drain              float64 `json:"drain_s"`
	CheckInterval      float64 `json:"check_interval_s"`
	CheckTimeout       float64 `json:"check_timeout_s"`
	UnhealthyThreshold int     `json:"unhealthy_threshold"`
	HealthyThreshold   int     `json:"healthy_threshold"`
	WorstCaseDetection float64 `json:"worst_case_detection_s"`
	Reentry            float64 `json:"reentry_s"`
	StopGracePeriod    float64 `json:"stop_grace_period_s"`
	WatchdogInterval   float64 `json:"watchdog_interval_s"`
	ServerDeployMin    float64 `json:"server_deploy_min_s"`
}

// DeployReport is one rolling deploy across every server, or the total of a
// profile's deploys.
type DeployReport struct {
	// Deploy is the deploy's number, from 1; 0 in a total.
	Deploy  int    `json:"deploy,omitempty"`
	Version string `json:"version,omitempty"`
	// Step says what the row did when it is not a deploy of Version (a
	// transition's steps); Version is then what every server runs after it.
	Step string `json:"step,omitempty"`
	Counts
	// ByMethod splits Counts per method.
	ByMethod map[string]Counts `json:"by_method,omitempty"`
	// ServerSeconds are the seconds each server's deploy took, from the
	// deploy hook's start until every balancer node had it back in service.
	ServerSeconds []float64 `json:"server_seconds"`
	// HookSeconds are the seconds each server's deploy hook ran: the rest of
	// ServerSeconds is waiting for the balancer nodes to take it back.
	HookSeconds []float64 `json:"hook_seconds"`
	// ServerDeployMin is Timing.ServerDeployMin in seconds: drain + re-entry.
	ServerDeployMin float64 `json:"server_deploy_min_s"`
	// TakenOut counts, over servers and balancer nodes, the times a node took
	// a deploying server out of rotation: with a working drain, every node,
	// every server.
	TakenOut int `json:"taken_out"`
	// NotTakenOut names each node/server pair where the node never took the
	// deploying server out: with a working drain there is none. A node may
	// also take a server out once more when a check of a busy host misses
	// its timeout; that costs capacity, never a request, so TakenOut may
	// exceed servers × nodes.
	NotTakenOut []string `json:"not_taken_out,omitempty"`
	// LateOut names each node/server pair where the node took the server
	// out only once its listener had closed (a check refused or reset), not
	// on its drain's 503 (HostHealth.LateOuts): the node was late, whether
	// or not a request fell in the gap.
	LateOut []string `json:"late_out,omitempty"`
	// BadGatewayBy counts the 502s per node/server pair ("lb1/s2"), from the
	// nodes' logs: which node sent to which server after its listener
	// closed.
	BadGatewayBy map[string]int64 `json:"502_by_node_server,omitempty"`
	// Drains are how each server's old api ended its drain, as its deploy
	// logged it from the drain library's own line, in server order; empty
	// for servers deployed over ssh (the rehearsal does not read their
	// logs back).
	Drains []DrainEnd `json:"drains,omitempty"`
	// WatchdogRuns and WatchdogRestarts are the watchdog's runs on every
	// server during the deploy and the services it restarted.
	WatchdogRuns     int `json:"watchdog_runs"`
	WatchdogRestarts int `json:"watchdog_restarts"`
	// Verified is whether every service on every server answered with its
	// role and the new version after the deploy; Problems says what did not.
	Verified bool     `json:"verified"`
	Problems []string `json:"problems,omitempty"`
}

// MeanServerSeconds is the mean of ServerSeconds, 0 when empty.
func (d DeployReport) MeanServerSeconds() float64 {
	if len(d.ServerSeconds) == 0 {
		return 0
	}
	var sum float64
	for _, s := range d.ServerSeconds {
		sum += s
	}
	return sum / float64(len(d.ServerSeconds))
}

// Ratio is the mean per-server deploy time over the theoretical minimum.
func (d DeployReport) Ratio() float64 {
	if d.ServerDeployMin == 0 {
		return 0
	}
	return d.MeanServerSeconds() / d.ServerDeployMin
}

// DrainEnd is how one server's old api ended its drain.
type DrainEnd struct {
	Server  string  `json:"server"`
	Seconds float64 `json:"seconds"`
	// Reason is the rule that ended it, in the drain library's words
	// (drain.ReasonEvidence, drain.ReasonDrainElapsed, …).
	Reason string `json:"reason"`
}

// drainSummary is one line on the drains: their mean length and how many
// each rule ended.
func drainSummary(ds []DrainEnd) string {
	if len(ds) == 0 {
		return ""
	}
	var sum float64
	by := map[string]int{}
	for _, d := range ds {
		sum += d.Seconds
		by[d.Reason]++
	}
	reasons := make([]string, 0, len(by))
	for r := range by {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	parts := make([]string, 0, len(reasons))
	for _, r := range reasons {
		parts = append(parts, fmt.Sprintf("%d by %q", by[r], r))
	}
	return fmt.Sprintf("the old api drained %.2fs on average (%d drains): ended %s", sum/float64(len(ds)), len(ds), strings.Join(parts, ", "))
}

// MarshalJSON adds the derived mean and ratio, so JSON readers need not
// recompute them.
func (d DeployReport) MarshalJSON() ([]byte, error) {
	type plain DeployReport
	return json.Marshal(struct {
		plain
		Mean  float64 `json:"server_seconds_mean"`
		Ratio float64 `json:"ratio_to_min"`
	}{plain(d), round3(d.MeanServerSeconds()), round3(d.Ratio())})
}

func round3(f float64) float64 {
	return float64(int64(f*1000+0.5)) / 1000
}

// total sums deploys into one row.
func total(deploys []DeployReport) DeployReport {
	t := DeployReport{Verified: len(deploys) > 0}
	for _, d := range deploys {
		t.Counts = t.Counts.Add(d.Counts)
		t.ByMethod = sumByMethod(t.ByMethod, d.ByMethod)
		t.ServerSeconds = append(t.ServerSeconds, d.ServerSeconds...)
		t.HookSeconds = append(t.HookSeconds, d.HookSeconds...)
		t.Drains = append(t.Drains, d.Drains...)
		t.ServerDeployMin = d.ServerDeployMin
		t.TakenOut += d.TakenOut
		t.LateOut = append(t.LateOut, d.LateOut...)
		for k, v := range d.BadGatewayBy {
			if t.BadGatewayBy == nil {
				t.BadGatewayBy = map[string]int64{}
			}
			t.BadGatewayBy[k] += v
		}
		t.WatchdogRuns += d.WatchdogRuns
		t.WatchdogRestarts += d.WatchdogRestarts
		t.Verified = t.Verified && d.Verified
	}
	return t
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// WriteJSON writes r as indented JSON.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// WriteTable writes r as a table per profile, a row per deploy and a total.
func (r Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Rehearsal: %d servers, %d deploys per profile, up to %d requests/s of GET and POST %s (short and long, with quiet spells) through 2 balancer nodes (%s), every duration × %g.\n",
		r.Servers, r.Deploys, r.Rate, r.Path, r.Balancer, r.Scale)
	fmt.Fprintf(&b, "%s\n", wrap(r.Note, 100))
	for _, p := range r.Profiles {
		tm := p.Timing
		fmt.Fprintf(&b, "\nprofile %s: drain %gs; checks every %gs (timeout %gs), out after %d failures (worst case %gs), in after %d passes (%gs); minimum per server %gs\n",
			p.Profile, tm.Drain, tm.CheckInterval, tm.CheckTimeout, tm.UnhealthyThreshold, tm.WorstCaseDetection,
			tm.HealthyThreshold, tm.Reentry, tm.ServerDeployMin)
		for _, v := range p.Violations {
			fmt.Fprintf(&b, "  breaks %s\n", v)
		}
		if len(p.LaggingNodes) > 0 {
			fmt.Fprintf(&b, "  %s acts %gs after the servers answer its checks\n", strings.Join(p.LaggingNodes, ", "), p.Lag)
		}
		if p.NamedNodes {
			b.WriteString("  every node names itself in its checks\n")
		}
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "deploy\trequests\t2xx\t502\t503\t504\tother\tclient errors\ts/server\t× min\ttaken out\twatchdog runs\twatchdog restarts\tverified\t")
		row := func(label string, d DeployReport) {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.2f\t%d\t%d\t%d\t%s\t\n",
				label, d.Requests, d.OK, d.BadGateway, d.Unavailable, d.Timeout, d.OtherStatus, d.ClientErrors,
				d.MeanServerSeconds(), d.Ratio(), d.TakenOut, d.WatchdogRuns, d.WatchdogRestarts, yesNo(d.Verified))
		}
		for _, d := range p.Deploys {
			row(fmt.Sprint(d.Deploy), d)
		}
		row("total", p.Total)
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		for _, side := range []struct {
			label string
			m     map[string]Counts
		}{{"the load saw", p.ByMethod}, {"the balancer nodes logged, as the ALB would answer", p.Balancers}} {
			if len(side.m) == 0 {
				continue
			}
			var parts []string
			for _, m := range methods(side.m) {
				c := side.m[m]
				parts = append(parts, fmt.Sprintf("%s %d (%d 2xx, %d 502, %d 503, %d 504, %d client errors)",
					m, c.Requests, c.OK, c.BadGateway, c.Unavailable, c.Timeout, c.ClientErrors))
			}
			fmt.Fprintf(&b, "  %s: %s\n", side.label, strings.Join(parts, "; "))
		}
		if line := drainSummary(p.Total.Drains); line != "" {
			fmt.Fprintf(&b, "  %s\n", line)
		}
		for _, pr := range p.CrossCheck {
			fmt.Fprintf(&b, "  CROSS-CHECK: %s\n", pr)
		}
		if p.Total.Skipped > 0 {
			fmt.Fprintf(&b, "  the load generator fell %d requests short of the rate (every connection busy)\n", p.Total.Skipped)
		}
		for _, d := range p.Deploys {
			for _, pr := range d.Problems {
				fmt.Fprintf(&b, "  deploy %d: %s\n", d.Deploy, pr)
			}
		}
		keys := make([]string, 0, len(p.Errors))
		for k := range p.Errors {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "  %d× %s\n", p.Errors[k], k)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// wrap breaks s into lines of at most width characters, on spaces.
func wrap(s string, width int) string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// Check reports every way r falls short of what the rehearsal proves: prod
// has no 502 or 504 in any deploy, every service verified on every server
// after each deploy, and no watchdog restart; before reproduces the bug with
// at least one 502. A profile whose deploys did not all run fails too.
func (r Report) Check() error {
	var errs []error
	for _, p := range r.Profiles {
		if len(p.Deploys) != r.Deploys {
			errs = append(errs, fmt.Errorf("%s: %d of %d deploys ran", p.Profile, len(p.Deploys), r.Deploys))
		}
		for _, pr := range p.CrossCheck {
			errs = append(errs, fmt.Errorf("%s: the balancer logs and the load disagree: %s", p.Profile, pr))
		}
		switch p.Profile {
		case ProfileProd, ProfileEvidence:
			for _, d := range p.Deploys {
				if d.BadGateway != 0 || d.Timeout != 0 {
					errs = append(errs, fmt.Errorf("%s deploy %d: %d 502 and %d 504: requests reached nothing", p.Profile, d.Deploy, d.BadGateway, d.Timeout))
				}
				if !d.Verified {
					errs = append(errs, fmt.Errorf("%s deploy %d: not every service verified on every server: %s", p.Profile, d.Deploy, strings.Join(d.Problems, "; ")))
				}
				if d.WatchdogRestarts != 0 {
					errs = append(errs, fmt.Errorf("%s deploy %d: the watchdog restarted %d service(s) during the deploy", p.Profile, d.Deploy, d.WatchdogRestarts))
				}
			}
		case ProfileBefore:
			if p.Total.BadGateway == 0 {
				errs = append(errs, fmt.Errorf("before: no 502 in %d deploys: the old setup's bug was not reproduced, so the rehearsal cannot tell a fix from luck", len(p.Deploys)))
			}
		}
	}
	return errors.Join(errs...)
}
