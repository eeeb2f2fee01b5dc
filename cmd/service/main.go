// Command service is Mythex's reference service: one small HTTP server that
// plays every role of a deploy (api, orchestrator, gateway, publish-worker)
// and drains the way a real Mythex service does, through package drain. The
// hooks' tests and the deploy rehearsal run it in every role.
//
// Usage:
//
//	service [-role R] [-version V] [-port P]   serve until SIGTERM, drain, exit 0
//	service check                              the container's health check
//
// Input comes from the environment the compose definition sets, flags
// overriding: MYTHEX_ROLE (api, orchestrator, gateway or publish-worker),
// MYTHEX_VERSION (the release compose started it as), MYTHEX_PORT (the port
// inside the container; 0 picks a free one, logged) and the drain variables
// of package drain (MYTHEX_HEALTH_PATH, MYTHEX_HEALTHY_STATUS, MYTHEX_DRAIN,
// MYTHEX_SHUTDOWN_TIMEOUT, MYTHEX_KEEPALIVE, MYTHEX_READ_HEADER_TIMEOUT,
// MYTHEX_READ_TIMEOUT, MYTHEX_WRITE_TIMEOUT, MYTHEX_MAX_HEADER_BYTES,
// MYTHEX_MAX_REQUEST). There are no defaults: every
// number comes from the timing contract, rendered into that environment. A
// rehearsal scales the timing by rendering infra.Prod().Scaled(f), so the
// service has no scale flag. Bad input exits 2 with every problem listed.
//
// Routes:
//
//	GET <MYTHEX_HEALTH_PATH>  MYTHEX_HEALTHY_STATUS while serving, 503 while draining
//	GET /work?ms=N            200 after N ms: the in-flight request maker;
//	                          400 unless 0 <= N <= MYTHEX_MAX_REQUEST
//	POST /work?ms=N           the same, after reading the request body: a
//	                          write a balancer must never send twice
//	GET /about                {"role","version","release","phase","instance","in_flight"}
//	anything else             404
//
// The version /about and /work report is the one built into the binary
// (go build -ldflags "-X main.version=V", as hooks.BuildImages does), not
// MYTHEX_VERSION: a deploy that compares it with the release it asked for
// catches an image tagged with the wrong version. MYTHEX_VERSION is reported
// as "release", and a mismatch is logged at start.
//
// `service check` asks http://127.0.0.1:$MYTHEX_PORT$MYTHEX_HEALTH_PATH and
// exits 0 if it answers MYTHEX_HEALTHY_STATUS, else 1 with a one-line reason.
// It is the HEALTHCHECK of a FROM scratch image, which has no shell or curl.
//
// Logs are JSON (log/slog) on stderr: every phase change with its duration,
// and every request cut at the shutdown timeout.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mythex/infra/drain"
)

// The service's own environment; the drain variables are package drain's.
const (
	EnvRole    = "MYTHEX_ROLE"
	EnvVersion = "MYTHEX_VERSION"
	EnvPort    = "MYTHEX_PORT"
)

// Exit codes. Docker reads a health check's 1 as unhealthy and reserves 2,
// so `service check` only ever exits 0 or 1.
const (
	exitOK        = 0
	exitFailed    = 1
	exitBadConfig = 2
)

// checkTimeout bounds `service check`'s request. A health answer comes from
// memory, so anything slower is unhealthy; Docker's own healthcheck timeout,
// rendered from the timing contract, still bounds the whole command.
const checkTimeout = 2 * time.Second

// version is the release this binary was built as, set at build time with
// -ldflags "-X main.version=V".
var version string

// unversioned is what a binary built without a version reports: it matches
// no release, so a deploy of such an image fails its version check.
const unversioned = "unversioned"

func builtVersion() string {
	if version == "" {
		return unversioned
	}
	return version
}

// roles are the parts a deploy verifies on every server.
var roles = []string{"api", "orchestrator", "gateway", "publish-worker"}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "check" {
		return check(args[1:], getenv, stdout)
	}
	s, err := loadSettings(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "service: %v\n", err)
		return exitBadConfig
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("role", s.role, "version", builtVersion())
	if s.release != builtVersion() {
		log.Warn("the binary's version is not the release it was started as: the image is mis-tagged",
			"release", s.release, "env", EnvVersion)
	}
	// The usual Go idiom: the drain library counts the SIGTERM that ends
	// this context and the one it receives itself as one stop request.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, s, log); err != nil {
		log.Error("service failed", "err", err)
		return exitFailed
	}
	return exitOK
}

// settings is everything the service runs with.
type settings struct {
	// release is what compose started this container as (MYTHEX_VERSION).
	role, release string
	port          int
	drain         drain.Config
}

// loadSettings reads the environment, lets flags override it, and reports
// every problem at once.
func loadSettings(args []string, getenv func(string) string, stderr io.Writer) (settings, error) {
	fs := flag.NewFlagSet("service", flag.ContinueOnError)
	fs.SetOutput(stderr)
	role := fs.String("role", getenv(EnvRole), "role to play: "+strings.Join(roles, ", ")+" (env "+EnvRole+")")
	release := fs.String("version", getenv(EnvVersion), "release compose started this instance as (env "+EnvVersion+")")
	port := fs.String("port", getenv(EnvPort), "port to listen on, 0 for any free one (env "+EnvPort+")")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: service [flags]   serve until SIGTERM\n       service check     health check of a running service\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return settings{}, err
	}

	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q (the only subcommand is check)", fs.Args()))
	}
	s := settings{role: *role, release: *release}
	if !slices.Contains(roles, s.role) {
		errs = append(errs, fmt.Errorf("role %q must be one of %s (-role or %s)", s.role, strings.Join(roles, ", "), EnvRole))
	}
	if strings.TrimSpace(s.release) == "" {
		errs = append(errs, fmt.Errorf("version must not be empty (-version or %s)", EnvVersion))
	}
	p, err := parsePort(*port)
	if err != nil {
		errs = append(errs, fmt.Errorf("port: %w (-port or %s)", err, EnvPort))
	}
	s.port = p
	s.drain, err = drain.ConfigFromEnv(getenv)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return settings{}, &configError{problems: flatten(errs)}
	}
	return s, nil
}

