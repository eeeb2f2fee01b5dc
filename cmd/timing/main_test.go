package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/cmdflag"
)

func runTiming(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestTimingMDIsCurrent is why every pull request that changes a number
// shows the change in TIMING.md's diff.
func TestTimingMDIsCurrent(t *testing.T) {
	root, err := contract.FindModuleRoot(".")
	require.NoError(t, err)
	code, want, stderr := runTiming(t, "markdown")
	require.Equal(t, 0, code, stderr)
	got, err := os.ReadFile(filepath.Join(root, "TIMING.md"))
	require.NoError(t, err, "TIMING.md is missing: run `%s` at the repository root", contract.GenerateCommand)
	if string(got) != want {
		t.Errorf("TIMING.md is stale: the timing contract changed. Run `%s` at the repository root and commit TIMING.md.\n"+
			"Lines that would change (- in the file, + generated now):\n%s",
			contract.GenerateCommand, changedLines(string(got), want, 20))
	}
}

// changedLines lists, at most max of each, the lines only old has (-) and
// the lines only new has (+): enough to see which numbers moved.
func changedLines(old, new string, max int) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	o, n := count(old), count(new)
	var out []string
	list := func(s string, other map[string]int, mark string) {
		seen := map[string]int{}
		k := 0
		for _, l := range strings.Split(s, "\n") {
			seen[l]++
			if seen[l] > other[l] && k < max {
				out = append(out, mark+" "+l)
				k++
			}
		}
	}
	list(old, n, "-")
	list(new, o, "+")
	return strings.Join(out, "\n")
}

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string
		stderr     []string
		stdoutNone bool
	}{
		{name: "no arguments shows the contract", args: nil, code: 0, stdout: []string{"Valid: every rule holds.", "Drain timeline"}},
		{name: "show", args: []string{"show"}, code: 0, stdout: []string{"Invariants",
			"\nFleet rollout: stack prod's ", "(mythex-infra:instanceIds in Pulumi.prod.yaml) at --max-unavailable 1, the default\n"}},
		{name: "help", args: []string{"-h"}, code: 0, stdout: []string{"usage:"}},
		{name: "unknown command", args: []string{"shwo"}, code: 2, stderr: []string{`unknown command "shwo"`, "usage:"}, stdoutNone: true},
		{name: "show with an argument", args: []string{"show", "x"}, code: 2, stderr: []string{"show takes no arguments"}, stdoutNone: true},
		{name: "markdown with an argument", args: []string{"markdown", "x"}, code: 2, stderr: []string{"markdown takes no arguments"}, stdoutNone: true},
		{name: "markdown with an unknown flag", args: []string{"markdown", "-x"}, code: 2, stderr: []string{"flag provided but not defined: -x"}, stdoutNone: true},
		{name: "diff without a revision", args: []string{"diff"}, code: 2, stderr: []string{"diff takes one or two revisions, got 0"}, stdoutNone: true},
		{name: "diff with three revisions", args: []string{"diff", "a", "b", "c"}, code: 2, stderr: []string{"got 3"}, stdoutNone: true},
		{name: "diff against no commit", args: []string{"diff", "no-such-revision-anywhere"}, code: 1,
			stderr: []string{`revision "no-such-revision-anywhere" is not a commit`}, stdoutNone: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runTiming(t, tt.args...)
			assert.Equal(t, tt.code, code, "stderr: %s", stderr)
			for _, s := range tt.stdout {
				assert.Contains(t, stdout, s)
			}
			for _, s := range tt.stderr {
				assert.Contains(t, stderr, s)
			}
			if tt.stdoutNone {
				assert.Empty(t, stdout)
			}
		})
	}
}

func TestMarkdownWritesFileAtomically(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "TIMING.md")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o600))
	code, stdout, stderr := runTiming(t, "markdown", "-o", path)
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, stdout)

	_, want, _ := runTiming(t, "markdown")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, want, string(got))
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), info.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file is left behind")

	code, _, stderr = runTiming(t, "markdown", "-o", filepath.Join(dir, "missing", "TIMING.md"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "missing")
}

