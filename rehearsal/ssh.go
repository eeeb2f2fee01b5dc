package rehearsal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/hooks/sshd"
	"github.com/mythex/infra/hooks/targethealth"
	"github.com/mythex/infra/infra"
	rolloutpkg "github.com/mythex/infra/rollout"
)

// sshPath is production's path through the rollout, for `rehearse -ssh`:
// rollout.SSH ships the release to each server over real ssh (a loopback
// sshd; each server is a Host entry, as each instance id is in production)
// and runs remote-deploy there, and rollout.ELB awaits re-entry through the
// AWS SDK's describe-target-health, asking a stand-in that answers from
// the balancer nodes' verdicts. The per-server time it measures then
// includes the polling production pays.
type sshPath struct {
	// ship is what the rollout ships: the release's files, the hooks with
	// the profile's rendered ones.
	ship     string
	config   string // ssh -F
	releases string // where the servers unpack a release
	port     int    // every server's app port, the target group's
	sshd     *sshd.Server
	health   *targethealth.Server
	// elb is the SDK's client to the stand-in.
	elb *elasticloadbalancingv2.Client
}

// rehearsalTargetGroup is the target group the stand-in answers for.
const rehearsalTargetGroup = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/rehearsal/0123456789abcdef"

// rendered are the release's files the profile renders; the rest of
// rollout.ReleaseFiles are the repository's hooks.
var rendered = []string{hooks.ComposeFile, hooks.ChecksumFile, hooks.TimingEnvFile}

// startSSHPath starts sshd and the describe-target-health stand-in for the
// servers, every one publishing api on port (each on its own loopback
// address, as each server has its own).
func startSSHPath(repo, dir, release string, servers []*server, lbs []*Balancer, port int) (_ *sshPath, err error) {
	p := &sshPath{ship: filepath.Join(dir, "ship"), releases: filepath.Join(dir, "releases"), port: port}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if err := os.MkdirAll(p.ship, 0o755); err != nil {
		return nil, fmt.Errorf("ship dir: %w", err)
	}
	for _, name := range rolloutpkg.ReleaseFiles {
		src := filepath.Join(repo, "hooks", name)
		if slices.Contains(rendered, name) {
			src = filepath.Join(release, name)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("ship %s: %w", name, err)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return nil, fmt.Errorf("ship %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(p.ship, name), b, fi.Mode().Perm()); err != nil {
			return nil, fmt.Errorf("ship %s: %w", name, err)
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
	if p.config, err = p.sshd.WriteClientConfig(sshdDir, p.sshd.KnownHosts(), "", hosts...); err != nil {
		return nil, err
	}
	for _, h := range hosts {
		if err := sshd.CheckSession(p.config, h); err != nil {
			return nil, err
		}
	}
	if p.health, err = targethealth.Start(func(c targethealth.Call) (targethealth.Health, error) {
		return targetHealth(c, servers, lbs, port)
	}); err != nil {
		return nil, err
	}
	p.elb = elasticloadbalancingv2.New(elasticloadbalancingv2.Options{
		Region:       "eu-west-1",
		BaseEndpoint: aws.String(p.health.URL),
		Credentials:  aws.AnonymousCredentials{},
		// One attempt: the wait's own pace decides when to ask again.
		RetryMaxAttempts: 1,
	})
	return p, nil
}

// transport is rollout.SSH for a rollout of version, with production's
// settings but for where the servers are (the test's Host entries),
// where they unpack the release and who runs it (the ssh user: root
// here, no sudo).
func (p *sshPath) transport(version string, t infra.Timing, out io.Writer) rolloutpkg.SSH {
	return rolloutpkg.SSH{HooksDir: p.ship, Version: version, Config: p.config, RemoteReleases: p.releases,
		AppPort: p.port, ImagePrefix: hooks.DefaultImagePrefix, Timing: t, Stdout: out, Stderr: out}
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
