// Package rollout rolls a release across servers in batches, holding the
// fleet's rules whatever happens:
//
//   - never more than MaxUnavailable servers out of service at once,
//     counting the servers already out (unverified) before the rollout
//     starts, which go first; never every server;
//   - a canary of one server first, then batches;
//   - a failed server stops the rollout and its touched servers go back to
//     the release they ran before, batch by batch in reverse (a server an
//     earlier run left on Version, unverified, to the release before the
//     first run, its previous one); a failed rollback stops that too:
//     nothing healthy is taken out after it;
//   - an ssh drop during a deploy or rollback re-attaches to it: the call
//     started runs on on the server, so the rollout asks the server, within
//     the call's bound, how it ended, and judges it by that, not the drop;
//   - a cancel (the context ends: SIGINT, SIGTERM) starts nothing new and
//     leaves the deploys in flight to finish on their servers;
//   - every remote call and every batch ends by a bound derived from the
//     contract (infra.Timing), signal or not.
//
// The servers are reached through a Transport (ssh in production, a
// stand-in fleet in tests) and the balancer's verdict through a Balancer
// (describe-target-health in production).
package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/mythex/infra/infra"
)

// Status is what a server says it runs (remote-deploy --status).
type Status struct {
	Release  string
	Previous string
	Verified bool
	// Last is how the server's last deploy of the version asked about
	// ended, as the server recorded it (state/last-deploy); only Attach
	// says it, and only when there is such a record.
	Last string
}

// Transport runs remote-deploy's work on one server. Each call ends when
// its context does.
type Transport interface {
	Status(ctx context.Context, server string) (Status, error)
	Deploy(ctx context.Context, server, version string) error
	Rollback(ctx context.Context, server, version string) error
	// Attach waits for the deploy or rollback of version a dropped
	// connection left running on server to end, then says what the server
	// runs and how that call ended. An ssh failure is ErrSSH.
	Attach(ctx context.Context, server, version string) (Status, error)
}

// Balancer returns once the balancer routes to server again, or fails when
// it has not by its own bound or when ctx ends.
type Balancer interface {
	WaitInService(ctx context.Context, server string) error
}

// Config is one rollout.
type Config struct {
	Version        string
	Servers        []string
	MaxUnavailable int
	NoRollback     bool
	Timing         infra.Timing
	Transport      Transport
	Balancer       Balancer
	// Log takes the progress lines; nil discards them.
	Log io.Writer
}

// The outcomes of a rollout, in Report.Outcome.
const (
	Deployed  = "deployed"  // every server runs Version, verified
	Failed    = "failed"    // a server failed; the table says where each is
	Cancelled = "cancelled" // the context ended; nothing new was started
)

// ServerReport is what happened to one server.
type ServerReport struct {
	Server string `json:"server"`
	// Before is the release it ran when the rollout started ("" none, "?"
	// unknown); Now the release it runs at the end, as it said.
	Before string `json:"releaseBefore"`
	Now    string `json:"releaseNow"`
	// Verified is yes, no or unknown (not asked, or no answer).
	Verified string `json:"verified"`
	// OutAtStart: unverified when the rollout started, so it went first.
	OutAtStart bool `json:"outAtStart"`
	// What happened, in order.
	What []string `json:"what"`
}

// Report is what happened to every server.
type Report struct {
	Version        string         `json:"version"`
	MaxUnavailable int            `json:"maxUnavailable"`
	Outcome        string         `json:"outcome"`
	Servers        []ServerReport `json:"servers"`
}

// Code is the rollout's exit status for its outcome: 0 deployed, 1 failed;
// a cancelled rollout's is the signal's, which only the caller knows.
func (r Report) Code() int {
	if r.Outcome == Deployed {
		return 0
	}
	return 1
}

