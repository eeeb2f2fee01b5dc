package rehearsal

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
	rolloutpkg "github.com/mythex/infra/rollout"
)

// Config is one rehearsal.
type Config struct {
	// RepoRoot is the repository: hooks/ and cmd/service are taken from it.
	RepoRoot string
	// Servers (K), Deploys (D) and Rate (R, requests per second).
	Servers, Deploys, Rate int
	// Nodes is how many balancer nodes check the servers, each on its own
	// as every ALB node does; 0 means DefaultNodes.
	Nodes int
	// Scale multiplies every duration of every profile.
	Scale float64
	// Profiles are run one after the other, in order.
	Profiles []string
	// Path is the route the load asks through the balancers, without a
	// query: the load's mix (APIMix) sets how long each request takes.
	Path string
	// WorkDir keeps every server's directory, the balancers' configs and
	// logs; "" means a temporary directory, removed afterwards.
	WorkDir string
	// HAProxy is the balancer binary; "" means FindHAProxy.
	HAProxy string
	// Progress receives a line per step; nil means none.
	Progress io.Writer
	// SSH deploys through the rollout's ssh transport (rollout.SSH) to a
	// loopback sshd and awaits re-entry through its describe-target-health
	// client (rollout.ELB), answered from the balancer nodes: production's
	// path (sshPath).
	SSH bool
	// MaxUnavailable is the rollout's -max-unavailable (a count or a
	// percentage); "" leaves the rollout's default, one server at a time.
	MaxUnavailable string
}

// maxUnavailable is the rollout's -max-unavailable for c's servers.
func (c Config) maxUnavailable() (int, error) {
	if c.MaxUnavailable == "" {
		return infra.DefaultMaxUnavailable, nil
	}
	n, err := rolloutpkg.ParseMaxUnavailable(c.MaxUnavailable, c.Servers)
	if err != nil {
		return 0, fieldErr("MaxUnavailable", "%v", err)
	}
	if err := infra.CheckRollout(c.Servers, n); err != nil {
		return 0, fieldErr("MaxUnavailable", "%q: %v", c.MaxUnavailable, err)
	}
	return n, nil
}

// DefaultNodes is the fewest nodes an ALB has: one in each of two zones.
const DefaultNodes = 2

