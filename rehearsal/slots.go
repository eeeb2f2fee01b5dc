package rehearsal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
)

// The slots prototype measures the slots design (docs/capacity.md) before
// the hooks run it: each simulated server is two of today's servers, two
// compose projects on two ports behind every balancer node, one live and
// one idle. A swap deploys the new release into the idle slot with today's
// deploy hook (stage, start, healthy, verify, the settle watch), then hands
// over: the live slot's containers are stopped, and its api drains by the
// handshake as it does today. The rollout is a canary, then every other
// server at once: nothing leaves service, so nothing limits a batch.
const (
	// SlotsSwap swaps a good release in on every server.
	SlotsSwap = "slots-swap"
	// SlotsNeverHealthy swaps in a release whose api never becomes
	// healthy; SlotsCrashes one whose api starts healthy and crashes a
	// moment later. The canary must catch each in its idle slot, whose
	// containers then go: the live slot never left.
	SlotsNeverHealthy = "slots-never-healthy"
	SlotsCrashes      = "slots-crashes"
	// DefaultSlotsServers is the fleet the slots design's time goal names.
	DefaultSlotsServers = 4
)

// slotsCase is one scenario of the prototype.
type slotsCase struct {
	name     string
	fault    hooks.Fault
	expected string
}

func slotsCases() []slotsCase {
	return []slotsCase{
		{SlotsSwap, "", "no 502, no 504, every server swapped onto the release and verified, every node routing to every server throughout, every old slot's containers exiting 0"},
		{SlotsNeverHealthy, hooks.FaultNeverHealthy, "the canary's idle slot fails its deploy (api never healthy) and is removed, no other server touched; no 502, no 504, every server verified on the old release, every node routing to every server throughout"},
		{SlotsCrashes, hooks.FaultCrashes, "the canary's idle slot fails its deploy (api crashed once) and is removed, no other server touched; no 502, no 504, every server verified on the old release, every node routing to every server throughout"},
	}
}

// SlotSwap is one server's swap as the prototype measured it.
type SlotSwap struct {
	Server string `json:"server"`
	// Batch is the swap's batch: 1, the canary; 2, every other server.
	Batch int `json:"batch"`
	// HookSeconds is the idle slot's deploy hook: staging, the start,
	// Docker's checks, verification and the settle watch.
	HookSeconds float64 `json:"hook_s"`
	// AdmittedSeconds is when, after the hook's start, the last balancer
	// node routed to the new slot; negative when one never did.
	AdmittedSeconds float64 `json:"admitted_s"`
	// StopSeconds is the old slot's stop: its drain, its in-flight
	// requests and its exit.
	StopSeconds float64 `json:"stop_s"`
	// Seconds is the whole swap, the hook's start to the old slot's exit.
	Seconds float64 `json:"swap_s"`
	// Exits are the old slot's containers' exit codes, by service.
	Exits map[string]int `json:"exits"`
	// OverlapMiB is both slots' containers' memory while both run, as
	// docker stats reads it once the new slot is up.
	OverlapMiB float64 `json:"overlap_mib"`
}

// SlotsReport is the prototype: a row per scenario.
type SlotsReport struct {
	Date    string     `json:"date"`
	Servers int        `json:"servers"`
	Rows    []SlotsRow `json:"rows"`
	Report  Report     `json:"report"`
}

// Failed reports whether any scenario did not pass.
func (r SlotsReport) Failed() bool {
	for _, row := range r.Rows {
		if row.Verdict != "pass" {
			return true
		}
	}
	return len(r.Rows) == 0
}

// SlotsRow is one scenario as measured.
type SlotsRow struct {
	Scenario string `json:"scenario"`
	Expected string `json:"expected"`
	// IdleDownSeconds is how long after the balancer nodes started every
	// node had every idle slot down: the load starts only then.
	IdleDownSeconds float64 `json:"idle_down_s"`
	// RolloutSeconds is the rollout, the canary's start to the last old
	// slot's exit; BatchSeconds each batch.
	RolloutSeconds float64   `json:"rollout_s"`
	BatchSeconds   []float64 `json:"batch_s"`
	// SlotDeployMinSeconds is the contract's floor of one server's swap;
	// GoalSeconds the design's time goal for the rollout (2.5 × it).
	SlotDeployMinSeconds float64    `json:"slot_deploy_min_s"`
	GoalSeconds          float64    `json:"goal_s"`
	Swaps                []SlotSwap `json:"swaps"`
	// Capacity is each node's fewest servers routed to through the
	// rollout: a server counts while the node routes to either slot.
	Capacity []NodeLow `json:"capacity"`
	// LoadAverage is the host's one-minute load average at each batch's end.
	LoadAverage []float64 `json:"load_average"`
	Observed    string    `json:"observed"`
	Verdict     string    `json:"verdict"`
	Error       string    `json:"error,omitempty"`
}