// Check names every problem with cfg at once; nil when it can run.
func (cfg Config) Check() error {
	var errs []error
	if cfg.Version == "" {
		errs = append(errs, errors.New("no VERSION"))
	}
	seen := map[string]bool{}
	for _, s := range cfg.Servers {
		if s == "" {
			errs = append(errs, errors.New("a SERVER is empty"))
		} else if seen[s] {
			errs = append(errs, fmt.Errorf("SERVER %q is named twice: it would count twice against -max-unavailable", s))
		}
		seen[s] = true
	}
	if err := infra.CheckRollout(len(cfg.Servers), cfg.MaxUnavailable); err != nil {
		errs = append(errs, err)
	}
	if err := cfg.Timing.ValidateInvariants(); err != nil {
		errs = append(errs, err)
	}
	if cfg.Transport == nil || cfg.Balancer == nil {
		errs = append(errs, errors.New("no transport or no balancer"))
	}
	return errors.Join(errs...)
}

// run is one rollout's state. out is the rollout's own count of servers out
// of service: unverified at the start, or deploying or rolling back until
// the balancer has them back.
type run struct {
	cfg  Config
	base context.Context // the calls' parent: a cancel does not cut them
	stop context.Context // ends on a cancel: nothing new starts after it

	mu      sync.Mutex
	servers map[string]*ServerReport
	out     map[string]bool
	before  map[string]Status
	logMu   sync.Mutex
}

// Run rolls cfg.Version across cfg.Servers. It returns when every server
// has ended, or at once after ctx ends with the deploys in flight left to
// finish on their servers. cfg must pass Check.
func Run(ctx context.Context, cfg Config) Report {
	r := &run{
		cfg:     cfg,
		base:    context.WithoutCancel(ctx),
		stop:    ctx,
		servers: map[string]*ServerReport{},
		out:     map[string]bool{},
		before:  map[string]Status{},
	}
	rep := Report{Version: cfg.Version, MaxUnavailable: cfg.MaxUnavailable}
	for _, s := range cfg.Servers {
		r.servers[s] = &ServerReport{Server: s, Verified: "unknown"}
	}
	rep.Outcome = r.rollout()
	// After a cancel the calls in flight may still write; the report is
	// what was known when the rollout ended.
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range cfg.Servers {
		sr := *r.servers[s]
		sr.What = slices.Clone(sr.What)
		rep.Servers = append(rep.Servers, sr)
	}
	return rep
}

func (r *run) logf(format string, args ...any) {
	if r.cfg.Log == nil {
		return
	}
	r.logMu.Lock()
	defer r.logMu.Unlock()
	fmt.Fprintf(r.cfg.Log, "%s rollout: %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
}

func (r *run) note(server, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.servers[server]
	sr.What = append(sr.What, fmt.Sprintf(format, args...))
}

// ran records what a deploy or rollback that succeeded left on server:
// version, verified (the call verifies before it succeeds). The table a
// cancel prints, which asks no server again, says it.
func (r *run) ran(server, version string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.servers[server].Now, r.servers[server].Verified = version, "yes"
}

func (r *run) setOut(server string, out bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if out {
		r.out[server] = true
	} else {
		delete(r.out, server)
	}
}

func (r *run) outCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.out)
}

func (r *run) cancelled() bool { return r.stop.Err() != nil }

