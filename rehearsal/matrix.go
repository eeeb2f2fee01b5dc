package rehearsal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mythex/infra/infra"
)

// The invariant matrix carries the timing gate's mutation test to the real
// system: for each relation of the contract a rehearsal can exercise, a
// profile derived from prod that breaks that relation and as little else as
// possible, and the symptom users would see, observed in the same run.

// Case is one row of the matrix.
type Case struct {
	// Profile names the row's profile.
	Profile string
	// Breaks are the relations the profile breaks; none for prod.
	Breaks []infra.Rule
	// Nodes is how the row's balancer nodes differ from ALB nodes that act
	// on their checks at once; the zero value: they do not.
	Nodes NodeBehaviour
	// Expected is the symptom users would see.
	Expected string
	// Clean: the row passes when it shows no symptom at all (prod; a
	// lagging balancer the evidence drain waits out), and runs without an
	// error or a disagreement between the load and the nodes' logs. Else
	// it passes when it shows its symptom.
	Clean bool
	// timing derives the profile's unscaled timing from prod.
	timing func() infra.Timing
	// observe says what the run showed and whether it is the symptom.
	observe func(ProfileReport) (observed string, shown bool)
}

// NodeBehaviour is how a row's balancer nodes differ from ALB nodes that
// act on their checks at once.
type NodeBehaviour struct {
	// Lag: the last node acts on each check's answer this long after the
	// server gave it (NodeOptions.Lag), at production timing; the row's
	// scale scales it with the rest.
	Lag time.Duration
	// Named: every node names itself in its checks (NodeOptions.Named), so
	// the servers tell them apart and the evidence drain may end a drain on
	// their checks.
	Named bool
}

// The rows' numbers, each the smallest change that breaks its relation at
// the default scale (StopGracePeriod stays whole seconds scaled by 0.2).
const (
	// Docker kills before the 15 s drain is over.
	brokenStopGrace = 10 * time.Second
	// The app closes idle connections long before the balancer's 60 s:
	// every few requests race a close. The app's request deadlines follow
	// its keep-alive (Timing.RequestDeadline), so a keep-alive this short
	// also breaks deadline-covers-shutdown; one just above ShutdownTimeout
	// would break keepalive-outlasts-idle alone but close too few idle
	// connections for the race to show in a short run.
	brokenKeepAlive = time.Second
	// Those deadlines must still outlast the longest request the app
	// allows, or the service refuses its configuration and never starts:
	// the short-keepalive row shortens MaxRequest below its keep-alive
	// (the load's long requests follow it, APIMix).
	brokenKeepAliveMaxRequest = brokenKeepAlive / 2
)

// observeClean says what a row that must lose nothing showed, and whether
// anything went wrong.
func observeClean(p ProfileReport) (string, bool) {
	bad := p.Total.BadGateway + p.Total.Timeout
	restarts := p.Total.WatchdogRestarts
	return fmt.Sprintf("%d 502, %d 504, verified %s, %d watchdog restarts", p.Total.BadGateway, p.Total.Timeout,
		yesNo(p.Total.Verified), restarts), bad != 0 || restarts != 0 || !p.Total.Verified
}

// MatrixCases are the matrix's rows, prod first.
func MatrixCases() []Case {
	return []Case{
		{
			Profile:  ProfileProd,
			Expected: "none: no 502, no 504, every service verified, no watchdog restart",
			Clean:    true,
			timing:   infra.Prod,
			observe:  observeClean,
		},
		{
			Profile:  "short-drain",
			Breaks:   beforeBreaks,
			Expected: "502s: a server stops listening while the balancer still sends to it",
			timing:   Before,
			observe: func(p ProfileReport) (string, bool) {
				return fmt.Sprintf("%d 502 in %d requests", p.Total.BadGateway, p.Total.Requests), p.Total.BadGateway > 0
			},
		},
		{
			Profile:  "short-keepalive",
			Breaks:   []infra.Rule{infra.RuleKeepAlive, infra.RuleDeadlineCoversCut},
			Expected: "502s on reused connections: the app closes a connection the balancer reuses (termination SH)",
			timing: func() infra.Timing {
				t := infra.Prod()
				t.AppKeepAlive = brokenKeepAlive
				t.MaxRequest = brokenKeepAliveMaxRequest
				return t
			},
			observe: func(p ProfileReport) (string, bool) {
				n := p.Terminations["SH"]
				// Terminations cover the whole run, the load before the first
				// deploy included; Total only the deploys.
				return fmt.Sprintf("%d answers the server cut with the request outstanding (SH) over the run; %d 502 during the deploys", n, p.Total.BadGateway), n > 0
			},
		},
		{
			Profile:  "short-grace",
			Breaks:   []infra.Rule{infra.RuleFitsGrace, infra.RuleMaxDrainFits},
			Expected: "old containers killed (exit 137) mid-drain, in-flight requests cut",
			timing: func() infra.Timing {
				t := infra.Prod()
				t.StopGracePeriod = brokenStopGrace
				return t
			},
			observe: func(p ProfileReport) (string, bool) {
				killed := 0
				for _, d := range p.Deploys {
					for _, pr := range d.Problems {
						killed += strings.Count(pr, "exited 137")
					}
				}
				return fmt.Sprintf("%d old containers exited 137; %d 502, %d client errors", killed, p.Total.BadGateway, p.Total.ClientErrors), killed > 0
			},
		},
	}
}

