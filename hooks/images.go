package hooks

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"
)

// serviceDockerfile is the reference service's image: the static binary
// alone, FROM scratch. BuildImages uses cmd/service/Dockerfile when present.
const serviceDockerfile = `FROM scratch
COPY service /service
ENTRYPOINT ["/service"]
`

var validTag = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// BuildImages builds the reference service (cmd/service under repoRoot) as
// a static binary once, with tag as the version built into it (what its
// /about reports and a deploy verifies), and tags one FROM-scratch image per
// role: mythex/<role>:<tag>. No image is pulled. An image for another
// release is built, not re-tagged: a re-tagged image reports its old version
// and fails the deploy, as a mis-tagged image must.
func BuildImages(ctx context.Context, repoRoot, tag string) error {
	if !validTag.MatchString(tag) {
		return fmt.Errorf("build images: %q is not a valid image tag", tag)
	}
	dir, err := os.MkdirTemp("", "mythex-images-")
	if err != nil {
		return fmt.Errorf("build images: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := buildService(ctx, repoRoot, filepath.Join(dir, "service"), tag); err != nil {
		return err
	}
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "cmd", "service", "Dockerfile"))
	if errors.Is(err, fs.ErrNotExist) {
		dockerfile = []byte(serviceDockerfile)
	} else if err != nil {
		return fmt.Errorf("build images: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), dockerfile, 0o644); err != nil {
		return fmt.Errorf("build images: %w", err)
	}
	var tags []string
	for _, role := range Roles {
		tags = append(tags, ImageName(DefaultImagePrefix, role, tag))
	}
	return dockerBuild(ctx, dir, tags...)
}

// RemoveImages removes the images BuildImages tagged.
func RemoveImages(ctx context.Context, tag string) error {
	args := []string{"rmi", "--force"}
	for _, role := range Roles {
		args = append(args, ImageName(DefaultImagePrefix, role, tag))
	}
	if out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("remove images %s: %w\n%s", tag, err, out)
	}
	return nil
}

// buildService compiles cmd/service statically, so it runs FROM scratch, with
// version built in ("" leaves it unversioned).
func buildService(ctx context.Context, repoRoot, out, version string) error {
	var ldflags []string
	if version != "" {
		if !validTag.MatchString(version) {
			return fmt.Errorf("build the reference service: version %q is not a valid image tag", version)
		}
		ldflags = append(ldflags, "-ldflags=-X main.version="+version)
	}
	return buildStatic(ctx, repoRoot, "./cmd/service", out, ldflags...)
}

// buildStatic compiles the Go command pkg under repoRoot into a static
// binary at out, with extra build flags.
func buildStatic(ctx context.Context, repoRoot, pkg, out string, flags ...string) error {
	args := append(append([]string{"build", "-trimpath"}, flags...), "-o", out, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s in %s: %w\n%s", pkg, repoRoot, err, b)
	}
	return nil
}

// dockerBuild builds the image in dir and gives it every tag.
func dockerBuild(ctx context.Context, dir string, tags ...string) error {
	args := []string{"build", "--quiet"}
	for _, t := range tags {
		args = append(args, "--tag", t)
	}
	args = append(args, dir)
	if out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("docker build %v: %w\n%s", tags, err, out)
	}
	return nil
}

// Fault is how a deliberately broken release's api fails, for the
// rehearsal's broken-release scenarios: a rollout must catch it on its
// canary and roll back.
type Fault string

const (
	// FaultNeverHealthy is an api that serves but whose container health
	// check can never run (no /service to run it): Docker never calls it
	// healthy, and the deploy fails once the start timeout passes.
	FaultNeverHealthy Fault = "never-healthy"
	// FaultCrashes is an api that starts healthy and crashes after a delay,
	// once per container (hooks/internal/crashonce): Docker restarts it, and
	// the deploy's settle window sees the container die.
	FaultCrashes Fault = "crashes"
)

// BuildBrokenImages builds tag's images as BuildImages does, then replaces
// the api's with one that fails as fault says; crashAfter is FaultCrashes'
// delay from the container's start.
func BuildBrokenImages(ctx context.Context, repoRoot, tag string, fault Fault, crashAfter time.Duration) error {
	var dockerfile string
	switch fault {
	case FaultNeverHealthy:
		dockerfile = "FROM scratch\nCOPY service /svc\nENTRYPOINT [\"/svc\"]\n"
	case FaultCrashes:
		if crashAfter <= 0 {
			return fmt.Errorf("build broken images %s: crash delay %v must be positive", tag, crashAfter)
		}
		dockerfile = fmt.Sprintf("FROM scratch\nCOPY service /service\nCOPY crashonce /crashonce\nENTRYPOINT [\"/crashonce\", %q, \"/service\"]\n", crashAfter.String())
	default:
		return fmt.Errorf("build broken images %s: unknown fault %q", tag, fault)
	}
	if err := BuildImages(ctx, repoRoot, tag); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "mythex-broken-")
	if err != nil {
		return fmt.Errorf("build broken images: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := buildService(ctx, repoRoot, filepath.Join(dir, "service"), tag); err != nil {
		return err
	}
	if err := buildStatic(ctx, repoRoot, "./hooks/internal/crashonce", filepath.Join(dir, "crashonce")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		return fmt.Errorf("build broken images: %w", err)
	}
	return dockerBuild(ctx, dir, ImageName(DefaultImagePrefix, "api", tag))
}
