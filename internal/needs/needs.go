// Package needs decides, in one place, which tests the everyday gate runs.
//
// `go test -short ./...` runs every test that needs nothing beyond Go: the
// timing invariants, the contract, the plan, the Pulumi program under
// mocks, the drain library, the renderers. A test that needs a Docker
// engine, an sshd, the scanner or another installed tool says so with
// Have: under -short it is skipped with one line naming the full command;
// without -short a missing need fails it at once, naming every missing
// one with its install, never skipped: `go test ./...` is the proof that
// the scripts work against the real thing.
package needs

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// FullCommand is the README's test command: what runs every test.
const FullCommand = "go test -timeout 40m ./..."

// Need is one thing beyond Go that a test needs.
type Need struct {
	// Name says what it is, e.g. "a running Docker engine".
	Name string
	// Install says how to get it.
	Install string
	// check reports why it is missing, or nil; nil check: the test finds
	// and checks it itself (the scanner's pinned version, say).
	check func() error
}

// Tool is a command that must be on PATH.
func Tool(binary, install string) Need {
	return Need{Name: binary, Install: install, check: func() error {
		_, err := exec.LookPath(binary)
		return err
	}}
}

var (
	// Docker is a running engine: `docker info` answers.
	Docker = Need{
		Name:    "a running Docker engine",
		Install: "install Docker Engine with the compose plugin or docker-compose, and start it",
		check:   dockerInfo,
	}
	// SSHD is OpenSSH's server and client (the rollout's ssh tests start
	// one on loopback).
	SSHD = Need{Name: "OpenSSH's server and client", Install: "apt-get install openssh-server openssh-client", check: findSSHD}
	// Scanner is trivy at the pinned version; its tests check the version.
	Scanner = Need{Name: "the trivy scanner", Install: "see docs/scanning.md (GOEXPERIMENT=jsonv2 go install github.com/aquasecurity/trivy/cmd/trivy@VERSION)"}
	// HAProxy is the rehearsal's balancer node.
	HAProxy = Tool("haproxy", "apt-get install haproxy")
	// Shellcheck lints the hooks.
	Shellcheck = Tool("shellcheck", "apt-get install shellcheck")
	// AWSCLI is the real AWS CLI, run against loopback stand-ins.
	AWSCLI = Tool("aws", "apt-get install awscli")
	// SystemdAnalyze checks the watchdog's units.
	SystemdAnalyze = Tool("systemd-analyze", "apt-get install systemd")
	// Setpriv runs a script as another user.
	Setpriv = Tool("setpriv", "apt-get install util-linux")
)

// Have skips t under -short, naming the full command; otherwise it fails t
// at once when any need is missing, naming each with its install.
func Have(t testing.TB, needs ...Need) {
	t.Helper()
	skip, fail := decide(testing.Short(), needs)
	if skip != "" {
		t.Skip(skip)
	}
	if fail != "" {
		t.Fatal(fail)
	}
}

// decide says why a test is skipped or fails; both empty: it runs.
func decide(short bool, needs []Need) (skip, fail string) {
	names := make([]string, len(needs))
	for i, n := range needs {
		names[i] = n.Name
	}
	if short {
		return fmt.Sprintf("-short: needs %s; %s runs it", strings.Join(names, ", "), FullCommand), ""
	}
	var missing []string
	for _, n := range needs {
		if n.check == nil {
			continue
		}
		if err := cached(n); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v): %s", n.Name, err, n.Install))
		}
	}
	if len(missing) > 0 {
		return "", "this test needs what is missing here:\n  " + strings.Join(missing, "\n  ")
	}
	return "", ""
}

// A need is checked once per test binary: `docker info` costs a process.
var (
	mu      sync.Mutex
	checked = map[string]error{}
)

func cached(n Need) error {
	mu.Lock()
	defer mu.Unlock()
	if err, ok := checked[n.Name]; ok {
		return err
	}
	err := n.check()
	checked[n.Name] = err
	return err
}

func dockerInfo() error {
	// An engine answers in well under a second; one that does not answer
	// in 30 s is as good as missing.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput()
	if err != nil {
		return fmt.Errorf("docker info: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func findSSHD() error {
	for _, c := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(c); err != nil {
			return err
		}
	}
	if _, err := exec.LookPath("sshd"); err == nil {
		return nil
	}
	// Not on a non-root PATH.
	_, err := exec.LookPath("/usr/sbin/sshd")
	return err
}
