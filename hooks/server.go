package hooks

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Server is one server's environment for the scripts. A production server
// takes every default; the rehearsal and the tests run several on one host,
// each with its own directory, lock, compose project and api port:
//
//	s := hooks.Server{HooksDir: "hooks", Root: dir, Project: "rehearse-1",
//		ReleaseDir: release, AppPort: 18080, Bind: "127.0.0.1"}
//	err := s.Command(ctx, "deploy", "v2").Run()
//
// where release holds hooks.WriteRelease's files for the (scaled) timing.
type Server struct {
	// HooksDir holds the scripts: the repository's hooks/ directory.
	HooksDir string
	// Root is MYTHEX_ROOT: installed definition, state and the lock.
	Root string
	// Project is the compose project name, unique per server on a host.
	Project string
	// ReleaseDir holds compose.yaml, its checksum and timing.env
	// (WriteRelease); the scripts read their numbers from its timing.env.
	ReleaseDir string
	// AppPort is the host port api is published on.
	AppPort int
	// Bind is the address api is published on; "" means the production
	// default, every interface.
	Bind string
	// ImagePrefix is the images' prefix; "" means DefaultImagePrefix.
	ImagePrefix string
}

// Lock is the server's lock file: the one path deploy, bootstrap and the
// watchdog share.
func (s Server) Lock() string { return filepath.Join(s.Root, "mythex.lock") }

// Environ is the parent's environment without any MYTHEX_ setting, plus
// this server's.
func (s Server) Environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYTHEX_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"MYTHEX_ROOT="+s.Root,
		"MYTHEX_LOCK="+s.Lock(),
		"MYTHEX_PROJECT="+s.Project,
		"MYTHEX_RELEASE_DIR="+s.ReleaseDir,
		"MYTHEX_TIMING_ENV="+filepath.Join(s.ReleaseDir, TimingEnvFile),
		"MYTHEX_SYSTEMD_DIR="+filepath.Join(s.Root, "systemd"),
		EnvAppPort+"="+strconv.Itoa(s.AppPort),
	)
	if s.Bind != "" {
		env = append(env, EnvBind+"="+s.Bind)
	}
	if s.ImagePrefix != "" {
		env = append(env, EnvImagePrefix+"="+s.ImagePrefix)
	}
	return env
}

// Command runs one of the scripts (deploy, watchdog, bootstrap) for this
// server.
func (s Server) Command(ctx context.Context, script string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.HooksDir, script), args...)
	cmd.Env = s.Environ()
	return cmd
}

// Remove deletes the server's containers and networks, whatever state they
// are in: for cleaning up after a rehearsal or a test.
func (s Server) Remove(ctx context.Context) error {
	label := "label=com.docker.compose.project=" + s.Project
	ids, err := exec.CommandContext(ctx, "docker", "ps", "-a", "-q", "--filter", label).Output()
	if err != nil {
		return fmt.Errorf("list containers of %s: %w", s.Project, err)
	}
	if f := strings.Fields(string(ids)); len(f) > 0 {
		if out, err := exec.CommandContext(ctx, "docker", append([]string{"rm", "-f", "-v"}, f...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("remove containers of %s: %w\n%s", s.Project, err, out)
		}
	}
	nets, err := exec.CommandContext(ctx, "docker", "network", "ls", "-q", "--filter", label).Output()
	if err != nil {
		return fmt.Errorf("list networks of %s: %w", s.Project, err)
	}
	if f := strings.Fields(string(nets)); len(f) > 0 {
		if out, err := exec.CommandContext(ctx, "docker", append([]string{"network", "rm"}, f...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("remove networks of %s: %w\n%s", s.Project, err, out)
		}
	}
	return nil
}