// configError lists every problem with the service's input, one a line.
type configError struct{ problems []error }

func (e *configError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid configuration, %d problem(s):", len(e.problems))
	for _, p := range e.problems {
		b.WriteString("\n  - " + p.Error())
	}
	return b.String()
}

func (e *configError) Unwrap() []error { return e.problems }

// flatten opens joined errors (and a wrapper around one, such as the drain
// config's), so each problem gets its own line.
func flatten(errs []error) []error {
	var out []error
	for _, err := range errs {
		inner := err
		if u, ok := err.(interface{ Unwrap() error }); ok && u.Unwrap() != nil {
			inner = u.Unwrap()
		}
		if j, ok := inner.(interface{ Unwrap() []error }); ok {
			out = append(out, flatten(j.Unwrap())...)
			continue
		}
		out = append(out, err)
	}
	return out
}

func parsePort(v string) (int, error) {
	if v == "" {
		return 0, errors.New("not set")
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 0 || p > 65535 {
		return 0, fmt.Errorf("%q must be a number from 0 to 65535", v)
	}
	return p, nil
}

// serve listens on every interface (inside a container the published port
// arrives on the container's own address) and runs until the drain is done.
func serve(ctx context.Context, s settings, log *slog.Logger) error {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(s.port))
	if err != nil {
		return fmt.Errorf("listen on port %d: %w", s.port, err)
	}
	instance, err := os.Hostname()
	if err != nil {
		instance = "unknown"
	}
	var srv *drain.Server
	mux := http.NewServeMux()
	mux.HandleFunc("GET /work", work(s))
	mux.HandleFunc("POST /work", work(s))
	mux.HandleFunc("GET /about", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"role": s.role, "version": builtVersion(), "release": s.release,
			"phase": srv.Phase().String(), "instance": instance,
			// Requests other than this one: what a drain is waiting for.
			"in_flight": srv.InFlight() - 1,
		})
	})
	srv, err = drain.New(s.drain, mux, drain.WithLogger(log))
	if err != nil {
		_ = ln.Close()
		return err
	}
	if err := srv.Run(ctx, ln); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// work answers after the latency the caller asks for, so a test or the
// rehearsal can hold requests in flight across a drain. The latency is at
// most the contract's MaxRequest (MYTHEX_MAX_REQUEST): past it the balancer
// has answered 504 and nobody waits for the answer, and a client could
// otherwise hold requests open past every deploy.
func work(s settings) http.HandlerFunc {
	most := s.drain.MaxRequest.Milliseconds()
	return func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.ParseInt(r.URL.Query().Get("ms"), 10, 64)
		if r.URL.Query().Get("ms") == "" {
			ms, err = 0, nil
		}
		if err != nil || ms < 0 || ms > most {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf(
				"ms must be a whole number of milliseconds from 0 to %d (%s, the longest request the balancer waits for)",
				most, drain.EnvMaxRequest)})
			return
		}
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			// The client or the balancer went away mid-body.
			return
		}
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			// Cut at the shutdown timeout or abandoned by the client: the
			// drain library logs the cut; there is no one to answer.
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"role": s.role, "version": builtVersion(), "ms": ms, "body_bytes": n})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// check is `service check`: exit 0 iff the running service's health route
// answers the healthy status.
func check(args []string, getenv func(string) string, stdout io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stdout, "unhealthy: "+format+"\n", a...)
		return exitFailed
	}
	if len(args) > 0 {
		return fail("check takes no arguments, got %q", args)
	}
	var problems []string
	port, err := parsePort(getenv(EnvPort))
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s %v", EnvPort, err))
	} else if port == 0 {
		problems = append(problems, EnvPort+" is 0: no port to check")
	}
	path := getenv(drain.EnvHealthPath)
	if !strings.HasPrefix(path, "/") {
		problems = append(problems, fmt.Sprintf("%s %q must start with /", drain.EnvHealthPath, path))
	}
	want, err := strconv.Atoi(getenv(drain.EnvHealthyStatus))
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s %q is not a status code", drain.EnvHealthyStatus, getenv(drain.EnvHealthyStatus)))
	}
	if len(problems) > 0 {
		return fail("%s", strings.Join(problems, "; "))
	}

	url := "http://127.0.0.1:" + strconv.Itoa(port) + path
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fail("GET %s: %v", url, err)
	}
	// The host's own check is no balancer node's: the drain must not count it.
	req.Header.Set(drain.HeaderSelfCheck, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	// The body says why (e.g. "draining" or "not ready"); one line of it is
	// enough for `docker inspect`.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	why := strings.TrimSpace(strings.SplitN(string(body), "\n", 2)[0])
	if resp.StatusCode != want {
		return fail("GET %s answered %d, want %d (%s)", url, resp.StatusCode, want, why)
	}
	fmt.Fprintf(stdout, "healthy: GET %s answered %d\n", url, resp.StatusCode)
	return exitOK
}