// nodes is how many balancer nodes the rehearsal runs.
func (c Config) nodes() int {
	if c.Nodes == 0 {
		return DefaultNodes
	}
	return c.Nodes
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.RepoRoot == "" {
		errs = append(errs, fieldErr("RepoRoot", "is empty"))
	}
	if c.Servers < 1 {
		errs = append(errs, fieldErr("Servers", "%d must be at least 1", c.Servers))
	}
	if c.Deploys < 1 {
		errs = append(errs, fieldErr("Deploys", "%d must be at least 1", c.Deploys))
	}
	if c.Rate < 1 {
		errs = append(errs, fieldErr("Rate", "%d must be at least 1 request per second", c.Rate))
	}
	if c.Nodes != 0 && c.Nodes < DefaultNodes {
		errs = append(errs, fieldErr("Nodes", "%d must be at least %d: an ALB has a node in each of at least two zones", c.Nodes, DefaultNodes))
	}
	if c.Path == "" || c.Path[0] != '/' {
		errs = append(errs, fieldErr("Path", "%q must start with /", c.Path))
	} else if strings.HasPrefix(c.Path, infra.HealthPath) {
		errs = append(errs, fieldErr("Path", "%q is the health endpoint: the load asks real routes", c.Path))
	} else if strings.Contains(c.Path, "?") {
		errs = append(errs, fieldErr("Path", "%q has a query: the load's mix sets it", c.Path))
	}
	if _, err := Profiles(c.Scale, c.Profiles...); err != nil {
		errs = append(errs, err)
	}
	if c.Servers >= 1 {
		if _, err := c.maxUnavailable(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("rehearsal config: %w", err)
	}
	return nil
}

// CheckDocker fails clearly when the Docker engine cannot be reached.
func CheckDocker(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput()
	if err != nil {
		return fmt.Errorf("the rehearsal runs real containers, but the Docker engine is not reachable (is dockerd running, and may this user use it?): %w: %s",
			err, bytes.TrimSpace(out))
	}
	return nil
}

// Run rehearses every profile in c and reports each deploy. The report is
// filled as far as the run got even when an error is returned.
func Run(ctx context.Context, c Config) (Report, error) {
	if err := c.Validate(); err != nil {
		return Report{}, err
	}
	profiles, err := Profiles(c.Scale, c.Profiles...)
	if err != nil {
		return Report{}, err
	}
	rep, errs := c.run(ctx, profiles, false)
	return rep, errors.Join(errs...)
}

// run rehearses profiles in order. A profile that fails ends the run unless
// keepGoing; errs holds each failure, and rep every profile that ran.
func (c Config) run(ctx context.Context, profiles []Profile, keepGoing bool) (rep Report, errs []error) {
	fail := func(err error) (Report, []error) { return rep, append(errs, err) }
	var err error
	rep = Report{Servers: c.Servers, Deploys: c.Deploys, Rate: c.Rate, Scale: c.Scale, Path: c.Path, Note: CountingNote}
	if err := CheckDocker(ctx); err != nil {
		return fail(err)
	}
	work := c.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("", "mythex-rehearsal-"); err != nil {
			return fail(fmt.Errorf("work dir: %w", err))
		}
		defer func() { _ = os.RemoveAll(work) }()
	}
	if c.HAProxy == "" {
		if c.HAProxy, err = FindHAProxy(); err != nil {
			return fail(err)
		}
	}
	rep.Balancer = HAProxyVersion(c.HAProxy)
	id := runID()
	base := id + "-base"
	c.logf("building the reference service images (tag %s)", base)
	if err := hooks.BuildImages(ctx, c.RepoRoot, base); err != nil {
		return fail(fmt.Errorf("build images: %w", err))
	}
	img := &images{root: c.RepoRoot, tags: []string{base}}
	defer img.remove()
	for _, p := range profiles {
		pr, err := c.runProfile(ctx, p, id, filepath.Join(work, p.Name), img)
		rep.Profiles = append(rep.Profiles, pr)
		if err != nil {
			errs = append(errs, fmt.Errorf("profile %s: %w", p.Name, err))
			if !keepGoing || ctx.Err() != nil {
				return rep, errs
			}
		}
	}
	return rep, errs
}

// profileErr is the error run reported for profile name, or nil: run
// prefixes each with "profile NAME: ".
func profileErr(errs []error, name string) error {
	var out error
	for _, e := range errs {
		if strings.HasPrefix(e.Error(), "profile "+name+":") {
			out = e
		}
	}
	return out
}

func (c Config) logf(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "rehearse: "+format+"\n", args...)
	}
}

// runID names this run's compose projects and image tags, so rehearsals and
// tests on one Docker engine never touch each other's.
func runID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "rh" + hex.EncodeToString(b)
}

// images builds the reference service images once per deploy, each with its
// version built in: the deploy hook sees a new release each time, as in
// production, and verifies it (a re-tagged image would fail that check).
type images struct {
	mu   sync.Mutex
	root string
	tags []string
}

// tag builds version's images, once: a version two profiles deploy (a
// transition's new release) is built for the first.
func (im *images) tag(ctx context.Context, version string) error {
	im.mu.Lock()
	built := slices.Contains(im.tags, version)
	im.mu.Unlock()
	if built {
		return nil
	}
	if err := hooks.BuildImages(ctx, im.root, version); err != nil {
		return fmt.Errorf("build images %s: %w", version, err)
	}
	im.mu.Lock()
	im.tags = append(im.tags, version)
	im.mu.Unlock()
	return nil
}

// broken builds version's images with the api broken as fault says
// (hooks.BuildBrokenImages).
func (im *images) broken(ctx context.Context, version string, fault hooks.Fault, crashAfter time.Duration) error {
	if err := hooks.BuildBrokenImages(ctx, im.root, version, fault, crashAfter); err != nil {
		return fmt.Errorf("build broken images %s: %w", version, err)
	}
	im.mu.Lock()
	im.tags = append(im.tags, version)
	im.mu.Unlock()
	return nil
}

