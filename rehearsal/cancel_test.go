package rehearsal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// The deploy job's rollout step, cancelled as the runner cancels a job in
// the middle of a batch, then run again at once, converges: every server
// ends verified on the release, no request reaches nothing, and at no
// instant does the balancer hold more than -max-unavailable servers out,
// as its nodes' own logs tell it (not the rollout's).
//
// Everything the runner does is the runner's: the step's own `run:` text
// from deploy.yml, in its shell with its options, its environment's names;
// on the cancel, SIGINT to the step's shell alone, SIGTERM 7.5 s later if it
// still runs, and SIGKILL to whatever is left of the step's processes 10 s
// after the SIGINT (at once when the step has ended by then: the runner
// ends a finished step's orphans with the job). What the test supplies is
// what a runner's checkout and secrets would: Pulumi.prod.yaml naming the
// rehearsal's three servers, the release to ship, `go build` of
// cmd/rollout, the ssh configuration, the ELBv2 endpoint (the stand-in
// answering from the nodes' verdicts) and credentials.
//
// cmd/rollout runs production's timing, so the servers and nodes do too:
// scale 1, three servers, -max-unavailable 1 (a canary, then two batches).
func TestRunnerCancelConverges(t *testing.T) {
	const servers = 3
	needs.Have(t, needs.Docker, needs.HAProxy, needs.SSHD, needs.Tool("yq", "apt-get install yq"))
	require.NoError(t, CheckDocker(context.Background()), "this test needs a running Docker engine")
	dockerlock.Parallel(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	root := repoRoot(t)
	script := filepath.Join(t.TempDir(), "step.sh")
	require.NoError(t, os.WriteFile(script, []byte(rolloutStep(t, root)), 0o644))
	goDir := standInGo(ctx, t, root)

	profiles, err := Profiles(1, ProfileProd)
	require.NoError(t, err)
	p := profiles[0]
	require.Equal(t, infra.Prod(), p.Timing, "cmd/rollout runs production's timing: the servers and nodes must too")
	p.Name = "runner-cancel"
	const maxUnavailable = 1
	var first, second stepResult
	var most OutAtOnce
	p.steps = func(ctx context.Context, f *fleet) ([]DeployReport, error) {
		tm := f.p.Timing
		version := f.id + "-cancelled"
		dr := DeployReport{Deploy: 1, Version: version, ServerDeployMin: tm.ServerDeployMin().Seconds()}
		if err := f.img.tag(ctx, version); err != nil {
			return []DeployReport{dr}, err
		}
		checkout, err := runnerCheckout(f)
		if err != nil {
			return []DeployReport{dr}, err
		}
		sp := f.ro.ssh
		env := append(os.Environ(),
			"PATH="+goDir+string(os.PathListSeparator)+os.Getenv("PATH"),
			"RUNNER_TEMP="+filepath.Join(f.dir, "runner-temp"),
			"GITHUB_SHA="+version,
			fmt.Sprintf("MAX_UNAVAILABLE=%d", maxUnavailable),
			"MYTHEX_TARGET_GROUP_ARN="+rehearsalTargetGroup,
			fmt.Sprintf("MYTHEX_APP_PORT=%d", sp.port),
			"MYTHEX_IMAGE_PREFIX="+hooks.DefaultImagePrefix,
			"MYTHEX_SSH_CONFIG="+sp.config,
			"MYTHEX_REMOTE_RELEASES="+sp.releases,
			"MYTHEX_REMOTE_SUDO=",
			"AWS_ENDPOINT_URL_ELASTIC_LOAD_BALANCING_V2="+sp.health.URL,
			"AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
			"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
		if err := os.MkdirAll(filepath.Join(f.dir, "runner-temp"), 0o755); err != nil {
			return []DeployReport{dr}, err
		}
		names := map[string]string{}
		var s2 *server
		for _, s := range f.servers {
			names[s.addr] = s.name
			if s.name == "s2" {
				s2 = s
			}
		}
		err = observe(ctx, &dr, f.servers, f.lbs, f.load, tm, true, func() error {
			began := time.Now()
			defer func() { most = MostOut(f.lbs, names, began) }()
			run, err := startStep(script, checkout, env)
			if err != nil {
				return err
			}
			// The middle of the batch after the canary: a node has s2,
			// the second batch's server, out of rotation (its drain).
			wctx, stop := context.WithCancel(ctx)
			go func() {
				select {
				case <-run.done:
				case <-wctx.Done():
				}
				stop()
			}()
			_, err = f.lbs[0].Health.Await(wctx, s2.addr, tm.FailedRolloutMax(len(f.servers), maxUnavailable),
				func(h HostHealth) bool { return !h.Healthy })
			stop()
			if err != nil {
				run.killTree()
				first = run.result()
				return fmt.Errorf("s2 never left rotation during the first run: %w; its output:\n%s", err, first.output)
			}
			run.cancelAsTheRunner()
			first = run.result()
			// Again at once, as an on-call re-runs the job.
			run, err = startStep(script, checkout, env)
			if err != nil {
				return err
			}
			<-run.done
			run.killTree()
			second = run.result()
			if second.code != 0 {
				return fmt.Errorf("the second run exited %d:\n%s", second.code, second.output)
			}
			return nil
		})
		return []DeployReport{dr}, err
	}

	var progress bytes.Buffer
	c := Config{
		RepoRoot: root,
		Servers:  servers,
		Deploys:  1,
		Rate:     200,
		Scale:    1,
		Path:     "/work",
		Profiles: []string{ProfileProd},
		SSH:      true,
		WorkDir:  t.TempDir(),
		Progress: &progress,
	}
	require.NoError(t, c.Validate())
	rep, errs := c.run(ctx, []Profile{p}, false)
	require.NoError(t, errors.Join(errs...), "progress:\n%s\nfirst run:\n%s\nsecond run:\n%s", progress.String(), first.output, second.output)
	require.Len(t, rep.Profiles, 1)
	require.Len(t, rep.Profiles[0].Deploys, 1)
	d := rep.Profiles[0].Deploys[0]
	publish(t, "runner-cancel", fmt.Sprintf("The rollout step cancelled as the runner cancels it mid-batch, then run again (3 servers, -max-unavailable %d, production timing): first run exit %d, second exit %d; most servers out at once on the nodes: %d %v; %d requests, %d 502, %d 504; verified %s.\nFirst run's output:\n%s\nSecond run's output:\n%s",
		maxUnavailable, first.code, second.code, most.Most, most.Servers, d.Requests, d.BadGateway, d.Timeout, yesNo(d.Verified), first.output, second.output))

	assert.Equal(t, 130, first.code, "the rollout exits as SIGINT ends it:\n%s", first.output)
	assert.Regexp(t, `(?m)^s1\s+\S+\s+`+d.Version+`\s+yes\s+deploy: verified and back in service`, first.output)
	assert.Regexp(t, `(?m)^s2\s+\S+\s+\?\s+unknown\s+deploy in flight when cancelled: it runs on to its end on the server`, first.output)
	assert.Regexp(t, `(?m)^s3\s+.*not started \(cancelled\)`, first.output)
	assert.Regexp(t, `(?m)^s3\s+.*deploy: verified and back in service`, second.output)
	for _, s := range []string{"s1", "s2"} {
		assert.Regexp(t, `(?m)^`+s+`\s+.*skipped: already on `+d.Version, second.output, "the second run redeploys nothing the first finished")
	}
	assert.True(t, d.Verified, "every service on every server, on the release: %v", d.Problems)
	assert.Zero(t, d.ReachedNothing(), "502s and 504s: %+v", d.Counts)
	assert.LessOrEqual(t, most.Most, maxUnavailable, "servers out at once on the balancer's nodes, from %s: %v",
		most.At.Format(time.RFC3339Nano), most.Servers)
	assert.Equal(t, 1, most.Most, "the balancer saw the servers leave rotation")
}

// rolloutStep is the `run:` text of deploy.yml's rollout step.
func rolloutStep(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "deploy.yml"))
	require.NoError(t, err)
	var w struct {
		Jobs map[string]struct {
			Steps []struct{ Name, Run string }
		}
	}
	require.NoError(t, yaml.Unmarshal(b, &w))
	for _, s := range w.Jobs["rollout"].Steps {
		if s.Name == "Roll out, a canary then batches, rolled back on a failure" {
			return s.Run
		}
	}
	require.FailNow(t, "deploy.yml's rollout job has no rollout step")
	return ""
}