// The lagging-balancer rows: a balancer node slower than its numbers,
// which the contract cannot rule out (nobody outside AWS knows how soon an
// ALB node acts on a failed check), once with nodes the servers cannot
// tell apart, so the drain is the fixed one, and once with nodes that name
// themselves, so the evidence drain sees them.
const (
	LaggingFixedDrain = "lagging-balancer-fixed-drain"
	LaggingEvidence   = "lagging-balancer"
)

// nodeActs is how long after a responsive server's health turned a node
// that acts lag after each answer takes it out: on its UnhealthyThreshold-th
// failed check, the first of which comes within an interval of the turn and
// each further one an interval later; then lag.
func nodeActs(t infra.Timing, lag time.Duration) (earliest, latest time.Duration) {
	earliest = time.Duration(t.UnhealthyThreshold-1)*t.HealthCheckInterval + lag
	return earliest, earliest + t.HealthCheckInterval
}

// laggingGap is where a lagging node must act for the two rows to show
// what they are for: past the fixed drain (Drain), which then closes the
// listener while the node still sends, so its requests reach nothing; and
// before the evidence drain, which keeps serving while requests arrive,
// must stop at MaxDrain: the node's last requests arrive when it acts, and
// the drain ends DrainQuiet after them.
func laggingGap(t infra.Timing) (after, before time.Duration) {
	return t.Drain, t.MaxDrain - t.DrainQuiet
}

// LaggingLag is the lagging node's lag: its acting, one interval wide
// (nodeActs), centred in the gap between the drains (laggingGap). With
// production's numbers a node not lagging takes a server out 5 to 10 s
// after its health turned, the gap runs from the 15 s fixed drain to 24 s
// (the 25 s MaxDrain less the 1 s DrainQuiet), and a 12 s lag acts at 17
// to 22 s, 2 s inside either end.
func LaggingLag(t infra.Timing) time.Duration {
	earliest, latest := nodeActs(t, 0)
	after, before := laggingGap(t)
	return (after+before)/2 - (earliest+latest)/2
}

// LaggingCases are the lagging-balancer rows: prod's timing, the last node
// acting LaggingLag late, the load steady (its quiet spells run below the
// QuietRequests the evidence drain needs before a drain).
func LaggingCases() []Case {
	prod := infra.Prod()
	lag := LaggingLag(prod)
	earliest, latest := nodeActs(prod, lag)
	return []Case{
		{
			Profile: LaggingFixedDrain,
			Nodes:   NodeBehaviour{Lag: lag},
			Expected: fmt.Sprintf("502s from the lagging node: it takes a server out %v to %v after its health turned, past the %v fixed drain "+
				"(the servers cannot tell the nodes apart, so the drain is the fixed one)", earliest, latest, prod.Drain),
			timing:  infra.Prod,
			observe: observeLagging,
		},
		{
			Profile: LaggingEvidence,
			Nodes:   NodeBehaviour{Lag: lag, Named: true},
			Expected: fmt.Sprintf("none: no 502, no 504, every service verified: the nodes name themselves, and the evidence drain serves "+
				"the lagging node's requests until they stop (%v to %v), within MaxDrain %v", earliest, latest, prod.MaxDrain),
			Clean:   true,
			timing:  infra.Prod,
			observe: observeClean,
		},
	}
}

// observeLagging counts the 502s, and those the lagging nodes answered:
// the symptom is theirs.
func observeLagging(p ProfileReport) (string, bool) {
	var lagging int64
	for k, n := range p.Total.BadGatewayBy {
		node, _, _ := strings.Cut(k, "/")
		if slices.Contains(p.LaggingNodes, node) {
			lagging += n
		}
	}
	return fmt.Sprintf("%d 502 in %d requests, %d of them from the lagging node %s", p.Total.BadGateway, p.Total.Requests,
		lagging, strings.Join(p.LaggingNodes, ", ")), lagging > 0
}