// slotsStep is where the prototype's steps leave what they measured.
type slotsStep struct {
	seconds  float64
	batches  []float64
	swaps    []SlotSwap
	capacity []NodeLow
	loads    []float64
	// swapErr is how the swaps ended: a broken release's canary fails.
	swapErr error
}

// ValidateSlots reports every reason c cannot run the prototype.
func (c Config) ValidateSlots() error {
	_, _, _, err := c.slots()
	return err
}

// slots is c as the prototype runs it and its profile: prod's timing with
// nodes the servers cannot tell apart (the fixed drain), or, with
// c.Profiles [evidence], nodes each naming itself as an ALB node does by its
// address, so the old slot's drain may end on evidence; that profile's load
// runs steady, so the evidence drain has its QuietRequests.
func (c Config) slots() (Config, []Profile, map[string]*slotsStep, error) {
	var errs []error
	name := ProfileProd
	switch {
	case len(c.Profiles) == 0:
	case len(c.Profiles) == 1 && (c.Profiles[0] == ProfileProd || c.Profiles[0] == ProfileEvidence):
		name = c.Profiles[0]
	default:
		errs = append(errs, fieldErr("Profiles", "%q: the slots prototype runs one profile, %s or %s", c.Profiles, ProfileProd, ProfileEvidence))
	}
	c.Profiles, c.Deploys = []string{name}, 1
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SSH {
		errs = append(errs, errors.New("rehearsal config: the slots prototype deploys each slot itself; it does not run over ssh"))
	}
	if c.Servers < 2 {
		errs = append(errs, fieldErr("Servers", "%d: the slots prototype needs a canary and at least one server after it", c.Servers))
	}
	profiles, err := Profiles(c.Scale, name)
	if err != nil {
		errs = append(errs, err)
	}
	var delay time.Duration
	if len(profiles) > 0 {
		if delay, err = crashAfter(profiles[0].Timing); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, nil, nil, err
	}
	var out []Profile
	steps := map[string]*slotsStep{}
	for _, sc := range slotsCases() {
		p := profiles[0]
		p.Name = sc.name
		if name == ProfileEvidence {
			p.steady = true
		}
		p.slots = true
		steps[sc.name] = &slotsStep{}
		p.steps = sc.steps(delay, steps[sc.name])
		out = append(out, p)
	}
	return c, out, steps, nil
}

