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