func TestShowOutsideTheRepository(t *testing.T) {
	t.Chdir(t.TempDir())
	code, _, stderr := runTiming(t, "show")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "run this inside the repository")
}

func TestDiffAgainstHead(t *testing.T) {
	if testing.Short() {
		t.Skip("builds another revision of package infra; run without -short")
	}
	out := filepath.Join(t.TempDir(), "diff.md")
	code, stdout, stderr := runTiming(t, "diff", "-o", out, "-old-name", "base", "-new-name", "this change", "HEAD")
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, stdout)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	md := string(data)
	assert.True(t, strings.HasPrefix(md, "### Timing contract: `base ("), md)
	assert.Contains(t, md, "→ `this change`")
	assert.Contains(t, md, "| `"+string(infra.RuleDrainOutlasts)+"`")
}

// TestPullRequestWorkflowCommandParses runs the command line the pull-request
// workflow runs, with a revision that does not exist: it must get as far as
// looking the revision up (exit 1), not stop at its flags (exit 2).
func TestPullRequestWorkflowCommandParses(t *testing.T) {
	root, err := contract.FindModuleRoot(".")
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "pull-request.yml"))
	require.NoError(t, err)
	args := workflowArgs(t, string(data), "go run ./cmd/timing diff", map[string]string{"BASE_SHA": "no-such-base-revision"})
	assert.Contains(t, args, "-gate", "the pull request fails when the change has no safe order")
	code, _, stderr := runTiming(t, args...)
	assert.Equal(t, 1, code, "args %q: %s", args, stderr)
	assert.Contains(t, stderr, `revision "no-such-base-revision" is not a commit`)
}

// workflowArgs finds the workflow's command line that contains cmd and
// returns its arguments after `go run ./cmd/timing`, with shell variables
// expanded from vars (RUNNER_TEMP is a temporary directory, others "x").
func workflowArgs(t *testing.T, workflow, cmd string, vars map[string]string) []string {
	t.Helper()
	// The invocation may continue over lines ending in a backslash.
	joined := strings.ReplaceAll(workflow, "\\\n", " ")
	var line string
	for _, l := range strings.Split(joined, "\n") {
		if strings.Contains(l, cmd) {
			line = l
		}
	}
	require.NotEmpty(t, line, "the workflow no longer runs `%s`", cmd)
	rest := strings.SplitN(line, "go run ./cmd/timing", 2)[1]
	// What follows a list operator or a redirection is the shell's, not the command's.
	for _, op := range []string{" ||", " >"} {
		rest, _, _ = strings.Cut(rest, op)
	}
	fields := strings.Fields(rest)
	args := make([]string, 0, len(fields))
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		// A quoted argument with spaces, e.g. "pull request #$PR_NUMBER".
		for strings.HasPrefix(f, `"`) && !strings.HasSuffix(f, `"`) && i+1 < len(fields) {
			i++
			f += " " + fields[i]
		}
		args = append(args, os.Expand(strings.Trim(f, `"`), func(name string) string {
			if name == "RUNNER_TEMP" {
				return t.TempDir()
			}
			if v, ok := vars[name]; ok {
				return v
			}
			return "x"
		}))
	}
	return args
}

func TestHelpExitsZeroWithEachSubcommandsFlags(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		flags []string
	}{
		{[]string{"-h"}, nil},
		{[]string{"help"}, nil},
		{[]string{"markdown", "-h"}, []string{"o"}},
		{[]string{"diff", "-h"}, []string{"gate", "new-name", "o", "old-name", "prod"}},
		{[]string{"order", "-h"}, []string{"prod"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			assert.Equal(t, 0, run(context.Background(), tc.args, &stdout, &stderr))
			assert.Empty(t, stderr.String())
			assert.Contains(t, stdout.String(), "usage:")
			assert.Equal(t, tc.flags, cmdflag.Listed(stdout.String()))
		})
	}
}