// RunSlots runs the slots prototype's scenarios one after the other, on
// fresh servers and nodes, with c's servers, rate and scale, and judges
// each: no 502 or 504, every node routing to every server throughout, the
// good release on every server, each broken one caught in the canary's
// idle slot. Its times are measured, not judged.
func RunSlots(ctx context.Context, c Config) (SlotsReport, error) {
	c, profiles, steps, err := c.slots()
	if err != nil {
		return SlotsReport{}, err
	}
	rep := SlotsReport{Date: time.Now().UTC().Format("2006-01-02"), Servers: c.Servers}
	r, runErrs := c.run(ctx, profiles, true)
	rep.Report = r
	for i, sc := range slotsCases() {
		var pr *ProfileReport
		if i < len(r.Profiles) {
			pr = &r.Profiles[i]
		}
		rep.Rows = append(rep.Rows, sc.judge(pr, profileErr(runErrs, sc.name), steps[sc.name], profiles[i].Timing, c.Servers))
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	if len(r.Profiles) == 0 {
		return rep, errors.Join(runErrs...)
	}
	return rep, nil
}

// judge says whether the scenario showed what it must.
func (sc slotsCase) judge(pr *ProfileReport, runErr error, st *slotsStep, t infra.Timing, k int) SlotsRow {
	row := SlotsRow{Scenario: sc.name, Expected: sc.expected, Verdict: "FAIL",
		SlotDeployMinSeconds: t.SlotDeployMin().Seconds(), GoalSeconds: 2.5 * t.SlotDeployMin().Seconds(),
		RolloutSeconds: st.seconds, BatchSeconds: st.batches, Swaps: st.swaps, Capacity: st.capacity, LoadAverage: st.loads}
	if runErr != nil {
		row.Error = runErr.Error()
	}
	if pr == nil || len(pr.Deploys) == 0 {
		row.Observed = "did not run"
		return row
	}
	row.IdleDownSeconds = pr.IdleDownSeconds
	dr := pr.Deploys[0]
	obs := []string{fmt.Sprintf("%d 502, %d 504 in %d requests; verified %s on %s", dr.BadGateway, dr.Timeout, dr.Requests, yesNo(dr.Verified), dr.Version)}
	ok := runErr == nil && dr.ReachedNothing() == 0 && dr.Verified
	if sc.fault == "" {
		ok = ok && st.swapErr == nil && len(st.swaps) == k
		if row.RolloutSeconds > 0 {
			obs = append(obs, fmt.Sprintf("rollout %.1fs (goal %.1fs, %.2f× SlotDeployMin %.0fs); batches %ss",
				row.RolloutSeconds, row.GoalSeconds, row.RolloutSeconds/row.SlotDeployMinSeconds, row.SlotDeployMinSeconds, plusSeconds(row.BatchSeconds)))
		}
	} else {
		caught := st.swapErr != nil && len(st.swaps) == 1
		ok = ok && caught
		obs = append(obs, fmt.Sprintf("the canary's idle slot failed: %s; %d of %d servers touched; %.1fs", yesNo(st.swapErr != nil), len(st.swaps), k, row.RolloutSeconds))
	}
	if line := capacityLine(row.Capacity); line != "" {
		obs = append(obs, line+fmt.Sprintf(", all %d required", k))
	}
	if short := capacityShort(row.Capacity, k); short != "" {
		obs = append(obs, short)
		ok = false
	}
	for _, s := range row.Swaps {
		for svc, code := range s.Exits {
			if code != 0 {
				obs = append(obs, fmt.Sprintf("%s: the old slot's %s exited %d", s.Server, svc, code))
				ok = false
			}
		}
		if sc.fault == "" && s.AdmittedSeconds < 0 {
			obs = append(obs, s.Server+": a node never routed to the new slot")
			ok = false
		}
	}
	row.Observed = strings.Join(obs, "; ")
	if ok {
		row.Verdict = "pass"
	}
	return row
}

// steps swaps every server onto the scenario's release: the canary, then
// every other server at once. A broken release must fail in the canary's
// idle slot, whose containers then go; nothing else is touched.
func (sc slotsCase) steps(delay time.Duration, st *slotsStep) func(context.Context, *fleet) ([]DeployReport, error) {
	return func(ctx context.Context, f *fleet) ([]DeployReport, error) {
		t := f.p.Timing
		version := f.id + "-" + f.p.Name
		dr := DeployReport{Deploy: 1, Version: version, ServerDeployMin: t.SlotDeployMin().Seconds(),
			Step: "slot swap: the canary, then every other server at once"}
		var err error
		if sc.fault == "" {
			err = f.img.tag(ctx, version)
		} else {
			err = f.img.broken(ctx, version, sc.fault, delay)
			// What every server must run when the scenario is done.
			dr.Version = f.version
			dr.Step = fmt.Sprintf("slot swap of %s (api %s), caught on the canary", version, sc.fault)
		}
		if err != nil {
			return []DeployReport{dr}, err
		}
		names := map[string]string{}
		for i, s := range f.servers {
			names[s.addr] = s.name
			names[f.idle[i].addr] = s.name
		}
		// What observe verifies at the end: each server's live slot,
		// swapped in as it hands over.
		live := slices.Clone(f.servers)
		batches := [][]int{{0}}
		var rest []int
		for i := 1; i < len(f.servers); i++ {
			rest = append(rest, i)
		}
		batches = append(batches, rest)
		err = observe(ctx, &dr, live, f.lbs, f.load, t, false, func() error {
			start := time.Now()
			defer func() {
				st.seconds = time.Since(start).Seconds()
				st.capacity = FewestIn(f.lbs, names, start)
			}()
			st.swapErr = swapBatches(ctx, f, batches, version, t, st, live)
			if sc.fault == "" {
				return st.swapErr
			}
			if st.swapErr == nil {
				return fmt.Errorf("the swap of %s, whose api %s, succeeded", version, sc.fault)
			}
			// The canary's idle slot goes; its live slot never left.
			return compose(ctx, f.idle[0].Project, "down", t)
		})
		dr.HookSeconds, dr.ServerSeconds = nil, nil
		for _, s := range st.swaps {
			dr.HookSeconds = append(dr.HookSeconds, s.HookSeconds)
			dr.ServerSeconds = append(dr.ServerSeconds, s.Seconds)
		}
		if err == nil && sc.fault == "" {
			f.version = version
		}
		f.c.logf("%s: %d requests, %d 2xx, %d 502, %d 503, %d 504, %d client errors; %.2fs",
			f.p.Name, dr.Requests, dr.OK, dr.BadGateway, dr.Unavailable, dr.Timeout, dr.ClientErrors, st.seconds)
		return []DeployReport{dr}, err
	}
}

// swapBatches swaps each batch's servers side by side, one batch after the
// other, and stops at the first batch with a failed swap. A server that
// swapped becomes its new slot in f and live.
func swapBatches(ctx context.Context, f *fleet, batches [][]int, version string, t infra.Timing, st *slotsStep, live []*server) error {
	for b, batch := range batches {
		bstart := time.Now()
		swaps := make([]SlotSwap, len(batch))
		done := make([]bool, len(batch))
		g, gctx := errgroup.WithContext(ctx)
		for j, i := range batch {
			g.Go(func() error {
				var err error
				swaps[j], err = swap(gctx, f, i, version, t)
				swaps[j].Batch = b + 1
				done[j] = err == nil
				return err
			})
		}
		err := g.Wait()
		st.batches = append(st.batches, time.Since(bstart).Seconds())
		st.swaps = append(st.swaps, swaps...)
		st.loads = append(st.loads, loadAverage())
		for j, i := range batch {
			if done[j] {
				f.servers[i], f.idle[i] = f.idle[i], f.servers[i]
				live[i] = f.servers[i]
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// compose runs `docker compose -p project verb` (stop, down), bounded by
// the longest a stop may take: the grace period and the engine's own work.
// A broken release's idle slot goes with down: no node routes to it.
func compose(ctx context.Context, project, verb string, t infra.Timing) error {
	cctx, cancel := context.WithTimeout(ctx, t.StopGracePeriod+t.EngineWork)
	defer cancel()
	if out, err := exec.CommandContext(cctx, "docker", "compose", "-p", project, verb).CombinedOutput(); err != nil {
		return fmt.Errorf("docker compose -p %s %s: %w\n%s", project, verb, err, tail(out, 2000))
	}
	return nil
}

// swap moves server i onto version: today's deploy hook in its idle slot,
// then the live slot's containers stopped, its api draining by the
// handshake.
func swap(ctx context.Context, f *fleet, i int, version string, t infra.Timing) (SlotSwap, error) {
	old, next := f.servers[i], f.idle[i]
	sw := SlotSwap{Server: old.name, AdmittedSeconds: -1}
	start := time.Now()
	err := next.hook(ctx, "deploy", version)
	sw.HookSeconds = time.Since(start).Seconds()
	if err != nil {
		// The live slot never left: nothing to hand back.
		sw.Seconds = sw.HookSeconds
		return sw, err
	}
	mem := make(chan float64, 1)
	go func() { mem <- overlapMiB(ctx, t.EngineWork, old.Project, next.Project) }()
	// The handover: the old slot's containers get SIGTERM; its api
	// answers 503 and drains as it does in today's deploy.
	stopStart := time.Now()
	if err := compose(ctx, old.Project, "stop", t); err != nil {
		return sw, fmt.Errorf("stop %s's old slot: %w", old.name, err)
	}
	sw.StopSeconds = time.Since(stopStart).Seconds()
	sw.Seconds = time.Since(start).Seconds()
	sw.OverlapMiB = <-mem
	if sw.Exits, err = exitCodes(ctx, t.EngineWork, old.Project); err != nil {
		return sw, err
	}
	sw.AdmittedSeconds = admitted(f.lbs, next.addr, start)
	return sw, nil
}

// admitted is when, after start, the last node routed to addr: its first
// move back in service since start. Negative when a node has not.
func admitted(lbs []*Balancer, addr string, start time.Time) float64 {
	last := -1.0
	for _, b := range lbs {
		at := -1.0
		for _, m := range b.Health.Moves() {
			if m.Host == addr && m.In && m.At.After(start) {
				at = m.At.Sub(start).Seconds()
				break
			}
		}
		if at < 0 {
			return -1
		}
		last = max(last, at)
	}
	return last
}

// exitCodes reads the exit code of every container of project, within
// bound (the engine's own time, EngineWork).
func exitCodes(ctx context.Context, bound time.Duration, project string) (map[string]int, error) {
	qctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	out, err := exec.CommandContext(qctx, "docker", "ps", "-a", "--filter", "label=com.docker.compose.project="+project,
		"--format", `{{.Label "com.docker.compose.service"}} {{.State}} {{.Status}}`).Output()
	if err != nil {
		return nil, fmt.Errorf("list %s's containers: %w", project, err)
	}
	codes := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// "api exited Exited (0) 2 seconds ago"
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		code := -1
		if f[1] == "exited" {
			if n, err := strconv.Atoi(strings.Trim(f[3], "()")); err == nil {
				code = n
			}
		}
		codes[f[0]] = code
	}
	if len(codes) == 0 {
		return nil, fmt.Errorf("project %s has no containers", project)
	}
	return codes, nil
}

// overlapMiB is the memory of both projects' containers, read once within
// bound (the engine's own time, EngineWork).
func overlapMiB(ctx context.Context, bound time.Duration, projects ...string) float64 {
	qctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	args := []string{"stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}"}
	out, err := exec.CommandContext(qctx, "docker", args...).Output()
	if err != nil {
		return -1
	}
	total := 0.0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !slices.ContainsFunc(projects, func(p string) bool { return strings.HasPrefix(f[0], p+"-") }) {
			continue
		}
		total += mebibytes(f[1])
	}
	return total
}

// mebibytes reads docker stats' "12.5MiB" (or GiB, KiB, B).
func mebibytes(s string) float64 {
	for _, u := range []struct {
		suffix string
		f      float64
	}{{"GiB", 1024}, {"MiB", 1}, {"KiB", 1.0 / 1024}, {"B", 1.0 / (1 << 20)}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0
			}
			return n * u.f
		}
	}
	return 0
}

// loadAverage is the host's one-minute load average; 0 when unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.ParseFloat(f[0], 64)
	return n
}