// askAll asks each server what it runs, side by side, each under
// StatusMax. It records the answers as the release now (and before, when
// before is set) and returns the servers that did not answer.
func (r *run) askAll(ctx context.Context, servers []string, before bool) []string {
	var g errgroup.Group
	var mu sync.Mutex
	var failed []string
	for _, s := range servers {
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(ctx, r.cfg.Timing.StatusMax())
			defer cancel()
			st, err := r.cfg.Transport.Status(cctx, s)
			r.mu.Lock()
			sr := r.servers[s]
			if err != nil {
				sr.Now, sr.Verified = "?", "unknown"
				if before {
					sr.Before = "?"
				}
				sr.What = append(sr.What, fmt.Sprintf("cannot tell what it runs: %v", err))
			} else {
				sr.Now, sr.Verified = st.Release, yesNo(st.Verified)
				if before {
					sr.Before = st.Release
					r.before[s] = st
				}
			}
			r.mu.Unlock()
			if err != nil {
				r.logf("%s: asking what it runs: %v", s, err)
				mu.Lock()
				failed = append(failed, s)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	slices.Sort(failed)
	return failed
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (r *run) rollout() string {
	cfg := r.cfg
	r.logf("asking %d server(s) what they run", len(cfg.Servers))
	if failed := r.askAll(r.stop, cfg.Servers, true); len(failed) > 0 {
		r.logf("cannot tell what runs on %v; nothing deployed", failed)
		if r.cancelled() {
			return Cancelled
		}
		return Failed
	}
	if r.cancelled() {
		return Cancelled
	}
	// Servers already out go first: deploying them takes nothing more out.
	var outFirst, healthy, done []string
	for _, s := range cfg.Servers {
		st := r.before[s]
		switch {
		case st.Release == cfg.Version && st.Verified:
			done = append(done, s)
		case !st.Verified:
			outFirst = append(outFirst, s)
			r.out[s] = true
			r.servers[s].OutAtStart = true
		default:
			healthy = append(healthy, s)
		}
	}
	if len(outFirst) > 0 {
		r.logf("already out of service (unverified): %v; they go first and count against -max-unavailable %d", outFirst, cfg.MaxUnavailable)
	}
	if len(done) > 0 {
		r.logf("already on %s and verified: %v; checking the balancer has them in service", cfg.Version, done)
		failed := r.batch(done, "check", func(context.Context, string) error { return nil })
		if len(failed) > 0 {
			r.logf("%v on %s but not in service; nothing deployed: deploying others now could take too many servers out", failed, cfg.Version)
			return r.finish(Failed)
		}
		if r.cancelled() {
			return r.finish(Cancelled)
		}
		for _, s := range done {
			r.note(s, "skipped: already on %s", cfg.Version)
		}
	}
	todo := append(outFirst, healthy...)
	var batches [][]string
	for len(todo) > 0 {
		if r.cancelled() {
			for _, s := range todo {
				r.note(s, "not started (cancelled)")
			}
			return r.finish(Cancelled)
		}
		b := r.nextBatch(todo, len(batches) == 0)
		if len(b) == 0 {
			r.logf("%d server(s) out of service already; taking %s out too would exceed -max-unavailable %d; stopping", r.outCount(), todo[0], cfg.MaxUnavailable)
			for _, s := range todo {
				r.note(s, "not started: too many servers out")
			}
			return r.finish(Failed)
		}
		todo = todo[len(b):]
		batches = append(batches, b)
		canary := ""
		if len(batches) == 1 {
			canary = ", the canary"
		}
		r.logf("deploying %s to %v (batch %d%s)", cfg.Version, b, len(batches), canary)
		failed := r.batch(b, "deploy", func(ctx context.Context, s string) error {
			err := r.attached(ctx, s, cfg.Version, func(ctx context.Context) error {
				return cfg.Transport.Deploy(ctx, s, cfg.Version)
			})
			if err == nil {
				r.ran(s, cfg.Version)
			}
			return err
		})
		if r.cancelled() {
			for _, s := range todo {
				r.note(s, "not started (cancelled)")
			}
			return r.finish(Cancelled)
		}
		if len(failed) > 0 {
			for _, s := range todo {
				r.note(s, "not started")
			}
			if cfg.NoRollback {
				r.logf("-no-rollback: leaving every server where it is")
			} else {
				r.rollBack(batches)
			}
			return r.finish(Failed)
		}
	}
	return r.finish(Deployed)
}

// nextBatch takes the next servers of todo: one for the canary, else up to
// MaxUnavailable; the servers already out in batches of their own, and no
// more healthy ones than the servers out now leave room for. Empty when
// there is no room.
func (r *run) nextBatch(todo []string, canary bool) []string {
	limit := r.cfg.MaxUnavailable
	if canary {
		limit = 1
	}
	outNow := r.outCount()
	var b []string
	added := 0
	for _, s := range todo {
		if len(b) == limit {
			break
		}
		r.mu.Lock()
		isOut := r.out[s]
		r.mu.Unlock()
		if !isOut {
			// The servers out go in batches of their own: a healthy one
			// waits until they are back.
			if len(b) > 0 && added == 0 || outNow+added+1 > r.cfg.MaxUnavailable {
				break
			}
			added++
		}
		b = append(b, s)
	}
	return b
}

// batch runs work then the wait for re-entry on servers side by side, the
// batch under RolloutBatchMax and each call under its own bound. It returns
// the servers that failed, or, after a cancel, at once with the servers in
// flight, whose work runs on: a cancel does not cut a call.
func (r *run) batch(servers []string, kind string, work func(context.Context, string) error) []string {
	t := r.cfg.Timing
	bctx, cancel := context.WithTimeout(r.base, t.RolloutBatchMax())
	var g errgroup.Group
	var mu sync.Mutex
	var failed []string
	ended := map[string]bool{}
	fail := func(s string, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		r.note(s, "%s", msg)
		r.logf("%s: %s", s, msg)
		mu.Lock()
		failed = append(failed, s)
		mu.Unlock()
	}
	for _, s := range servers {
		if kind != "check" {
			r.setOut(s, true)
		}
		g.Go(func() error {
			defer func() { mu.Lock(); ended[s] = true; mu.Unlock() }()
			cctx, ccancel := context.WithTimeout(bctx, t.RemoteDeployMax())
			err := work(cctx, s)
			ccancel()
			if err != nil {
				fail(s, "%s FAILED: %v", kind, err)
				return nil
			}
			wctx, wcancel := context.WithTimeout(bctx, t.ReentryWaitMax())
			err = r.cfg.Balancer.WaitInService(wctx, s)
			wcancel()
			if err != nil {
				r.setOut(s, true)
				fail(s, "%s: not back in service: %v", kind, err)
				return nil
			}
			r.setOut(s, false)
			if kind != "check" {
				r.note(s, "%s: verified and back in service", kind)
			}
			return nil
		})
	}
	doneCh := make(chan struct{})
	go func() { _ = g.Wait(); cancel(); close(doneCh) }()
	select {
	case <-doneCh:
	case <-r.stop.Done():
		select {
		case <-doneCh:
		default:
			mu.Lock()
			for _, s := range servers {
				if !ended[s] {
					r.note(s, "%s in flight when cancelled: it runs on to its end on the server", kind)
					if kind != "check" {
						// Either release, until it ends.
						r.mu.Lock()
						r.servers[s].Now, r.servers[s].Verified = "?", "unknown"
						r.mu.Unlock()
					}
					failed = append(failed, s)
				}
			}
			mu.Unlock()
			r.logf("cancelled: starting nothing new; %s in flight on the servers runs on to its end", kind)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(failed)
	return slices.Clone(failed)
}

// attached runs call, a deploy or rollback of version on server, under ctx,
// the call's bound. When ssh fails or the connection drops, what the call
// started runs on on the server (remote-deploy detaches it): judged by the
// drop, a deploy about to succeed would be rolled back, and the rollback
// would race it for the server's lock. So the rollout re-attaches: it
// reconnects, waits for that deploy to end and asks the server how it
// ended, all within what is left of the call's bound, which bounds the
// deploy on the server too. The call counts as done only when the server
// runs version, verified; otherwise, or when the server cannot be reached
// again within the bound, it failed.
func (r *run) attached(ctx context.Context, server, version string, call func(context.Context) error) error {
	err := call(ctx)
	if !errors.Is(err, ErrSSH) {
		return err
	}
	r.logf("%s: %v; re-attaching to what runs on the server", server, err)
	st, aerr := r.reattach(ctx, server, version)
	if aerr != nil {
		return fmt.Errorf("ssh dropped (%w); re-attach failed: %w", err, aerr)
	}
	last := "no record of its deploy of " + version
	if st.Last != "" {
		last = "its record: " + st.Last
	}
	if st.Release == version && st.Verified {
		r.note(server, "ssh dropped; re-attached: on %s, verified (%s)", version, last)
		r.logf("%s: re-attached: on %s, verified", server, version)
		return nil
	}
	return fmt.Errorf("ssh dropped; re-attached: runs %q, verified %s (%s)", st.Release, yesNo(st.Verified), last)
}

// reattach asks server, again and again at ssh's keep-alive pace while the
// connection fails, how the call of version it ran ended, until ctx ends.
func (r *run) reattach(ctx context.Context, server, version string) (Status, error) {
	pace := time.NewTicker(r.cfg.Timing.SSHAliveInterval())
	defer pace.Stop()
	for {
		st, err := r.cfg.Transport.Attach(ctx, server, version)
		if err == nil || !errors.Is(err, ErrSSH) {
			return st, err
		}
		r.logf("%s: re-attaching: %v", server, err)
		select {
		case <-ctx.Done():
			return Status{}, fmt.Errorf("%w (last try: %w)", context.Cause(ctx), err)
		case <-pace.C:
		}
	}
}

// rollBack returns the touched servers to the release they ran before,
// batch by batch in reverse order. A failed rollback stops it: the servers
// left are healthy on the new release, and taking one out now could leave
// the fleet without one.
func (r *run) rollBack(batches [][]string) {
	for i := len(batches) - 1; i >= 0; i-- {
		if r.cancelled() {
			return
		}
		var b []string
		for _, s := range batches[i] {
			target, why := r.rollbackTarget(s)
			if target == "" {
				r.note(s, "%s", why)
				continue
			}
			if why != "" {
				r.note(s, "%s", why)
			}
			b = append(b, s)
		}
		if len(b) == 0 {
			continue
		}
		// A healthy server goes out only when there is room for it.
		healthy := 0
		for _, s := range b {
			r.mu.Lock()
			if !r.out[s] {
				healthy++
			}
			r.mu.Unlock()
		}
		if r.outCount()+healthy > r.cfg.MaxUnavailable {
			r.logf("not rolling back %v: %d server(s) out already, -max-unavailable %d", b, r.outCount(), r.cfg.MaxUnavailable)
			r.noteRest(batches[:i+1], "not rolled back: too many servers out")
			return
		}
		r.logf("rolling back %v to the release before", b)
		failed := r.batch(b, "rollback", func(ctx context.Context, s string) error {
			target, _ := r.rollbackTarget(s)
			err := r.attached(ctx, s, target, func(ctx context.Context) error {
				return r.cfg.Transport.Rollback(ctx, s, target)
			})
			if err == nil {
				r.ran(s, target)
			}
			return err
		})
		if len(failed) > 0 {
			if !r.cancelled() {
				r.logf("rollback of %v failed; stopping: the servers left stay where they are, in service", failed)
				r.noteRest(batches[:i], "not rolled back: a rollback failed")
			}
			return
		}
	}
}

// rollbackTarget is the release server goes back to: the one it ran when
// this rollout started, or, when that was Version already (an earlier run
// left it there unverified: -no-rollback, a failed rollback, a cancel), the
// one it ran before that, which the server keeps as its previous release:
// the release before the first run. "" when there is none, with why.
func (r *run) rollbackTarget(server string) (target, why string) {
	st := r.before[server]
	switch {
	case st.Release == "":
		return "", "no release before this rollout: nothing to roll back to"
	case st.Release != r.cfg.Version:
		return st.Release, ""
	case st.Previous == "" || st.Previous == r.cfg.Version:
		return "", fmt.Sprintf("on %s, unverified, since an earlier run, and it keeps no release before it: nothing to roll back to", r.cfg.Version)
	default:
		return st.Previous, fmt.Sprintf("on %s, unverified, since an earlier run: rolling back to %s, the release before the first run of %s", r.cfg.Version, st.Previous, r.cfg.Version)
	}
}

func (r *run) noteRest(batches [][]string, msg string) {
	for _, b := range batches {
		for _, s := range b {
			r.note(s, "%s", msg)
		}
	}
}

// finish asks the servers what they run now, side by side; after a cancel
// there is no time for it, and the report says what the rollout knows.
func (r *run) finish(outcome string) string {
	if outcome == Cancelled || r.cancelled() {
		r.logf("cancelled; run the same rollout again to go on: servers already on %s and verified are skipped", r.cfg.Version)
		return Cancelled
	}
	r.askAll(r.base, r.cfg.Servers, false)
	if outcome == Deployed {
		for _, s := range r.cfg.Servers {
			sr := r.servers[s]
			if sr.Now != r.cfg.Version || sr.Verified != "yes" {
				r.logf("%s runs %q, verified %s, at the end", s, sr.Now, sr.Verified)
				outcome = Failed
			}
		}
	}
	if outcome == Deployed {
		r.logf("deployed %s to all %d server(s)", r.cfg.Version, len(r.cfg.Servers))
	}
	return outcome
}
