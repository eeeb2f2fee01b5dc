package rehearsal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"

	"github.com/mythex/infra/hooks/targethealth"
	"github.com/mythex/infra/infra"
	rolloutpkg "github.com/mythex/infra/rollout"
)

// rollout runs the fleet rollout CI runs, rollout.Run (cmd/rollout's), in
// this process. Its two seams are production's by default but for the
// ends:
//
//   - its Transport runs remote-deploy's work on the simulated server it
//     names, with that server's environment: the deploy hook for VERSION
//     (the rehearsal has no systemd for bootstrap), remote-deploy itself
//     for --status and --rollback VERSION;
//   - its Balancer is rollout.ELB, production's wait for re-entry, paced
//     and bounded by the contract; the describe-target-health calls it
//     makes are answered here from the balancer nodes' own verdicts
//     (HealthTracker): healthy once every node routes to the server.
//
// Under -ssh (sshPath) both are production's: rollout.SSH to a loopback
// sshd, and rollout.ELB through the AWS SDK to a describe-target-health
// stand-in answering from the same verdicts.
//
// Either way each server is timed from its deploy starting to its deploy
// ending and to its return to service, as the rollout sees them.
type rollout struct {
	servers []*server
	lbs     []*Balancer
	log     *os.File
	// ssh, when set, replaces both ends by production's path.
	ssh *sshPath

	mu sync.Mutex
	// timing is the rollout's: its bounds and the release's. release,
	// when set, is shipped to each server just before its deploy (ship).
	timing  infra.Timing
	release string
	// rollbacks counts the servers the last run sent back to their
	// release before.
	rollbacks int
	// output is the last run's output (its tail).
	output string
	start  map[string]time.Time
	hook   map[string]float64
	total  map[string]float64
	// drain is how each server's old api ended its drain, from its
	// deploy's log.
	drain map[string]DrainEnd
	// timeline is where the last run's wall time went.
	timeline Timeline
}

// Timeline is where a rollout's wall time went: asking the servers what
// they run before its first deploy, each batch from its first server's
// deploy to its last server's return to service, and what follows the last
// batch (asking the servers again, the table).
type Timeline struct {
	BeforeSeconds  float64   `json:"before_s"`
	BatchesSeconds []float64 `json:"batches_s"`
	AfterSeconds   float64   `json:"after_s"`
}

// String says where the time went: "asking 8.0s before, batches 34.1 +
// 36.9s, 8.2s after".
func (tl Timeline) String() string {
	return fmt.Sprintf("asking %.1fs before, batches %ss, %.1fs after", tl.BeforeSeconds, plusSeconds(tl.BatchesSeconds), tl.AfterSeconds)
}

// plusSeconds writes durations in seconds as a sum: "34.1 + 36.9".
func plusSeconds(ss []float64) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%.1f", s)
	}
	return strings.Join(out, " + ")
}

// timelineOf splits a run from began to ended by its servers' deploys:
// each server's start and the seconds until it was back in service. A batch
// is the servers that started before every server started earlier was back;
// a server never back (a failed batch) ends no batch.
func timelineOf(began, ended time.Time, start map[string]time.Time, total map[string]float64) Timeline {
	type span struct{ from, to time.Time }
	var spans []span
	for name, from := range start {
		if secs, ok := total[name]; ok {
			spans = append(spans, span{from, from.Add(time.Duration(secs * float64(time.Second)))})
		}
	}
	tl := Timeline{}
	if len(spans) == 0 {
		return tl
	}
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	tl.BeforeSeconds = spans[0].from.Sub(began).Seconds()
	from, to := spans[0].from, spans[0].to
	for _, sp := range spans[1:] {
		if !sp.from.Before(to) {
			tl.BatchesSeconds = append(tl.BatchesSeconds, to.Sub(from).Seconds())
			from = sp.from
		}
		if sp.to.After(to) {
			to = sp.to
		}
	}
	tl.BatchesSeconds = append(tl.BatchesSeconds, to.Sub(from).Seconds())
	tl.AfterSeconds = ended.Sub(to).Seconds()
	return tl
}