func (im *images) remove() {
	im.mu.Lock()
	defer im.mu.Unlock()
	for _, t := range im.tags {
		_ = hooks.RemoveImages(context.Background(), t)
	}
}

// server is one simulated server: a compose project and the balancers'
// view of its api.
type server struct {
	name string
	hooks.Server
	addr string
	log  *os.File

	watchdogRuns, watchdogRestarts atomic.Int64
}

// hook runs a script for the server, its output going to the server's log;
// the error carries the output's tail.
func (s *server) hook(ctx context.Context, script string, args ...string) error {
	var out bytes.Buffer
	cmd := s.Command(ctx, script, args...)
	cmd.Stdout = io.MultiWriter(s.log, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s on %s: %w\n%s", script, strings.Join(args, " "), s.name, err, tail(out.Bytes(), 3000))
	}
	return nil
}

// ship points the server at another release, as the rollout ships a
// release to a server just before deploying it there: that deploy, and the
// server's watchdog from then on, read it; servers not reached yet keep
// theirs. One rename, so a hook reads the old release or the new one.
func (s *server) ship(release string) error {
	next := s.ReleaseDir + ".next"
	if err := os.Remove(next); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ship to %s: %w", s.name, err)
	}
	if err := os.Symlink(release, next); err != nil {
		return fmt.Errorf("ship to %s: %w", s.name, err)
	}
	if err := os.Rename(next, s.ReleaseDir); err != nil {
		return fmt.Errorf("ship to %s: %w", s.name, err)
	}
	return nil
}

// watchdogLineRestart is how the watchdog announces a restart.
const watchdogLineRestart = ": restarting after "

// watch runs the real watchdog on the server every interval until ctx ends,
// counting its runs and the restarts it announces.
func (s *server) watch(ctx context.Context, interval time.Duration) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		var out bytes.Buffer
		cmd := s.Command(ctx, "watchdog")
		cmd.Stdout = io.MultiWriter(s.log, &out)
		cmd.Stderr = cmd.Stdout
		err := cmd.Run()
		if ctx.Err() != nil {
			return
		}
		s.watchdogRuns.Add(1)
		s.watchdogRestarts.Add(int64(strings.Count(out.String(), watchdogLineRestart)))
		if err != nil {
			fmt.Fprintf(s.log, "rehearse: watchdog exited with %v\n", err)
		}
	}
}

