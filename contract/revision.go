package contract

import (
	"bytes"
	"context"
	_ "embed" // the snapshot program's source
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/mythex/infra/infra"
)

//go:embed snapshot.go
var snapshotSource string

// snapshotDir is where, inside a checkout of another revision, the program
// that prints that revision's timing is written. The leading underscore keeps
// it out of ./... patterns.
const snapshotDir = "_timingsnapshot"

// Side is the contract at one revision.
type Side struct {
	// Label names the revision for people, e.g. "origin/main (1a2b3c4)".
	Label string
	// Commit is the full hash; empty for the working tree.
	Commit string
	Snap   Snapshot
}

// Current is the contract compiled into this binary: the working tree it was
// built from.
func Current() Side {
	return Side{Label: "working tree", Snap: TakeSnapshot(infra.Prod())}
}

// AtRevision reads the contract at rev of the git repository that contains
// dir. It checks rev out into a temporary worktree (always removed again) and
// runs a small program there that prints that revision's infra.Prod() by
// reflection, so it works whatever fields that revision's Timing has. It
// compiles that revision's infra package: expect tens of seconds on a cold
// build cache.
func AtRevision(ctx context.Context, dir, rev string) (side Side, err error) {
	if rev == "" || strings.HasPrefix(rev, "-") {
		return Side{}, fmt.Errorf("revision %q: want a commit, branch or tag name", rev)
	}
	hash, err := git(ctx, dir, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		return Side{}, fmt.Errorf("revision %q is not a commit in the repository at %s (fetch it first, e.g. git fetch origin): %w", rev, dir, err)
	}
	tmp, err := os.MkdirTemp("", "timing-diff-")
	if err != nil {
		return Side{}, fmt.Errorf("revision %s: %w", rev, err)
	}
	defer func() {
		if rmErr := os.RemoveAll(tmp); rmErr != nil && err == nil {
			err = fmt.Errorf("remove %s: %w", tmp, rmErr)
		}
	}()
	tree := filepath.Join(tmp, "tree")
	if _, err := git(ctx, dir, "worktree", "add", "--detach", tree, hash); err != nil {
		return Side{}, fmt.Errorf("check out %s: %w", rev, err)
	}
	defer func() {
		// Runs even when ctx is cancelled: a stale worktree entry would
		// outlive this process in the repository.
		if _, rmErr := git(context.WithoutCancel(ctx), dir, "worktree", "remove", "--force", tree); rmErr != nil && err == nil {
			err = fmt.Errorf("remove worktree of %s: %w", rev, rmErr)
		}
	}()
	snap, err := runSnapshot(ctx, tree)
	if err != nil {
		return Side{}, fmt.Errorf("read the timing at %s (%.7s): %w", rev, hash, err)
	}
	label := fmt.Sprintf("%s (%.7s)", rev, hash)
	if strings.HasPrefix(hash, rev) {
		label = fmt.Sprintf("%.7s", hash)
	}
	return Side{Label: label, Commit: hash, Snap: snap}, nil
}

// runSnapshot builds and runs the snapshot program inside the module at tree.
func runSnapshot(ctx context.Context, tree string) (Snapshot, error) {
	mod, err := modulePath(filepath.Join(tree, "go.mod"))
	if err != nil {
		return Snapshot{}, err
	}
	src, ok := strings.CutPrefix(snapshotSource, "package contract\n")
	if !ok {
		return Snapshot{}, errors.New("snapshot.go must start with its package clause")
	}
	main := fmt.Sprintf(`package main

import (
	"encoding/json"
	"os"

	infra %q
)

func main() {
	if err := json.NewEncoder(os.Stdout).Encode(TakeSnapshot(infra.Prod())); err != nil {
		panic(err)
	}
}
`, mod+"/infra")
	dir := filepath.Join(tree, snapshotDir)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot program: %w", err)
	}
	for name, text := range map[string]string{"snapshot.go": "package main\n" + src, "main.go": main} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return Snapshot{}, fmt.Errorf("snapshot program: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, "go", "run", "./"+snapshotDir)
	cmd.Dir = tree
	// The revision's own go.mod decides; a go.work around the checkout must not.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Snapshot{}, fmt.Errorf("go run (does this revision have infra.Prod?): %w\n%s", err, strings.TrimSpace(stderr.String()))
	}
	var snap Snapshot
	if err := json.Unmarshal(stdout.Bytes(), &snap); err != nil {
		return Snapshot{}, fmt.Errorf("decode snapshot: %w", err)
	}
	return snap, nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}