// newRollout sets the rollout up for servers behind lbs, its log in dir.
func newRollout(dir string, servers []*server, lbs []*Balancer, t infra.Timing, sp *sshPath) (*rollout, error) {
	log, err := os.Create(filepath.Join(dir, "rollout.log"))
	if err != nil {
		return nil, fmt.Errorf("rollout log: %w", err)
	}
	return &rollout{servers: servers, lbs: lbs, timing: t, log: log, ssh: sp}, nil
}

func (r *rollout) close() {
	_ = r.log.Close()
}

func (r *rollout) server(name string) (*server, error) {
	for _, s := range r.servers {
		if s.name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no server %q", name)
}

// shipping makes the next runs ship release, of timing t, to each server
// just before its deploy, as the rollout ships a new release with its hooks.
func (r *rollout) shipping(release string, t infra.Timing) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.release, r.timing = release, t
}

// run rolls version across every server, at most maxUnavailable of them
// out at once after the canary, and returns, in server order, the seconds
// each server's deploy ran and the seconds until it was back in service,
// for the servers it finished. The rollout's output is kept (lastOutput).
// ctx ends the rehearsal: it cancels the rollout and cuts the hooks it
// left running.
func (r *rollout) run(ctx context.Context, version string, maxUnavailable int) (hook, total []float64, err error) {
	r.mu.Lock()
	r.start, r.hook, r.total = map[string]time.Time{}, map[string]float64{}, map[string]float64{}
	r.drain = map[string]DrainEnd{}
	r.rollbacks = 0
	t := r.timing
	r.mu.Unlock()
	out := &ringBuffer{max: 64 << 10}
	w := &lockedWriter{w: io.MultiWriter(r.log, out)}
	var names []string
	for _, s := range r.servers {
		names = append(names, s.name)
	}
	cfg := rolloutpkg.Config{Version: version, Servers: names, MaxUnavailable: maxUnavailable, Timing: t, Log: w}
	var transport rolloutpkg.Transport = &simTransport{r: r, ctx: ctx, out: w}
	elb := rolloutpkg.ELB{API: nodesAPI{servers: r.servers, lbs: r.lbs, port: r.servers[0].AppPort},
		TargetGroupARN: rehearsalTargetGroup, Port: r.servers[0].AppPort, Timing: t, Log: w}
	if r.ssh != nil {
		transport = r.ssh.transport(version, t, w)
		elb.API = r.ssh.elb
	}
	cfg.Transport, cfg.Balancer = timed{r: r, t: transport}, timed{r: r, b: elb}
	// The rollout's inputs as cmd/rollout checks them; the timing alone is
	// the profile's to break (matrix.md), and its bounds are still derived
	// from it.
	check := cfg
	check.Timing = infra.Prod()
	if err := check.Check(); err != nil {
		return nil, nil, fmt.Errorf("rollout %s: %w", version, err)
	}
	began := time.Now()
	rep := rolloutpkg.Run(ctx, cfg)
	ended := time.Now()
	if err := rep.WriteTable(w); err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.output = out.String()
	r.timeline = timelineOf(began, ended, r.start, r.total)
	for _, s := range r.servers {
		secs, ok := r.total[s.name]
		if !ok {
			break
		}
		hook = append(hook, r.hook[s.name])
		total = append(total, secs)
	}
	if rep.Outcome != rolloutpkg.Deployed {
		return hook, total, fmt.Errorf("rollout %s: %s\n%s", version, rep.Outcome, r.output)
	}
	if len(total) != len(r.servers) {
		return hook, total, errors.New("rollout " + version + " succeeded but did not wait for every server to be back in service:\n" + r.output)
	}
	return hook, total, nil
}

// timed times each server through the rollout's seams: from its deploy's
// start to the deploy's end (hook) and to its return to service (total),
// and counts the rollbacks. A rollback is not a deploy: the server's times
// stay its deploy's.
type timed struct {
	r *rollout
	t rolloutpkg.Transport
	b rolloutpkg.Balancer
}

func (x timed) Status(ctx context.Context, server string) (rolloutpkg.Status, error) {
	return x.t.Status(ctx, server)
}