// runProfile brings up K servers with p's timing behind two balancer nodes,
// then deploys D new versions across them under load.
// pr is named: the deferred stop of the load fills in what the load and the
// balancer nodes saw, after every return.
func (c Config) runProfile(ctx context.Context, p Profile, id, dir string, img *images) (pr ProfileReport, _ error) {
	t := p.Timing
	pr = ProfileReport{Profile: p.Name, Timing: summarize(t)}
	for _, v := range p.Violations {
		pr.Violations = append(pr.Violations, v.Error())
	}
	release := filepath.Join(dir, "release")
	if err := os.MkdirAll(release, 0o755); err != nil {
		return pr, fmt.Errorf("release dir: %w", err)
	}
	if err := writeRelease(release, p); err != nil {
		return pr, err
	}

	used := map[int]bool{}
	servers, err := c.newServers(p, id, dir, release, "", used)
	if err != nil {
		return pr, err
	}
	var idle []*server
	if p.slots {
		if idle, err = c.newServers(p, id, dir, release, "b", used); err != nil {
			return pr, err
		}
	}
	all := append(slices.Clone(servers), idle...)
	defer func() {
		for _, s := range all {
			if err := s.Remove(context.Background()); err != nil {
				c.logf("%s: cleanup: %v", s.name, err)
			}
			_ = s.log.Close()
		}
	}()

	v0 := fmt.Sprintf("%s-%s-0", id, p.Name)
	if err := img.tag(ctx, v0); err != nil {
		return pr, err
	}
	c.logf("%s: starting %d servers at %s", p.Name, len(servers), v0)
	if err := forEach(servers, func(s *server) error { return s.hook(ctx, "deploy", v0) }); err != nil {
		return pr, fmt.Errorf("first deploy: %w", err)
	}

	var upstreams []string
	for _, s := range all {
		upstreams = append(upstreams, s.addr)
	}
	var lbs []*Balancer
	defer func() {
		for _, b := range lbs {
			b.Stop()
		}
	}()
	// Each node with its own checks, as every ALB node checks every target
	// on its own.
	for _, o := range p.nodeOptions(c.nodes()) {
		b, err := StartNode(ctx, c.HAProxy, filepath.Join(dir, o.Name), t, upstreams, o)
		if err != nil {
			return pr, err
		}
		lbs = append(lbs, b)
		if o.Lag > 0 {
			pr.LaggingNodes = append(pr.LaggingNodes, o.Name)
			pr.Lag = o.Lag.Seconds()
		}
		pr.NamedNodes = o.Named
	}
	nodesUp := time.Now()
	for _, s := range servers {
		if err := awaitInService(ctx, lbs, s.addr, t.StartTimeout); err != nil {
			return pr, fmt.Errorf("%s never in service: %w", s.name, err)
		}
	}
	// A node starts every upstream in service until its checks fail, an
	// ALB a new target initial: the load starts once every node has every
	// idle slot down.
	for _, s := range idle {
		for _, b := range lbs {
			if h, err := b.Health.Await(ctx, s.addr, t.StartTimeout, func(h HostHealth) bool { return !h.Healthy }); err != nil {
				return pr, fmt.Errorf("%s: idle slot %s never down: %w (last verdict %+v)", b.Name, s.name, err, h)
			}
		}
	}
	pr.IdleDownSeconds = time.Since(nodesUp).Seconds()

	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopWatch()
		wg.Wait()
	}()
	if !p.slots {
		// A slots profile runs no watchdog: it knows one slot (Profile.slots).
		for _, s := range servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.watch(wctx, t.WatchdogInterval)
			}()
		}
	}

	var sp *sshPath
	if c.SSH {
		if sp, err = startSSHPath(c.RepoRoot, dir, release, servers, lbs, servers[0].AppPort); err != nil {
			return pr, err
		}
		defer sp.close()
	}
	ro, err := newRollout(dir, servers, lbs, t, sp)
	if err != nil {
		return pr, err
	}
	defer ro.close()

	var targets []string
	for _, b := range lbs {
		targets = append(targets, b.URL())
	}
	// Bounded by the longest the whole run may take: every server deploy at
	// its maximum.
	bound := time.Duration(c.Deploys*len(servers)) * (t.ServerDeployMax() + t.StartTimeout)
	// Quiet spells just under the balancer's idle timeout: the nodes then
	// reuse upstream connections as old as they ever keep them, where a
	// keep-alive shorter than the idle timeout would race.
	quiet := t.LBIdleTimeout * 9 / 10
	mix := APIMix(t, c.Path)
	// In the spells, bursts idle the pooled connections for as long as the
	// first to close them keeps them: the app's keep-alive, when it is the
	// shorter, races the balancer's reuse (Probe). In prod the balancer's
	// idle timeout is the shorter, and longer than a spell: one burst a
	// spell, on connections the balancer has just pooled.
	probe := &Probe{Gap: min(t.AppKeepAlive, t.LBIdleTimeout), Width: len(servers), Kinds: mix[:2]}
	if p.steady {
		quiet, probe = 0, nil
	}
	load, err := StartLoad(ctx, LoadConfig{
		Targets:    targets,
		Mix:        mix,
		Rate:       c.Rate,
		Quiet:      quiet,
		QuietEvery: 2 * t.LBIdleTimeout,
		QuietRate:  max(1, c.Rate/20),
		Probe:      probe,
		// Longer than the balancer's own bound (it answers 504 after
		// LBIdleTimeout), so the balancer always answers first.
		RequestTimeout: 2 * t.LBIdleTimeout,
		MaxRequests:    int64(bound.Seconds()*float64(c.Rate)) + 1,
		MaxDuration:    bound,
	})
	if err != nil {
		return pr, err
	}
	defer func() {
		load.Stop()
		pr.Errors = load.Errors()
		final := load.Snapshot()
		pr.ByMethod = final.ByMethod
		pr.Balancers, pr.CrossCheck = crossCheck(ctx, lbs, pr.ByMethod, final.ByTarget, t)
		pr.Terminations = map[string]int64{}
		for _, b := range lbs {
			for k, v := range b.Log.Terminations() {
				pr.Terminations[k] += v
			}
		}
	}()

	var runErr error
	if p.steps != nil {
		pr.Deploys, runErr = p.steps(ctx, &fleet{c: c, p: p, id: id, dir: dir, servers: servers, idle: idle, lbs: lbs, ro: ro, load: load, img: img, version: v0})
	}
	for d := 1; p.steps == nil && d <= c.Deploys && runErr == nil; d++ {
		var dr DeployReport
		dr, runErr = c.deploy(ctx, p, id, d, servers, lbs, ro, load, img)
		pr.Deploys = append(pr.Deploys, dr)
		c.logf("%s: deploy %d/%d: %d requests, %d 2xx, %d 502, %d 503, %d 504, %d client errors; %.2fs per server (%.2f× the minimum); watchdog %d runs, %d restarts",
			p.Name, d, c.Deploys, dr.Requests, dr.OK, dr.BadGateway, dr.Unavailable, dr.Timeout, dr.ClientErrors,
			dr.MeanServerSeconds(), dr.Ratio(), dr.WatchdogRuns, dr.WatchdogRestarts)
	}
	pr.Total = total(pr.Deploys)
	return pr, runErr
}

