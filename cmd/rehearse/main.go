// Command rehearse rehearses rolling deploys through a real load balancer and
// counts the requests that reached nothing.
//
// It starts K simulated servers (compose projects deployed by the real
// hooks) behind two HAProxy nodes health-checking them with the timing
// contract's numbers, sends R requests per second through both, and deploys
// a new version across every server D times, with the watchdog running on
// every server. Every duration is scaled by one factor so a deploy takes
// seconds. It runs the prod profile (our timing) and the before profile (the
// old 5 s drain against a balancer that took a minute to notice), prints a
// table per profile (or JSON with -json), and exits 1 unless prod has no 502
// or 504, every service verified after every deploy and no watchdog restart,
// and before shows the bug. -matrix runs the invariant matrix instead: prod
// and one profile per relation a rehearsal can break, each judged on the
// symptom users would see, and a balancer node slower than its numbers,
// once against the fixed drain (which must show 502s) and once against the
// evidence drain (which must show none). -transition rolls a
// change of the timing out in both orders (`pulumi up` reloading the
// balancer nodes, and the rollout of the new release), and exits 1 unless
// the order infra.CheckTransition calls safe shows no 502 and the other
// shows 502s. -fleet rehearses the rollout's batches and rollback: a good
// release in batches of -max-unavailable after a one-server canary, then a
// release whose api never becomes healthy and one whose api crashes once,
// each of which the canary must catch and roll back, with no 502 or 504
// throughout. -slots measures the slots design's prototype
// (docs/capacity.md): every server two slots, each release swapped in
// through the idle one, with no 502 or 504 and every node routing to every
// server throughout. Every rehearsal first takes the machine-wide lock the
// Docker-driven test suites take turns on, waiting for them if one runs.
//
//	go run ./cmd/rehearse -servers 3 -deploys 20 -rate 200
//	go run ./cmd/rehearse -matrix -servers 2 -deploys 1
//	go run ./cmd/rehearse -transition
//	go run ./cmd/rehearse -fleet -servers 6 -max-unavailable 2 -scale 1
//	go run ./cmd/rehearse -slots -servers 4
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/cmdflag"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/rehearsal"
)

const module = "module github.com/mythex/infra"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := cmdflag.New("rehearse", "[-profiles LIST | -matrix | -transition | -fleet | -slots] [flags]")
	c := rehearsal.Config{Progress: stderr}
	var profiles string
	var asJSON, matrix, transition, fleet, slots bool
	fs.IntVar(&c.Servers, "servers", 3, fmt.Sprintf("servers (K), each a compose project of four services (%d with -transition)", rehearsal.TransitionServers))
	fs.IntVar(&c.Nodes, "nodes", rehearsal.DefaultNodes, fmt.Sprintf("balancer nodes, each checking every server on its own (%d with -transition)", rehearsal.TransitionNodes))
	fs.IntVar(&c.Deploys, "deploys", 3, "rolling deploys per profile (D)")
	fs.IntVar(&c.Rate, "rate", 200, "requests per second (R), spread over both balancer nodes")
	fs.Float64Var(&c.Scale, "scale", 0.2, "factor on every duration; must make StopGracePeriod whole seconds")
	fs.StringVar(&profiles, "profiles", rehearsal.ProfileProd+","+rehearsal.ProfileBefore, "profiles to run, in order: "+rehearsal.ProfileProd+", "+rehearsal.ProfileBefore+" (the article's old 5 s drain), "+rehearsal.ProfileEvidence+" (prod with balancer nodes the servers tell apart: the evidence drain)")
	fs.StringVar(&c.Path, "path", "/work", "route the load asks through the balancers (GET and POST, short and long)")
	fs.StringVar(&c.WorkDir, "workdir", "", "keep servers' directories, balancer configs and logs here (default: a temporary directory, removed)")
	fs.StringVar(&c.RepoRoot, "repo", "", "repository root (default: found from the working directory)")
	fs.StringVar(&c.HAProxy, "haproxy", "", "HAProxy binary (default: haproxy on PATH; "+rehearsal.HAProxyInstall+")")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fs.BoolVar(&matrix, "matrix", false, "run the invariant matrix instead of -profiles: prod, one profile per breakable relation, and a balancer node acting "+rehearsal.LaggingLag(infra.Prod()).String()+" (scaled) late against the fixed and the evidence drain, each judged on its symptom")
	fs.BoolVar(&transition, "transition", false, "roll a change of the timing out in both orders instead of -profiles (-deploys does not apply): pulumi up (the balancer nodes reload) and the rollout of the new release, each order judged against infra.CheckTransition")
	fs.BoolVar(&fleet, "fleet", false, fmt.Sprintf("rehearse fleet rollouts instead of -profiles (-deploys does not apply): a good release in batches, then two broken ones the canary must catch and roll back (%d servers, -max-unavailable %s, -scale %g, unless set)",
		rehearsal.DefaultFleetServers, rehearsal.DefaultFleetMaxUnavailable, rehearsal.DefaultFleetScale))
	fs.BoolVar(&slots, "slots", false, fmt.Sprintf("measure the slots design's prototype (-deploys does not apply; -profiles "+rehearsal.ProfileEvidence+" names the nodes, so the old slot's drain may end on evidence): each server two slots behind every node, a release swapped in through the idle one, the canary then every other server at once (%d servers, -scale 1, unless set; docs/capacity.md)",
		rehearsal.DefaultSlotsServers))
	fs.StringVar(&c.MaxUnavailable, "max-unavailable", "", "the rollout's -max-unavailable, a count or a percentage: servers deployed at once after the canary (default: the rollout's, one at a time)")
	fs.BoolVar(&c.SSH, "ssh", false, "deploy through the rollout's ssh transport (a loopback sshd) and await re-entry with its describe-target-health client, answered from the balancer nodes: production's path")
	if code, exit := cmdflag.Parse(fs, args, stdout, stderr); exit {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rehearse: unexpected arguments %q\n", fs.Args())
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.Profiles = strings.Split(profiles, ",")
	if c.RepoRoot == "" {
		root, err := findRepo()
		if err != nil {
			fmt.Fprintf(stderr, "rehearse: %v\n", err)
			return 2
		}
		c.RepoRoot = root
	}
	if count(transition, fleet, slots) > 1 {
		fmt.Fprintln(stderr, "rehearse: -transition, -fleet and -slots are each a rehearsal of its own; run one at a time")
		return 2
	}
	if slots {
		return runSlots(c, set, asJSON, stdout, stderr)
	}
	if transition {
		return runTransition(c, set, asJSON, stdout, stderr)
	}
	if fleet {
		return runFleet(c, set, asJSON, stdout, stderr)
	}
	validate := c.Validate
	if matrix {
		validate = c.ValidateMatrix
	}
	if err := validate(); err != nil {
		fmt.Fprintf(stderr, "rehearse: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !takeDocker(ctx, stderr) {
		return 1
	}
	if matrix {
		return runMatrix(ctx, c, asJSON, stdout, stderr)
	}
	rep, runErr := rehearsal.Run(ctx, c)
	write := rep.WriteTable
	if asJSON {
		write = rep.WriteJSON
	}
	if len(rep.Profiles) > 0 {
		if err := write(stdout); err != nil {
			fmt.Fprintf(stderr, "rehearse: %v\n", err)
			return 1
		}
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "rehearse: %v\n", runErr)
		return 1
	}
	if err := rep.Check(); err != nil {
		fmt.Fprintf(stderr, "rehearse: FAILED:\n%v\n", err)
		return 1
	}
	return 0
}