// Unrehearsable says, for every relation no row breaks, why a rehearsal
// cannot show its symptom.
var Unrehearsable = map[infra.Rule]string{
	infra.RuleWatchdogTolerates: "the shared lock keeps the watchdog out of every deploy (it logs \"deploy in progress\" and checks nothing), so fewer strikes alone restart nothing in a deploy; the relation guards a planned stop the lock does not cover",
	infra.RuleTimeoutBelowInt:   "AWS refuses the target group at `pulumi up`: nothing is ever deployed with it",
	infra.RuleReentryShort:      "a slow re-entry costs deploy time, not requests: it shows as s/server, which every row reports",
	infra.RuleDowntimePlanned:   "MaxPlannedDowntime is a number the watchdog relation reads; it has no behaviour of its own",
	infra.RuleDeregCovers:       "the stand-in balancer has no deregistration: a DOWN server gets no new request at once",
	infra.RuleLockOutlasts:      "needs a watchdog restart holding the lock when a deploy starts; the rehearsal's watchdog restarts nothing in prod",
	infra.RuleHoldCoversSteps:   "a hold shorter than the steps cuts only a deploy whose steps run to their bounds (a registry that does not answer, a wedged engine); a sound deploy takes a fraction of every bound, so no load shows it. The hooks' TestDeployHoldCutsTheRun shows the cut",
	infra.RuleContainerFaster:   "Docker's health check only gates the deploy hook's own wait, which the rehearsal verifies on its own",
	infra.RuleStartCovers:       "a start timeout shorter than the first container check fails the first deploy on every server, before any load",
	infra.RuleHeaderBeforeCut:   "the load sends each request's headers at once: no client trickles them, so the header timeout never runs into a shutdown (drain's TestSlowHeaderDoesNotHoldTheShutdown shows it on loopback)",
	infra.RuleMaxDrainCovers:    "the drain library refuses a MaxDrain below Drain when the service starts (drain.Config.Validate): no service ever runs with it",
	infra.RuleQuietCoversSkew:   "the stand-in nodes reach the servers through Docker's userland proxy without naming themselves, so the servers cannot tell them apart and the evidence drain falls back to the fixed drain: a quiet window shorter than the skew never ends a drain here; the lagging-balancer row's nodes name themselves, but act at once on their checks or a whole lag late, never within a skew",
	infra.RuleHandoverCapacity:  "it binds the slots design (Slots 2), and the hooks and the rehearsal's servers run one slot until that design is built (docs/capacity.md): no deploy here hands over between slots",
	infra.RuleIdleCoversRequest: "the load's longest request is half the shutdown timeout, far inside the idle timeout; the balancer's 504 for a request past it is pinned by TestFidelity",
}

// MatrixRow is one row's result.
type MatrixRow struct {
	Profile  string   `json:"profile"`
	Breaks   []string `json:"breaks"`
	Expected string   `json:"expected"`
	Observed string   `json:"observed"`
	// Verdict is "pass" when prod shows no symptom or a broken profile shows
	// its own, else "FAIL".
	Verdict string `json:"verdict"`
	// Error is what stopped the row's run, if anything (a broken profile's
	// deploy may fail by design).
	Error string `json:"error,omitempty"`
}

// Matrix is a whole matrix run.
type Matrix struct {
	Date          string            `json:"date"`
	Rows          []MatrixRow       `json:"rows"`
	Unrehearsable map[string]string `json:"unrehearsable"`
	Report        Report            `json:"report"`
}

// Failed reports whether any row's verdict is not pass.
func (m Matrix) Failed() bool {
	for _, r := range m.Rows {
		if r.Verdict != "pass" {
			return true
		}
	}
	return len(m.Rows) == 0
}

// matrixProfiles scales every case's timing by f, and its nodes' lag with
// it. A row whose nodes differ from plain ones runs its load steady: its
// symptom is the nodes', and the evidence drain needs QuietRequests before
// a drain, which the load's quiet spells do not bring.
func matrixProfiles(f float64, cases []Case) ([]Profile, error) {
	var out []Profile
	for _, cs := range cases {
		base := cs.timing()
		if err := CheckScale(base, f); err != nil {
			return nil, fmt.Errorf("matrix row %s: %w", cs.Profile, err)
		}
		nodes := cs.Nodes
		nodes.Lag = time.Duration(math.Round(float64(nodes.Lag) * f))
		out = append(out, Profile{Name: cs.Profile, Unscaled: base, Timing: base.Scaled(f), Violations: base.Violations(), Breaks: cs.Breaks,
			nodes: nodes, steady: nodes != NodeBehaviour{}})
	}
	return out, nil
}

