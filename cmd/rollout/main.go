// Command rollout rolls a release across the servers from CI, in batches,
// and rolls it back when a server fails (package rollout holds the rules).
// The servers are reached over ssh (hooks/remote-deploy, shipped with every
// call) and their re-entry is the target group's verdict
// (DescribeTargetHealth). Every bound comes from the timing contract.
//
// SIGINT or SIGTERM (a cancelled CI job) starts nothing new, leaves the
// deploys in flight to finish on their servers, and prints the table at
// once; a second signal has nothing more to stop.
//
// Exit status: 0 every server runs VERSION, verified and in service; 1 a
// server failed (the table says where each is); 2 bad input, nothing done;
// 128+N stopped by signal N.
//
// Usage, from the repository root:
//
//	go run ./cmd/rollout [-max-unavailable N|P%] [-no-rollback] [-json FILE] VERSION SERVER...
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/cmdflag"
	"github.com/mythex/infra/rollout"
)

func main() {
	ctx, stoppedBy, stop := cancelOnSignal(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, stoppedBy)
	stop()
	os.Exit(code)
}

// stopSignal is the signal that cancelled the rollout, for the exit status;
// none until one came.
type stopSignal struct{ n atomic.Int32 }

func (s *stopSignal) set(sig syscall.Signal) { s.n.Store(int32(sig)) }

// get is the signal recorded; false when none was (a nil s records none).
func (s *stopSignal) get() (syscall.Signal, bool) {
	if s == nil {
		return 0, false
	}
	n := s.n.Load()
	return syscall.Signal(n), n != 0
}

// cancelOnSignal is a context cancelled by the first of sigs, and the
// record of that signal, set before the cancel: whatever sees the cancel
// finds it. (A second channel read with select…default, which the runtime
// may feed after the first, let a rollout that ended on the cancel exit 1.)
// Later signals are swallowed until stop: the first stopped all there is.
func cancelOnSignal(parent context.Context, sigs ...os.Signal) (context.Context, *stopSignal, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	by := &stopSignal{}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case s := <-ch:
			if n, ok := s.(syscall.Signal); ok {
				by.set(n)
			}
			cancel(fmt.Errorf("%v signal received", s))
		case <-ctx.Done():
		}
	}()
	return ctx, by, func() {
		signal.Stop(ch)
		cancel(nil)
	}
}