// fleet is a profile's running rehearsal: what a profile's own steps
// (Profile.steps) act on under the load, in place of its deploys.
type fleet struct {
	c       Config
	p       Profile
	id, dir string
	servers []*server
	// idle are the servers' idle slots, by server, in a slots profile.
	idle []*server
	lbs  []*Balancer
	ro   *rollout
	load *Load
	img  *images
	// version is what every server runs.
	version string
}

// newServers makes c.Servers servers named s1… with suffix after the
// number (a slot's), each on a port not in used, which it marks.
func (c Config) newServers(p Profile, id, dir, release, suffix string, used map[int]bool) ([]*server, error) {
	var servers []*server
	for i := 1; i <= c.Servers; i++ {
		name := fmt.Sprintf("s%d%s", i, suffix)
		// Nothing listens on a server's port until its first deploy, so a
		// second FreePort could hand out the same one.
		port, err := FreePort()
		for err == nil && used[port] {
			port, err = FreePort()
		}
		if err != nil {
			return nil, err
		}
		used[port] = true
		root := filepath.Join(dir, name)
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, fmt.Errorf("server dir: %w", err)
		}
		// Each server reads the release through its own link, so a rollout
		// can ship another to one server at a time (server.ship).
		link := filepath.Join(dir, name+".release")
		if err := os.Symlink(release, link); err != nil {
			return nil, fmt.Errorf("server release: %w", err)
		}
		log, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, fmt.Errorf("server log: %w", err)
		}
		servers = append(servers, &server{
			name: name,
			Server: hooks.Server{
				HooksDir:   filepath.Join(c.RepoRoot, "hooks"),
				Root:       root,
				Project:    fmt.Sprintf("%s-%s-%s", id, p.Name, name),
				ReleaseDir: link,
				AppPort:    port,
				Bind:       "127.0.0.1",
			},
			addr: "127.0.0.1:" + strconv.Itoa(port),
			log:  log,
		})
	}
	if c.SSH {
		sshAddresses(servers)
	}
	return servers, nil
}