// matrixCases are the rows c runs: the matrix's, the lagging-balancer rows
// last.
func (c Config) matrixCases() []Case {
	return append(MatrixCases(), LaggingCases()...)
}

// ValidateMatrix reports every reason c cannot run the matrix, before
// anything runs.
func (c Config) ValidateMatrix() error {
	c.Profiles = []string{ProfileProd}
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Servers > 0 && c.Scale > 0 {
		// The evidence drain needs QuietRequests in the DrainQuiet before a
		// drain; the steady load brings each server its share of the rate.
		prod := infra.Prod()
		quiet := prod.Scaled(c.Scale).DrainQuiet
		if got := float64(c.Rate) / float64(c.Servers) * quiet.Seconds(); got < float64(prod.QuietRequests) {
			errs = append(errs, fmt.Errorf("rehearsal config: the %s row's evidence drain needs %d requests per server in the %v before a drain (QuietRequests in DrainQuiet); %d requests/s over %d servers bring %.1f: raise Rate to %d or run fewer servers",
				LaggingEvidence, prod.QuietRequests, quiet, c.Rate, c.Servers, got, int(math.Ceil(float64(prod.QuietRequests)*float64(c.Servers)/quiet.Seconds()))))
		}
	}
	return errors.Join(errs...)
}

// RunMatrix runs every row of the matrix with c's servers, deploys, rate and
// scale (c.Profiles is ignored) and judges each.
func RunMatrix(ctx context.Context, c Config) (Matrix, error) {
	if err := c.ValidateMatrix(); err != nil {
		return Matrix{}, err
	}
	c.Profiles = []string{ProfileProd}
	cases := c.matrixCases()
	profiles, err := matrixProfiles(c.Scale, cases)
	if err != nil {
		return Matrix{}, err
	}
	m := Matrix{Date: time.Now().UTC().Format("2006-01-02"), Unrehearsable: map[string]string{}}
	for r, why := range Unrehearsable {
		m.Unrehearsable[string(r)] = why
	}
	rep, errs := c.run(ctx, profiles, true)
	m.Report = rep
	for i, cs := range cases {
		var pr *ProfileReport
		if i < len(rep.Profiles) {
			pr = &rep.Profiles[i]
		}
		m.Rows = append(m.Rows, cs.judge(pr, profileErr(errs, cs.Profile)))
	}
	if ctx.Err() != nil {
		return m, ctx.Err()
	}
	return m, nil
}

// judge is the row's verdict on what its profile showed (nil: it did not
// run) and what stopped it.
func (cs Case) judge(pr *ProfileReport, runErr error) MatrixRow {
	row := MatrixRow{Profile: cs.Profile, Expected: cs.Expected, Verdict: "FAIL"}
	for _, b := range cs.Breaks {
		row.Breaks = append(row.Breaks, string(b))
	}
	if runErr != nil {
		row.Error = runErr.Error()
	}
	if pr == nil {
		row.Observed = "not run"
		return row
	}
	obs, shown := cs.observe(*pr)
	row.Observed = obs
	ok := shown
	if cs.Clean {
		ok = !shown && row.Error == "" && len(pr.CrossCheck) == 0
	}
	if ok {
		row.Verdict = "pass"
	}
	return row
}

// WriteTable writes m as a table, a row per profile, then why the other
// relations are not rehearsed.
func (m Matrix) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Invariant matrix, %s: %d servers, %d deploys per profile, up to %d requests/s, every duration × %g, %s.\n",
		m.Date, m.Report.Servers, m.Report.Deploys, m.Report.Rate, m.Report.Scale, m.Report.Balancer)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "profile\trelation broken\tsymptom expected\tsymptom observed\tverdict")
	for _, r := range m.Rows {
		breaks := strings.Join(r.Breaks, ", ")
		if breaks == "" {
			breaks = "none"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Profile, breaks, r.Expected, r.Observed, r.Verdict)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write matrix: %w", err)
	}
	for _, r := range m.Rows {
		if r.Error != "" {
			fmt.Fprintf(&b, "  %s stopped: %s\n", r.Profile, firstLine(r.Error))
		}
	}
	fmt.Fprintln(&b, "Not rehearsed:")
	for _, r := range sortedRules(m.Unrehearsable) {
		fmt.Fprintf(&b, "  %s: %s\n", r, m.Unrehearsable[r])
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write matrix: %w", err)
	}
	return nil
}

// WriteJSON writes m as indented JSON.
func (m Matrix) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(m); err != nil {
		return fmt.Errorf("write matrix: %w", err)
	}
	return nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func sortedRules(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