func (x timed) Deploy(ctx context.Context, server, version string) error {
	start := time.Now()
	x.r.mu.Lock()
	x.r.start[server] = start
	x.r.mu.Unlock()
	err := x.t.Deploy(ctx, server, version)
	x.r.mu.Lock()
	x.r.hook[server] = time.Since(start).Seconds()
	x.r.mu.Unlock()
	return err
}

func (x timed) Rollback(ctx context.Context, server, version string) error {
	x.r.mu.Lock()
	delete(x.r.start, server)
	x.r.rollbacks++
	x.r.mu.Unlock()
	return x.t.Rollback(ctx, server, version)
}

func (x timed) Attach(ctx context.Context, server, version string) (rolloutpkg.Status, error) {
	return x.t.Attach(ctx, server, version)
}

func (x timed) WaitInService(ctx context.Context, server string) error {
	err := x.b.WaitInService(ctx, server)
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	if start, ok := x.r.start[server]; ok && err == nil {
		x.r.total[server] = time.Since(start).Seconds()
	}
	return err
}

// simTransport runs remote-deploy's work on the simulated servers. Each
// call ends with the rollout's bound, or with ctx, the rehearsal's. What a
// call printed goes to the server's log; a failed call's last lines go to
// the rollout's output too, after the server's name, as ssh relays them.
type simTransport struct {
	r   *rollout
	ctx context.Context
	out io.Writer
}