// runTransition rehearses the timing change in both orders, prints it, and
// exits 1 unless each order shows what infra.CheckTransition says of it.
func runTransition(c rehearsal.Config, set map[string]bool, asJSON bool, stdout, stderr io.Writer) int {
	if refused(set, stderr, "-transition rolls one change out once per order") {
		return 2
	}
	if !set["servers"] {
		c.Servers = rehearsal.TransitionServers
	}
	if !set["nodes"] {
		c.Nodes = rehearsal.TransitionNodes
	}
	if err := c.ValidateTransition(); err != nil {
		fmt.Fprintf(stderr, "rehearse: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !takeDocker(ctx, stderr) {
		return 1
	}
	r, err := rehearsal.RunTransition(ctx, c)
	if code := printed(len(r.Orders) > 0, err, stdout, stderr, pick(asJSON, r.WriteJSON, r.WriteTable)); code != 0 {
		return code
	}
	for _, o := range r.Orders {
		if o.Error != "" {
			fmt.Fprintf(stderr, "rehearse: %s: %s\n", o.Order, o.Error)
		}
	}
	if r.Failed() {
		fmt.Fprintln(stderr, "rehearse: FAILED: an order did not show what infra.CheckTransition says of it")
		return 1
	}
	return 0
}

// runFleet rehearses the fleet scenarios, prints them, and exits 1 unless
// every scenario passes.
func runFleet(c rehearsal.Config, set map[string]bool, asJSON bool, stdout, stderr io.Writer) int {
	if refused(set, stderr, "-fleet rolls each scenario's release out once") {
		return 2
	}
	if !set["servers"] {
		c.Servers = rehearsal.DefaultFleetServers
	}
	if !set["max-unavailable"] {
		c.MaxUnavailable = rehearsal.DefaultFleetMaxUnavailable
	}
	if !set["scale"] {
		c.Scale = rehearsal.DefaultFleetScale
	}
	return rehearseOnce(c.ValidateFleet(), asJSON, stdout, stderr, func(ctx context.Context) outcome {
		r, err := rehearsal.RunFleet(ctx, c)
		o := outcome{ran: len(r.Rows) > 0, err: err, json: r.WriteJSON, table: tables(r.WriteTable, r.Report.WriteTable)}
		if r.Failed() {
			o.failed = "a fleet scenario did not show what it must"
		}
		return o
	})
}

// count is how many of bs are true.
func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// runSlots measures the slots prototype's scenarios, prints them, and exits
// 1 unless every one passes.
func runSlots(c rehearsal.Config, set map[string]bool, asJSON bool, stdout, stderr io.Writer) int {
	// -profiles picks the nodes: prod's, or evidence's, which the servers
	// tell apart.
	if refused(set, stderr, "-slots swaps each server once", "profiles") {
		return 2
	}
	if !set["profiles"] {
		c.Profiles = nil
	}
	if !set["servers"] {
		c.Servers = rehearsal.DefaultSlotsServers
	}
	if !set["scale"] {
		c.Scale = 1
	}
	return rehearseOnce(c.ValidateSlots(), asJSON, stdout, stderr, func(ctx context.Context) outcome {
		r, err := rehearsal.RunSlots(ctx, c)
		o := outcome{ran: len(r.Rows) > 0, err: err, json: r.WriteJSON, table: tables(r.WriteTable, r.Report.WriteTable)}
		if r.Failed() {
			o.failed = "a slots scenario did not show what it must"
		}
		return o
	})
}

// outcome is what a rehearsal of its own kind reported: whether it ran far
// enough to print, how it ended, its two writers, and why it failed ("" when
// it passed).
type outcome struct {
	ran         bool
	err         error
	json, table func(io.Writer) error
	failed      string
}

// rehearseOnce runs a rehearsal of its own kind once valid is nil: it takes
// the machine-wide Docker lock, runs it until an interrupt, prints what it
// reported and exits 1 when it failed.
func rehearseOnce(valid error, asJSON bool, stdout, stderr io.Writer, run func(context.Context) outcome) int {
	if valid != nil {
		fmt.Fprintf(stderr, "rehearse: %v\n", valid)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !takeDocker(ctx, stderr) {
		return 1
	}
	o := run(ctx)
	if code := printed(o.ran, o.err, stdout, stderr, pick(asJSON, o.json, o.table)); code != 0 {
		return code
	}
	if o.failed != "" {
		fmt.Fprintln(stderr, "rehearse: FAILED: "+o.failed)
		return 1
	}
	return 0
}

// tables writes each table in turn.
func tables(ws ...func(io.Writer) error) func(io.Writer) error {
	return func(w io.Writer) error {
		for _, write := range ws {
			if err := write(w); err != nil {
				return err
			}
		}
		return nil
	}
}

// takeDocker takes the machine-wide lock the Docker-driven test suites
// take turns on (internal/dockerlock) and keeps it until the command exits:
// a rehearsal run beside the suites waits for them, and they for it,
// instead of both loading the machine. It says so when it waits; false
// when the wait ended first (an interrupt).
func takeDocker(ctx context.Context, stderr io.Writer) bool {
	err := dockerlock.Take(ctx, func(format string, args ...any) {
		fmt.Fprintf(stderr, "rehearse: "+format+"\n", args...)
	})
	if err != nil {
		fmt.Fprintf(stderr, "rehearse: the machine-wide Docker lock: %v\n", err)
		return false
	}
	return true
}

// refused reports, for a rehearsal that runs without them, each of -matrix,
// -profiles, -deploys and -ssh that was set, but those it takes.
func refused(set map[string]bool, stderr io.Writer, why string, takes ...string) bool {
	var clash []string
	for _, name := range []string{"matrix", "profiles", "deploys", "ssh"} {
		if set[name] && !slices.Contains(takes, name) {
			clash = append(clash, "-"+name)
		}
	}
	if len(clash) == 0 {
		return false
	}
	fmt.Fprintf(stderr, "rehearse: %s; it does not take %s\n", why, strings.Join(clash, ", "))
	return true
}

// pick is the JSON writer with -json, else the table's.
func pick(asJSON bool, json, table func(io.Writer) error) func(io.Writer) error {
	if asJSON {
		return json
	}
	return table
}

// printed writes a rehearsal's report when it ran, then says how the run
// ended: 1 when writing or the run failed, else 0.
func printed(ran bool, runErr error, stdout, stderr io.Writer, write func(io.Writer) error) int {
	if ran {
		if err := write(stdout); err != nil {
			fmt.Fprintf(stderr, "rehearse: %v\n", err)
			return 1
		}
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "rehearse: %v\n", runErr)
		return 1
	}
	return 0
}

// runMatrix runs the invariant matrix, prints it, and exits 1 unless every
// row's verdict is pass.
func runMatrix(ctx context.Context, c rehearsal.Config, asJSON bool, stdout, stderr io.Writer) int {
	m, err := rehearsal.RunMatrix(ctx, c)
	if code := printed(len(m.Rows) > 0, err, stdout, stderr, pick(asJSON, m.WriteJSON, m.WriteTable)); code != 0 {
		return code
	}
	if m.Failed() {
		fmt.Fprintln(stderr, "rehearse: FAILED: a row's verdict is not pass")
		return 1
	}
	return 0
}

// findRepo walks up from the working directory to this module's go.mod.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the repository: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte(module)) {
			return dir, nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("find the repository: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the repository (no go.mod of github.com/mythex/infra above the working directory); use -repo")
		}
		dir = parent
	}
}