// standInGo builds cmd/rollout and returns a directory holding a `go` that
// answers the step's `go build -o FILE ./cmd/rollout` with that build.
func standInGo(ctx context.Context, t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "rollout.built")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/rollout")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/rollout: %s", out)
	stub := `#!/usr/bin/env bash
set -eu
[[ $# -eq 4 && "$1 $2 $4" == "build -o ./cmd/rollout" ]] || { echo "unexpected: go $*" >&2; exit 2; }
cp ` + bin + ` "$3"
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go"), []byte(stub), 0o755))
	return dir
}

// runnerCheckout is what the step's working directory holds on a runner,
// for the rehearsal's fleet: Pulumi.prod.yaml naming its servers, and the
// release to ship as hooks/.
func runnerCheckout(f *fleet) (string, error) {
	dir := filepath.Join(f.dir, "checkout")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("checkout: %w", err)
	}
	var b bytes.Buffer
	b.WriteString("config:\n  mythex-infra:instanceIds:\n")
	for _, s := range f.servers {
		fmt.Fprintf(&b, "    - %s\n", s.name)
	}
	if err := os.WriteFile(filepath.Join(dir, "Pulumi.prod.yaml"), b.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("checkout: %w", err)
	}
	if err := os.Symlink(f.ro.ssh.ship, filepath.Join(dir, "hooks")); err != nil {
		return "", fmt.Errorf("checkout: %w", err)
	}
	return dir, nil
}

// stepRun is the step's shell, in a process group of its own as a
// runner's step is.
type stepRun struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

type stepResult struct {
	code   int
	output string
}

func startStep(script, dir string, env []string) (*stepRun, error) {
	r := &stepRun{out: &syncBuffer{}, done: make(chan struct{})}
	r.cmd = exec.Command("bash", "--noprofile", "--norc", "-eo", "pipefail", script)
	r.cmd.Dir, r.cmd.Env = dir, env
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the step: %w", err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.done) }()
	return r, nil
}

// cancelAsTheRunner sends the runner's cancel: SIGINT to the step's shell,
// SIGTERM 7.5 s later if it still runs, and 10 s after the SIGINT (at once
// if the step has ended) SIGKILL to every process the step left.
func (r *stepRun) cancelAsTheRunner() {
	_ = r.cmd.Process.Signal(syscall.SIGINT)
	term := time.NewTimer(7500 * time.Millisecond)
	defer term.Stop()
	kill := time.NewTimer(10 * time.Second)
	defer kill.Stop()
	select {
	case <-r.done:
	case <-term.C:
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-kill.C:
		}
	}
	r.killTree()
	<-r.done
}

// killTree kills what is left of the step's processes.
func (r *stepRun) killTree() {
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
}

func (r *stepRun) result() stepResult {
	<-r.done
	code := 0
	var ee *exec.ExitError
	if errors.As(r.err, &ee) {
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	} else if r.err != nil {
		code = -1
	}
	return stepResult{code: code, output: r.out.String()}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