// calls is ctx, ended by the rehearsal's end as well.
func (st *simTransport) call(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(st.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// relay writes the last lines of a failed call's output to the rollout's
// output, and where the whole of it is.
func (st *simTransport) relay(s *server, b []byte) {
	for _, l := range strings.Split(string(tail(b, 3000)), "\n") {
		fmt.Fprintf(st.out, "[%s] %s\n", s.name, l)
	}
	fmt.Fprintf(st.out, "[%s] its log: %s\n", s.name, s.log.Name())
}

func (st *simTransport) Status(ctx context.Context, name string) (rolloutpkg.Status, error) {
	s, err := st.r.server(name)
	if err != nil {
		return rolloutpkg.Status{}, err
	}
	ctx, cancel := st.call(ctx)
	defer cancel()
	var out, errs bytes.Buffer
	cmd := s.Command(ctx, "remote-deploy", "--status")
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(s.log, &errs)
	if err := cmd.Run(); err != nil {
		st.relay(s, errs.Bytes())
		return rolloutpkg.Status{}, fmt.Errorf("remote-deploy --status on %s: %w", name, err)
	}
	return rolloutpkg.ParseStatus(out.String())
}

// Attach answers as remote-deploy --attach does: the server's status once
// the deploy or rollback of version has let go of the lock, and how it
// ended. A call in process never drops, so the rollout asks it only if a
// server's call failed as ssh does.
func (st *simTransport) Attach(ctx context.Context, name, version string) (rolloutpkg.Status, error) {
	s, err := st.r.server(name)
	if err != nil {
		return rolloutpkg.Status{}, err
	}
	ctx, cancel := st.call(ctx)
	defer cancel()
	var out, errs bytes.Buffer
	cmd := s.Command(ctx, "remote-deploy", "--attach", version)
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(s.log, &errs)
	if err := cmd.Run(); err != nil {
		st.relay(s, errs.Bytes())
		return rolloutpkg.Status{}, fmt.Errorf("remote-deploy --attach %s on %s: %w", version, name, err)
	}
	stat, err := rolloutpkg.ParseStatus(out.String())
	if err != nil {
		return rolloutpkg.Status{}, err
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if rec, ok := strings.CutPrefix(line, "last-deploy "); ok {
			stat.Last = rec
		}
	}
	return stat, nil
}

func (st *simTransport) Deploy(ctx context.Context, name, version string) error {
	s, err := st.r.server(name)
	if err != nil {
		return err
	}
	st.r.mu.Lock()
	release := st.r.release
	st.r.mu.Unlock()
	if release != "" {
		if err := s.ship(release); err != nil {
			return err
		}
	}
	ctx, cancel := st.call(ctx)
	defer cancel()
	start := time.Now()
	var out bytes.Buffer
	cmd := s.Command(ctx, "deploy", version)
	cmd.Stdout = io.MultiWriter(s.log, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		st.relay(s, out.Bytes())
		return fmt.Errorf("deploy %s on %s: %w", version, name, err)
	}
	fmt.Fprintf(st.out, "[%s] deployed %s in %.2fs (its log: %s)\n", name, version, time.Since(start).Seconds(), s.log.Name())
	if d, ok := parseDrainEnd(out.String()); ok {
		d.Server = name
		st.r.mu.Lock()
		st.r.drain[name] = d
		st.r.mu.Unlock()
	}
	return nil
}

// drainEndLine is deploy's line on how the old api ended its drain.
var drainEndLine = regexp.MustCompile(`(?m)api: old container \S+ drained and exited 0; its drain lasted (\S+) \((.+)\)$`)

// parseDrainEnd reads how the old api ended its drain from a deploy's
// output.
func parseDrainEnd(out string) (DrainEnd, bool) {
	m := drainEndLine.FindStringSubmatch(out)
	if m == nil {
		return DrainEnd{}, false
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		return DrainEnd{}, false
	}
	return DrainEnd{Seconds: d.Seconds(), Reason: m[2]}, true
}

// drains are the last run's drain ends, in server order.
func (r *rollout) drains() []DrainEnd {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []DrainEnd
	for _, s := range r.servers {
		if d, ok := r.drain[s.name]; ok {
			out = append(out, d)
		}
	}
	return out
}

func (st *simTransport) Rollback(ctx context.Context, name, version string) error {
	s, err := st.r.server(name)
	if err != nil {
		return err
	}
	ctx, cancel := st.call(ctx)
	defer cancel()
	start := time.Now()
	var out bytes.Buffer
	cmd := s.Command(ctx, "remote-deploy", "--rollback", version)
	// Its log beside the server's, not in the repository's hooks/.
	cmd.Env = append(cmd.Env, "MYTHEX_REMOTE_LOG_DIR="+s.Root)
	cmd.Stdout = io.MultiWriter(s.log, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		st.relay(s, out.Bytes())
		return fmt.Errorf("remote-deploy --rollback %s on %s: %w", version, name, err)
	}
	fmt.Fprintf(st.out, "[%s] back on %s in %.2fs (its log: %s)\n", name, version, time.Since(start).Seconds(), s.log.Name())
	return nil
}

// nodesAPI answers describe-target-health in process from the balancer
// nodes' verdicts (targetHealth): what rollout.ELB asks the target group.
// Every server is a target of the one port the rollout is given; by
// default each simulated server listens on a port of its own, so a target
// is told by its name.
type nodesAPI struct {
	servers []*server
	lbs     []*Balancer
	port    int
}

func (a nodesAPI) DescribeTargetHealth(ctx context.Context, in *elasticloadbalancingv2.DescribeTargetHealthInput, _ ...func(*elasticloadbalancingv2.Options)) (*elasticloadbalancingv2.DescribeTargetHealthOutput, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := &elasticloadbalancingv2.DescribeTargetHealthOutput{}
	for _, tg := range in.Targets {
		c := targethealth.Call{At: time.Now(), TargetGroupARN: aws.ToString(in.TargetGroupArn), ID: aws.ToString(tg.Id), Port: int(aws.ToInt32(tg.Port))}
		h, err := targetHealth(c, a.servers, a.lbs, a.port)
		if err != nil {
			return nil, err
		}
		th := &types.TargetHealth{State: types.TargetHealthStateEnum(h.State), Reason: types.TargetHealthReasonEnum(h.Reason)}
		if h.Description != "" {
			th.Description = aws.String(h.Description)
		}
		out.TargetHealthDescriptions = append(out.TargetHealthDescriptions, types.TargetHealthDescription{
			Target: &types.TargetDescription{Id: tg.Id, Port: tg.Port}, TargetHealth: th})
	}
	return out, nil
}

// lockedWriter is a writer the rollout's goroutines share.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// lastOutput is the tail of the last run's output: its final table.
func (r *rollout) lastOutput() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.output
}

// lastTimeline is where the last run's wall time went.
func (r *rollout) lastTimeline() Timeline {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.timeline
}

// rolledBack is how many servers the last run rolled back.
func (r *rollout) rolledBack() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rollbacks
}