var serverRE = regexp.MustCompile(`^[A-Za-z0-9_.@-]+$`)
var versionRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// run is the command on args; ctx ends on a cancel, and stoppedBy names
// the signal that ended it, if one did (nil: none).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, stoppedBy *stopSignal) int {
	// The servers' calls, the log and the re-entry waits write side by
	// side: one lock for both streams, as a terminal shows them.
	var mu sync.Mutex
	stdout, stderr = &lockedWriter{mu: &mu, w: stdout}, &lockedWriter{mu: &mu, w: stderr}
	fs := cmdflag.New("rollout", "[-max-unavailable N|P%] [-no-rollback] [-json FILE] VERSION SERVER...")
	maxU := fs.String("max-unavailable", strconv.Itoa(infra.DefaultMaxUnavailable),
		"servers out of service at once after the canary, counting those already out: a count, or a percentage of the servers rounded down (at least 1)")
	noRollback := fs.Bool("no-rollback", false, "leave every server where it is when one fails, for debugging")
	jsonFile := fs.String("json", "", "also write what happened to every server as JSON to this file")
	hooksDir := fs.String("hooks", "hooks", "the release's files (the hooks and the compose definition)")
	tgARN := fs.String("target-group-arn", os.Getenv("MYTHEX_TARGET_GROUP_ARN"), "the target group the servers are in (default $MYTHEX_TARGET_GROUP_ARN)")
	port := fs.String("port", os.Getenv("MYTHEX_APP_PORT"), "the target group's port, the app's (default $MYTHEX_APP_PORT)")
	endpoint := fs.String("elb-endpoint", "", "the ELBv2 endpoint (a stand-in's URL); default AWS's own")
	sshConfig := fs.String("ssh-config", os.Getenv("MYTHEX_SSH_CONFIG"), "ssh's configuration file (default $MYTHEX_SSH_CONFIG, else ssh's own)")
	remoteReleases := fs.String("remote-releases", envOr("MYTHEX_REMOTE_RELEASES", "/opt/mythex/incoming"),
		"where releases are unpacked on a server (default $MYTHEX_REMOTE_RELEASES, else /opt/mythex/incoming)")
	sudo := "sudo"
	if v, ok := os.LookupEnv("MYTHEX_REMOTE_SUDO"); ok {
		sudo = v
	}
	remoteSudo := fs.String("remote-sudo", sudo, "how the remote commands become root; empty runs them as the ssh user (default $MYTHEX_REMOTE_SUDO when set, even empty, else sudo)")
	imagePrefix := fs.String("image-prefix", envOr("MYTHEX_IMAGE_PREFIX", "mythex"), "the images' prefix, passed to deploy")
	if code, exit := cmdflag.Parse(fs, args, stdout, stderr); exit {
		return code
	}
	var problems []string
	if fs.NArg() < 2 {
		problems = append(problems, "name a VERSION and at least one SERVER")
	}
	version, servers := fs.Arg(0), fs.Args()[min(1, fs.NArg()):]
	if fs.NArg() >= 1 && !versionRE.MatchString(version) {
		problems = append(problems, fmt.Sprintf("VERSION %q is not a valid image tag (letters, digits, _ . -; it names a directory on each server)", version))
	}
	for _, s := range servers {
		if strings.HasPrefix(s, "-") || !serverRE.MatchString(s) {
			problems = append(problems, fmt.Sprintf("SERVER %q may hold only letters, digits and _ . @ -, and not start with -", s))
		}
	}
	n, err := rollout.ParseMaxUnavailable(*maxU, len(servers))
	if err != nil {
		problems = append(problems, err.Error())
	} else if err := infra.CheckRollout(len(servers), n); err != nil {
		problems = append(problems, err.Error())
	}
	p, perr := strconv.Atoi(*port)
	if perr != nil || p < 1 || p > 65535 {
		problems = append(problems, fmt.Sprintf("-port %q must be a port number (the target group's port)", *port))
	}
	if *tgARN == "" {
		problems = append(problems, "-target-group-arn is not set (nor MYTHEX_TARGET_GROUP_ARN)")
	}
	if !strings.HasPrefix(*remoteReleases, "/") {
		problems = append(problems, fmt.Sprintf("-remote-releases %q must be an absolute path", *remoteReleases))
	}
	for _, f := range rollout.ReleaseFiles {
		if _, err := os.Stat(*hooksDir + "/" + f); err != nil {
			problems = append(problems, fmt.Sprintf("-hooks %q: %v", *hooksDir, err))
			break
		}
	}
	tm := infra.Prod()
	if err := tm.Validate(); err != nil {
		problems = append(problems, err.Error())
	}
	cfg := rollout.Config{Version: version, Servers: servers, MaxUnavailable: n, NoRollback: *noRollback, Timing: tm, Log: stdout}
	if len(problems) == 0 {
		awsCfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			problems = append(problems, fmt.Sprintf("AWS configuration: %v", err))
		}
		client := elasticloadbalancingv2.NewFromConfig(awsCfg, func(o *elasticloadbalancingv2.Options) {
			if *endpoint != "" {
				o.BaseEndpoint = aws.String(*endpoint)
			}
		})
		cfg.Transport = rollout.SSH{HooksDir: *hooksDir, Version: version, Config: *sshConfig, RemoteReleases: *remoteReleases,
			Sudo: strings.Fields(*remoteSudo), AppPort: p, ImagePrefix: *imagePrefix, Timing: tm, Stdout: stdout, Stderr: stderr}
		cfg.Balancer = rollout.ELB{API: client, TargetGroupARN: *tgARN, Port: p, Timing: tm, Log: stdout}
		if err := cfg.Check(); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		fmt.Fprintln(stderr, "rollout: nothing deployed:")
		for _, p := range problems {
			fmt.Fprintf(stderr, "  %s\n", p)
		}
		fs.Usage()
		return 2
	}
	rep := rollout.Run(ctx, cfg)
	code := rep.Code()
	if err := rep.WriteTable(stdout); err != nil {
		fmt.Fprintf(stderr, "rollout: %v\n", err)
	}
	if *jsonFile != "" {
		if err := writeJSON(*jsonFile, rep); err != nil {
			fmt.Fprintf(stderr, "rollout: %v\n", err)
			code = max(code, 1)
		}
	}
	if rep.Outcome == rollout.Cancelled {
		if sig, ok := stoppedBy.get(); ok {
			fmt.Fprintf(stderr, "rollout: stopped by %v; run the same rollout again to go on\n", sig)
			return 128 + int(sig)
		}
		return 1
	}
	return code
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func writeJSON(path string, rep rollout.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("the -json report: %w", err)
	}
	werr := rep.WriteJSON(f)
	cerr := f.Close()
	return errors.Join(werr, cerr)
}