// deploy rolls version d across every server with the rollout, then checks
// every service on every server itself.
func (c Config) deploy(ctx context.Context, p Profile, id string, d int, servers []*server, lbs []*Balancer, ro *rollout, load *Load, img *images) (DeployReport, error) {
	t := p.Timing
	version := fmt.Sprintf("%s-%s-%d", id, p.Name, d)
	dr := DeployReport{Deploy: d, Version: version, ServerDeployMin: t.ServerDeployMin().Seconds()}
	if err := img.tag(ctx, version); err != nil {
		return dr, err
	}
	n, err := c.maxUnavailable()
	if err != nil {
		return dr, err
	}
	err = observe(ctx, &dr, servers, lbs, load, t, true, func() error {
		var err error
		dr.HookSeconds, dr.ServerSeconds, err = ro.run(ctx, version, n)
		dr.Drains = ro.drains()
		return err
	})
	return dr, err
}

// observe runs step under the load and fills dr with what happened
// meanwhile: the load's answers, the watchdog's runs and restarts, the
// servers the nodes took out (and, when step deploys every server, the
// node/server pairs where the node never did), and, once step has
// succeeded, whether every service on every server runs dr.Version.
func observe(ctx context.Context, dr *DeployReport, servers []*server, lbs []*Balancer, load *Load, t infra.Timing, deploys bool, step func() error) error {
	// One snapshot at each end: the total and its split per method are
	// the same requests, however many finish while the deploy is read.
	start := load.Snapshot()
	runs0, restarts0 := watchdogTotals(servers)
	outs0 := outs(lbs)
	pairs0, late0 := outsByPair(lbs)
	bad0 := badGatewayByPair(lbs, servers)
	err := step()
	if err != nil {
		dr.Problems = append(dr.Problems, err.Error())
	} else {
		for _, s := range servers {
			for _, pr := range verify(ctx, s, dr.Version, t.ContainerHealthTimeout) {
				dr.Problems = append(dr.Problems, s.name+": "+pr)
			}
		}
		dr.Verified = len(dr.Problems) == 0
	}
	end := load.Snapshot()
	dr.Counts = end.Total.Sub(start.Total)
	dr.ByMethod = subByMethod(end.ByMethod, start.ByMethod)
	runs1, restarts1 := watchdogTotals(servers)
	dr.WatchdogRuns, dr.WatchdogRestarts = int(runs1-runs0), int(restarts1-restarts0)
	dr.TakenOut = outs(lbs) - outs0
	pairs1, late1 := outsByPair(lbs)
	for _, b := range lbs {
		for _, s := range servers {
			k := b.Name + "/" + s.addr
			if deploys && pairs1[k] == pairs0[k] {
				dr.NotTakenOut = append(dr.NotTakenOut, b.Name+"/"+s.name)
			}
			if late1[k] > late0[k] {
				dr.LateOut = append(dr.LateOut, b.Name+"/"+s.name)
			}
		}
	}
	for k, n := range badGatewayByPair(lbs, servers) {
		if n -= bad0[k]; n > 0 {
			if dr.BadGatewayBy == nil {
				dr.BadGatewayBy = map[string]int64{}
			}
			dr.BadGatewayBy[k] = n
		}
	}
	return err
}

// badGatewayByPair counts the 502s each node answered for each server so
// far, by "node/server".
func badGatewayByPair(lbs []*Balancer, servers []*server) map[string]int64 {
	n := map[string]int64{}
	for _, b := range lbs {
		by := b.Log.BadGatewayByServer()
		for _, s := range servers {
			if by[s.addr] > 0 {
				n[b.Name+"/"+s.name] = by[s.addr]
			}
		}
	}
	return n
}

func watchdogTotals(servers []*server) (runs, restarts int64) {
	for _, s := range servers {
		runs += s.watchdogRuns.Load()
		restarts += s.watchdogRestarts.Load()
	}
	return runs, restarts
}

// outsByPair counts, for each node/upstream pair, the times the node took
// the upstream out of rotation, and of those the late ones.
func outsByPair(lbs []*Balancer) (outs, late map[string]int) {
	outs, late = map[string]int{}, map[string]int{}
	for _, b := range lbs {
		for addr, h := range b.Health.All() {
			outs[b.Name+"/"+addr] += h.Outs
			late[b.Name+"/"+addr] += h.LateOuts
		}
	}
	return outs, late
}

// outs counts every time any node took any upstream out of rotation.
func outs(lbs []*Balancer) int {
	n := 0
	for _, b := range lbs {
		for _, h := range b.Health.All() {
			n += h.Outs
		}
	}
	return n
}

