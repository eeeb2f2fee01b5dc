package rehearsal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/hooks/sshd"
	"github.com/mythex/infra/hooks/targethealth"
)

// sshPath is production's path through hooks/rollout, for `rehearse -ssh`:
// the rollout's own ssh_deploy ships the release to each server over real
// ssh (a loopback sshd; each server is a Host entry, as each instance id is
// in production) and runs remote-deploy there, and its own
// aws_wait_in_service polls describe-target-health, answered from the
// balancer nodes' verdicts. The per-server time it measures then includes
// the polling production pays.
type sshPath struct {
	// ship is what the rollout runs from and ships: the hooks with the
	// profile's release files.
	ship   string
	env    []string
	sshd   *sshd.Server
	health *targethealth.Server
}

// rehearsalTargetGroup is the target group the stand-in answers for.
const rehearsalTargetGroup = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/rehearsal/0123456789abcdef"

// shipFiles are the repository's hooks a release holds besides the
// profile's rendered files (compose.yaml, its checksum, timing.env).
var shipFiles = []string{"rollout", "remote-deploy", "deploy", "bootstrap", "watchdog", "lib.sh",
	"mythex-watchdog.service", "mythex-watchdog.timer"}

// startSSHPath starts sshd and the describe-target-health stand-in for the
// servers, every one publishing api on port (each on its own loopback
// address, as each server has its own).
func startSSHPath(repo, dir, release string, servers []*server, lbs []*Balancer, port int) (_ *sshPath, err error) {
	p := &sshPath{ship: filepath.Join(dir, "ship")}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if err := os.MkdirAll(p.ship, 0o755); err != nil {
		return nil, fmt.Errorf("ship dir: %w", err)
	}
	copyFile := func(src, name string) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("ship %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(p.ship, name), b, 0o755); err != nil {
			return fmt.Errorf("ship %s: %w", name, err)
		}
		return nil
	}
	for _, name := range shipFiles {
		if err := copyFile(filepath.Join(repo, "hooks", name), name); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{hooks.ComposeFile, hooks.ChecksumFile, hooks.TimingEnvFile} {
		if err := copyFile(filepath.Join(release, name), name); err != nil {
			return nil, err
		}
	}
	sshdDir := filepath.Join(dir, "sshd")
	if err := os.MkdirAll(sshdDir, 0o700); err != nil {
		return nil, fmt.Errorf("sshd dir: %w", err)
	}
	if p.sshd, err = sshd.Start(sshdDir, time.Minute); err != nil {
		return nil, err
	}
	var hosts []sshd.Host
	for _, s := range servers {
		hosts = append(hosts, sshd.Host{Name: s.name, Root: s.Root, Project: s.Project, Bind: s.Bind})
	}
	config, err := p.sshd.WriteClientConfig(sshdDir, p.sshd.KnownHosts(), "", hosts...)
	if err != nil {
		return nil, err
	}
	for _, h := range hosts {
		if err := sshd.CheckSession(config, h); err != nil {
			return nil, err
		}
	}
	if p.health, err = targethealth.Start(func(c targethealth.Call) (targethealth.Health, error) {
		return targetHealth(c, servers, lbs, port)
	}); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, fmt.Errorf("bin dir: %w", err)
	}
	if _, err := p.health.WriteCLI(bin); err != nil {
		return nil, err
	}
	p.env = []string{
		"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"MYTHEX_SSH_CONFIG=" + config,
		"MYTHEX_REMOTE_RELEASES=" + filepath.Join(dir, "releases"),
		"MYTHEX_REMOTE_SUDO=",
		"MYTHEX_APP_PORT=" + strconv.Itoa(port),
		"MYTHEX_TARGET_GROUP_ARN=" + rehearsalTargetGroup,
	}
	return p, nil
}

// targetHealth answers for one target as the target group would: healthy
// once every balancer node routes to it.
func targetHealth(c targethealth.Call, servers []*server, lbs []*Balancer, port int) (targethealth.Health, error) {
	if c.TargetGroupARN != rehearsalTargetGroup {
		return targethealth.Health{}, errors.New("TargetGroupNotFound: " + c.TargetGroupARN)
	}
	for _, s := range servers {
		if s.name != c.ID || c.Port != port {
			continue
		}
		var out []string
		for _, b := range lbs {
			if h, ok := b.Health.Get(s.addr); !ok || !h.Healthy {
				out = append(out, b.Name)
			}
		}
		if len(out) == 0 {
			return targethealth.Health{State: targethealth.Healthy}, nil
		}
		return targethealth.Health{State: targethealth.Unhealthy, Reason: "Target.FailedHealthChecks",
			Description: "out of rotation on " + strings.Join(out, ", ")}, nil
	}
	return targethealth.Health{State: targethealth.Unused, Reason: "Target.NotRegistered",
		Description: "Target is not registered to the target group"}, nil
}

func (p *sshPath) close() {
	if p.health != nil {
		_ = p.health.Close()
	}
	if p.sshd != nil {
		p.sshd.Stop()
	}
}

// sshAddresses gives every server the first one's app port, as the rollout
// passes one port to all, each on its own loopback address (127.0.0.N), as
// each server has its own.
func sshAddresses(servers []*server) {
	port := servers[0].AppPort
	for i, s := range servers {
		s.Bind = "127.0.0." + strconv.Itoa(i+1)
		s.AppPort = port
		s.addr = s.Bind + ":" + strconv.Itoa(port)
	}
}

// lineClock times the rollout's servers from its own output, as CI would
// see them: from "[n/K] deploying" to "waiting until" (the deploy) and to
// "back in service" (the whole server).
type lineClock struct {
	r       *rollout
	partial []byte
}

func (w *lineClock) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
}

func (w *lineClock) line(l string) {
	_, msg, ok := strings.Cut(l, " rollout: ")
	if !ok {
		return
	}
	now := time.Now()
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	for _, s := range w.r.servers {
		switch {
		case strings.HasSuffix(msg, " deploying "+w.r.version+" to "+s.name) && strings.HasPrefix(msg, "["):
			w.r.start[s.name] = now
		case strings.HasSuffix(msg, " waiting until the load balancer has "+s.name+" back in service"):
			if start, ok := w.r.start[s.name]; ok {
				w.r.hook[s.name] = now.Sub(start).Seconds()
			}
		case strings.HasPrefix(msg, s.name+" back in service after "):
			if start, ok := w.r.start[s.name]; ok {
				w.r.total[s.name] = now.Sub(start).Seconds()
			}
		}
	}
}