// WriteTable writes the prototype as text: a row per scenario, then each
// scenario's swaps.
func (r SlotsReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Slots prototype, %s: %d servers of two slots each, a canary then every other server at once, up to %d requests/s, every duration × %g, %s.\n",
		r.Date, r.Servers, r.Report.Rate, r.Report.Scale, r.Report.Balancer)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\texpected\tobserved\tverdict")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", row.Scenario, row.Expected, row.Observed, row.Verdict)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write slots report: %w", err)
	}
	for _, row := range r.Rows {
		if row.Error != "" {
			fmt.Fprintf(&b, "  %s stopped: %s\n", row.Scenario, firstLine(row.Error))
		}
		if len(row.Swaps) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s: every idle slot down on every node %.1fs after the nodes started; the swaps:\n", row.Scenario, row.IdleDownSeconds)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  server\tbatch\thook s\tadmitted s\tstop s\tswap s\t× SlotDeployMin\toverlap MiB\told slot's exits")
		for _, s := range row.Swaps {
			if s.Exits == nil {
				fmt.Fprintf(tw, "  %s\t%d\t%.1f, failed\t–\t–\t%.1f\t–\t–\tthe live slot never left\n", s.Server, s.Batch, s.HookSeconds, s.Seconds)
				continue
			}
			var exits []string
			for svc, code := range s.Exits {
				exits = append(exits, fmt.Sprintf("%s %d", svc, code))
			}
			slices.Sort(exits)
			fmt.Fprintf(tw, "  %s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.0f\t%s\n", s.Server, s.Batch, s.HookSeconds, s.AdmittedSeconds,
				s.StopSeconds, s.Seconds, s.Seconds/row.SlotDeployMinSeconds, s.OverlapMiB, strings.Join(exits, ", "))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write slots report: %w", err)
		}
		if len(row.LoadAverage) > 0 {
			var loads []string
			for _, l := range row.LoadAverage {
				loads = append(loads, fmt.Sprintf("%.1f", l))
			}
			fmt.Fprintf(&b, "  load average (1 min) at each batch's end: %s\n", strings.Join(loads, ", "))
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write slots report: %w", err)
	}
	return nil
}

// WriteJSON writes the prototype's measurement as JSON.
func (r SlotsReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write slots report: %w", err)
	}
	return nil
}