// awaitInService waits until every node routes to addr: its own health
// checks have passed HealthyThreshold times since it last took addr out.
// This is the rehearsal's wait-in-service, as `aws elbv2 wait
// target-in-service` is production's.
func awaitInService(ctx context.Context, lbs []*Balancer, addr string, timeout time.Duration) error {
	for _, b := range lbs {
		h, err := b.Health.Await(ctx, addr, timeout, func(h HostHealth) bool { return h.Healthy })
		if err != nil {
			return fmt.Errorf("balancer %s: %w (last verdict %+v)", b.Name, err, h)
		}
	}
	return nil
}

// forEach runs f on every server at once and joins the errors.
func forEach(servers []*server, f func(*server) error) error {
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(s)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// verify checks, independently of the deploy hook's own verification, that
// every role runs exactly one healthy container of the new version on the
// server, and answers /about with its role and version.
func verify(ctx context.Context, s *server, version string, timeout time.Duration) []string {
	var problems []string
	out, err := exec.CommandContext(ctx, "docker", "ps", "-q", "--filter", "label=com.docker.compose.project="+s.Project).Output()
	if err != nil {
		return []string{fmt.Sprintf("docker ps: %v", err)}
	}
	byRole := map[string][]containerInfo{}
	for _, id := range strings.Fields(string(out)) {
		ci, err := inspect(ctx, id)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		byRole[ci.Role] = append(byRole[ci.Role], ci)
	}
	for _, role := range hooks.Roles {
		cs := byRole[role]
		if len(cs) != 1 {
			problems = append(problems, fmt.Sprintf("%s: %d running containers, want 1", role, len(cs)))
			continue
		}
		ci := cs[0]
		if want := hooks.ImageName(hooks.DefaultImagePrefix, role, version); ci.Image != want {
			problems = append(problems, fmt.Sprintf("%s: runs image %s, want %s", role, ci.Image, want))
		}
		if ci.Health != "healthy" {
			problems = append(problems, fmt.Sprintf("%s: container health %q", role, ci.Health))
		}
		if ci.HostAddr == "" {
			problems = append(problems, fmt.Sprintf("%s: not published on loopback", role))
			continue
		}
		if pr := checkAbout(ctx, ci.HostAddr, role, version, timeout); pr != "" {
			problems = append(problems, role+": "+pr)
		}
	}
	return problems
}

type containerInfo struct {
	// HostAddr is where the service is published on a loopback address
	// (api on its server's own under -ssh, 127.0.0.N).
	Role, Image, Health, HostAddr string
}

func inspect(ctx context.Context, id string) (containerInfo, error) {
	const format = `{{index .Config.Labels "com.docker.compose.service"}}|{{.Config.Image}}|{{if .State.Health}}{{.State.Health.Status}}{{end}}|{{range $p, $b := .NetworkSettings.Ports}}{{range $b}}{{.HostIp}}:{{.HostPort}} {{end}}{{end}}`
	out, err := exec.CommandContext(ctx, "docker", "inspect", "--format", format, id).Output()
	if err != nil {
		return containerInfo{}, fmt.Errorf("docker inspect %s: %w", id, err)
	}
	f := strings.Split(strings.TrimSpace(string(out)), "|")
	if len(f) != 4 {
		return containerInfo{}, fmt.Errorf("docker inspect %s: unexpected %q", id, out)
	}
	ci := containerInfo{Role: f[0], Image: f[1], Health: f[2]}
	for _, addr := range strings.Fields(f[3]) {
		if host, _, err := net.SplitHostPort(addr); err == nil && net.ParseIP(host).IsLoopback() {
			ci.HostAddr = addr
			break
		}
	}
	return ci, nil
}

// checkAbout asks a service directly (not through a balancer) who it is,
// allowing it as long as the server allows its own container checks.
func checkAbout(ctx context.Context, addr, role, version string, timeout time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/about", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Sprintf("/about: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var about struct{ Role, Version string }
	if err := json.NewDecoder(resp.Body).Decode(&about); err != nil {
		return fmt.Sprintf("/about answered %d, not JSON: %v", resp.StatusCode, err)
	}
	if about.Role != role || about.Version != version {
		return fmt.Sprintf("/about says role %q version %q, want %q %q", about.Role, about.Version, role, version)
	}
	return ""
}

// The load's mix: mostly short requests, some as long as half the shutdown
// timeout (or the longest the app allows, if that is shorter), so that some
// are still in flight when a server's listener closes and must finish within
// ShutdownTimeout; GETs and POSTs with a body, since a balancer that forgives
// a GET may not forgive a POST.
const (
	shortMs  = 10
	postBody = 1 << 10
)

// APIMix is the rehearsal's load on path under timing t; the short kinds
// come first (the probe asks them).
func APIMix(t infra.Timing, path string) []Kind {
	short := fmt.Sprintf("%s?ms=%d", path, shortMs)
	long := fmt.Sprintf("%s?ms=%d", path, min(t.ShutdownTimeout/2, t.MaxRequest).Milliseconds())
	return []Kind{
		{Method: http.MethodGet, Path: short, Weight: 10},
		{Method: http.MethodPost, Path: short, Body: postBody, Weight: 6},
		{Method: http.MethodGet, Path: long, Weight: 2},
		{Method: http.MethodPost, Path: long, Body: postBody, Weight: 2},
	}
}

// subByMethod returns a − b per method.
func subByMethod(a, b map[string]Counts) map[string]Counts {
	out := map[string]Counts{}
	for m, c := range a {
		out[m] = c.Sub(b[m])
	}
	return out
}

// crossCheck reads every node's own log once it has caught up with the
// load, and returns the answers per method as the ALB would have given them,
// with every disagreement: each node must have logged every answer the load
// got from it; the 502s, 503s and 504s per method must be the same on both
// sides; and every answer a node sent must be the one the ALB would have
// sent.
func crossCheck(ctx context.Context, lbs []*Balancer, byMethod, byTarget map[string]Counts, t infra.Timing) (map[string]Counts, []string) {
	var problems []string
	var albs, sent []map[string]Counts
	for _, b := range lbs {
		// A node logs an answer once it is sent: wait for the stragglers.
		if err := b.Log.Await(ctx, byTarget[b.URL()].Answered().Requests, t.StartTimeout); err != nil {
			problems = append(problems, fmt.Sprintf("balancer %s: %v", b.Name, err))
		}
		albs = append(albs, b.Log.ALB())
		sent = append(sent, b.Log.Sent())
		for msg, n := range b.Log.Mismatches() {
			problems = append(problems, fmt.Sprintf("balancer %s: %d× %s", b.Name, n, msg))
		}
	}
	alb, logged := sumByMethod(albs...), sumByMethod(sent...)
	for _, m := range methods(sumByMethod(byMethod, logged)) {
		l, n := byMethod[m], logged[m]
		if l.BadGateway != n.BadGateway || l.Unavailable != n.Unavailable || l.Timeout != n.Timeout {
			problems = append(problems, fmt.Sprintf("%s: the load saw %d 502, %d 503, %d 504; the balancer nodes logged %d, %d, %d",
				m, l.BadGateway, l.Unavailable, l.Timeout, n.BadGateway, n.Unavailable, n.Timeout))
		}
	}
	return alb, problems
}

func summarize(t infra.Timing) TimingSummary {
	return TimingSummary{
		Drain:              seconds(t.Drain),
		CheckInterval:      seconds(t.HealthCheckInterval),
		CheckTimeout:       seconds(t.HealthCheckTimeout),
		UnhealthyThreshold: t.UnhealthyThreshold,
		HealthyThreshold:   t.HealthyThreshold,
		WorstCaseDetection: seconds(t.WorstCaseDetection()),
		Reentry:            seconds(t.Reentry()),
		StopGracePeriod:    seconds(t.StopGracePeriod),
		WatchdogInterval:   seconds(t.WatchdogInterval),
		ServerDeployMin:    seconds(t.ServerDeployMin()),
	}
}
