package rehearsal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mythex/infra/infra"
)

// rollout runs the real hooks/rollout, the script CI runs: it walks the
// servers in order and stops at the first that fails. Its two seams are
// production's ssh and `aws elbv2 wait target-in-service`; the rehearsal
// plugs in its own through a loopback control endpoint, which two small
// generated commands call with curl:
//
//   - MYTHEX_DEPLOY_CMD SERVER ARGS... runs remote-deploy's work with that
//     simulated server's environment: the deploy hook for VERSION (the
//     rehearsal has no systemd for bootstrap), or remote-deploy itself for
//     --status and --rollback VERSION;
//   - MYTHEX_WAIT_IN_SERVICE SERVER returns once every balancer node has the
//     server back in rotation (HealthTracker).
//
// The endpoint also times each server, from its deploy starting to its
// return to service.
type rollout struct {
	script    string
	servers   []*server
	lbs       []*Balancer
	timing    infra.Timing
	deployCmd string
	waitCmd   string
	log       *os.File
	srv       *http.Server
	// ssh, when set, replaces both seams by production's path.
	ssh *sshPath
	// version is the one being rolled out.
	version string
	// release, when set, is shipped to each server just before its deploy
	// (ship); timing is then that release's. Both under mu.
	release string

	mu sync.Mutex
	// rollbacks counts the servers the rollout sent back to their release
	// before.
	rollbacks int
	// output is the last run's output (its tail).
	output string
	start  map[string]time.Time
	hook   map[string]float64
	total  map[string]float64
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
	batches := make([]string, len(tl.BatchesSeconds))
	for i, b := range tl.BatchesSeconds {
		batches[i] = fmt.Sprintf("%.1f", b)
	}
	return fmt.Sprintf("asking %.1fs before, batches %ss, %.1fs after", tl.BeforeSeconds, strings.Join(batches, " + "), tl.AfterSeconds)
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

// newRollout starts the control endpoint and writes the two commands into
// dir.
func newRollout(repo, dir string, servers []*server, lbs []*Balancer, t infra.Timing, sp *sshPath) (*rollout, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("rollout control endpoint: %w", err)
	}
	log, err := os.Create(filepath.Join(dir, "rollout.log"))
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("rollout log: %w", err)
	}
	r := &rollout{
		script:    filepath.Join(repo, "hooks", "rollout"),
		servers:   servers,
		lbs:       lbs,
		timing:    t,
		deployCmd: filepath.Join(dir, "deploy-server"),
		waitCmd:   filepath.Join(dir, "wait-in-service"),
		log:       log,
		ssh:       sp,
	}
	if sp != nil {
		r.script = filepath.Join(sp.ship, "rollout")
	}
	control := "http://" + l.Addr().String()
	for _, c := range []struct {
		path, doc, usage string
		min, max         int
		route            string
	}{
		{r.deployCmd, "the rollout's MYTHEX_DEPLOY_CMD: runs remote-deploy ARGS (VERSION, --status or --rollback VERSION) on the simulated SERVER",
			"SERVER ARGS...", 2, 3, "/deploy"},
		{r.waitCmd, "the rollout's MYTHEX_WAIT_IN_SERVICE: returns once every balancer node routes to SERVER", "SERVER", 1, 1, "/in-service"},
	} {
		if err := os.WriteFile(c.path, []byte(controlScript(c.doc, c.usage, c.min, c.max, control+c.route)), 0o755); err != nil {
			_ = l.Close()
			_ = log.Close()
			return nil, fmt.Errorf("rollout command: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /deploy", r.handleDeploy)
	mux.HandleFunc("POST /in-service", r.handleInService)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: t.HealthCheckTimeout}
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

// controlScript is a command the rollout calls: one curl to the control
// endpoint with the server and the other arguments as form values, whose
// answer (the hook's output, or why the server is not back) it prints; it
// fails when the endpoint does.
func controlScript(doc, usage string, minArgs, maxArgs int, url string) string {
	return `#!/usr/bin/env bash
# Generated by the rehearsal: ` + doc + `,
# through the rehearsal's loopback control endpoint.
set -euo pipefail

readonly CONTROL_URL="` + url + `"

err() {
  printf '%s\n' "$*" >&2
}

main() {
  local form=() arg
  if (($# < ` + fmt.Sprint(minArgs) + ` || $# > ` + fmt.Sprint(maxArgs) + `)); then
    err "usage: ${0##*/} ` + usage + `"
    exit 2
  fi
  form=(--data-urlencode "server=$1")
  shift
  for arg in "$@"; do
    form+=(--data-urlencode "arg=$arg")
  done
  curl --silent --show-error --fail-with-body "${form[@]}" "$CONTROL_URL"
}

main "$@"
`
}

func (r *rollout) close() {
	_ = r.srv.Close()
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

func (r *rollout) handleDeploy(w http.ResponseWriter, req *http.Request) {
	s, err := r.server(req.FormValue("server"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err := req.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	args := req.PostForm["arg"]
	switch {
	case len(args) == 1 && args[0] == "--status":
		r.handleStatus(w, req, s)
		return
	case len(args) == 2 && args[0] == "--rollback":
		r.handleRollback(w, req, s, args[1])
		return
	case len(args) != 1 || strings.HasPrefix(args[0], "-"):
		http.Error(w, fmt.Sprintf("remote-deploy arguments %q: want VERSION, --status or --rollback VERSION", args), http.StatusBadRequest)
		return
	}
	start := time.Now()
	r.mu.Lock()
	r.start[s.name] = start
	release, t := r.release, r.timing
	r.mu.Unlock()
	if release != "" {
		if err := s.ship(release); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	// The hook bounds itself; this bound only catches a hung one.
	ctx, cancel := context.WithTimeout(req.Context(), t.ServerDeployMax())
	defer cancel()
	err = s.hook(ctx, "deploy", args[0])
	r.mu.Lock()
	r.hook[s.name] = time.Since(start).Seconds()
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, "%s deployed in %.2fs (its log: %s)\n", s.name, time.Since(start).Seconds(), s.log.Name())
}

// handleStatus answers what remote-deploy --status prints on the server;
// its messages go to the server's log.
func (r *rollout) handleStatus(w http.ResponseWriter, req *http.Request, s *server) {
	r.mu.Lock()
	t := r.timing
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(req.Context(), t.ServerDeployMax())
	defer cancel()
	var out, errs bytes.Buffer
	cmd := s.Command(ctx, "remote-deploy", "--status")
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(s.log, &errs)
	if err := cmd.Run(); err != nil {
		http.Error(w, fmt.Sprintf("remote-deploy --status on %s: %v\n%s", s.name, err, tail(errs.Bytes(), 2000)), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(out.Bytes())
}

// handleRollback runs remote-deploy --rollback VERSION on the server, timed
// like a deploy.
func (r *rollout) handleRollback(w http.ResponseWriter, req *http.Request, s *server, version string) {
	start := time.Now()
	r.mu.Lock()
	// A rollback is not a deploy: the server's times stay its deploy's.
	delete(r.start, s.name)
	t := r.timing
	r.rollbacks++
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(req.Context(), t.ServerDeployMax())
	defer cancel()
	// Its log beside the server's, not in the repository's hooks/.
	var out bytes.Buffer
	cmd := s.Command(ctx, "remote-deploy", "--rollback", version)
	cmd.Env = append(cmd.Env, "MYTHEX_REMOTE_LOG_DIR="+s.Root)
	cmd.Stdout = io.MultiWriter(s.log, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		err = fmt.Errorf("remote-deploy --rollback %s on %s: %w\n%s", version, s.name, err, tail(out.Bytes(), 3000))
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, "%s back on %s in %.2fs (its log: %s)\n", s.name, version, time.Since(start).Seconds(), s.log.Name())
}

func (r *rollout) handleInService(w http.ResponseWriter, req *http.Request) {
	s, err := r.server(req.FormValue("server"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	r.mu.Lock()
	t := r.timing
	r.mu.Unlock()
	if err := awaitInService(req.Context(), r.lbs, s.addr, t.StartTimeout); err != nil {
		http.Error(w, err.Error(), http.StatusGatewayTimeout)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if start, ok := r.start[s.name]; ok {
		r.total[s.name] = time.Since(start).Seconds()
	}
	fmt.Fprintf(w, "%s in service on every balancer node\n", s.name)
}

// shipping makes the next runs ship release, of timing t, to each server
// just before its deploy, as the rollout ships a new release with its hooks.
func (r *rollout) shipping(release string, t infra.Timing) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.release, r.timing = release, t
}

// run rolls version across every server with the real rollout script,
// flags before the version, and returns, in server order, the seconds each
// server's deploy hook ran and the seconds until it was back in service,
// for the servers it finished. The rollout's output is kept (lastOutput).
func (r *rollout) run(ctx context.Context, version string, flags ...string) (hook, total []float64, err error) {
	r.mu.Lock()
	r.start, r.hook, r.total = map[string]time.Time{}, map[string]float64{}, map[string]float64{}
	r.version = version
	r.rollbacks = 0
	r.mu.Unlock()
	args := append(slices.Clone(flags), version)
	for _, s := range r.servers {
		args = append(args, s.name)
	}
	out := &ringBuffer{max: 64 << 10}
	cmd := exec.CommandContext(ctx, r.script, args...)
	cmd.Env = append(environWithout("MYTHEX_"),
		"MYTHEX_DEPLOY_CMD="+r.deployCmd,
		"MYTHEX_WAIT_IN_SERVICE="+r.waitCmd,
	)
	cmd.Stdout = io.MultiWriter(r.log, out)
	if r.ssh != nil {
		cmd.Env = append(environWithout("MYTHEX_", "PATH"), r.ssh.env...)
		cmd.Stdout = io.MultiWriter(r.log, out, &lineClock{r: r})
	}
	cmd.Stderr = cmd.Stdout
	began := time.Now()
	runErr := cmd.Run()
	ended := time.Now()
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
	if runErr != nil {
		return hook, total, fmt.Errorf("rollout %s: %w\n%s", version, runErr, out.String())
	}
	if len(total) != len(r.servers) {
		return hook, total, errors.New("rollout " + version + " succeeded but did not wait for every server to be back in service:\n" + out.String())
	}
	return hook, total, nil
}

// environWithout is the environment minus every variable starting with
// prefix, so the caller's settings never leak into a simulated server's.
func environWithout(prefix string, names ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(kv, prefix) && !slices.Contains(names, name) {
			env = append(env, kv)
		}
	}
	return env
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
