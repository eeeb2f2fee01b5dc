package contract_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

func diff(t *testing.T, old, new contract.Side) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, contract.WriteDiff(&b, old, new))
	return b.String()
}

func side(label string, tm infra.Timing, edit func(*contract.Snapshot)) contract.Side {
	s := contract.TakeSnapshot(tm)
	if edit != nil {
		edit(&s)
	}
	return contract.Side{Label: label, Snap: s}
}

func dropField(name string) func(*contract.Snapshot) {
	return func(s *contract.Snapshot) {
		var kept []contract.Value
		for _, v := range s.Fields {
			if v.Name != name {
				kept = append(kept, v)
			}
		}
		s.Fields = kept
	}
}

func d(x time.Duration) string { return contract.FormatDuration(x) }

func TestWriteDiff(t *testing.T) {
	prod := infra.Prod()
	bad := brokenDrain()
	tests := []struct {
		name     string
		old, new contract.Side
		want     []string
		wantNot  []string
	}{
		{
			name: "same contract",
			old:  side("base", prod, nil),
			new:  side("head", prod, nil),
			want: []string{
				"### Timing contract: `base` → `head`",
				"No timing value changed.",
				"Broken at `base`: none.",
				"Broken at `head`: none.",
				"| `Drain` | " + d(prod.Drain) + " | " + d(prod.Drain) + " |  |",
			},
			wantNot: []string{"(changed)", "**changed**", "value(s) changed", "margin(s) changed", "BROKEN", "n/a"},
		},
		{
			name: "drain fixed: value, derived value and margin changed, old side broken",
			old:  side("base", bad, nil),
			new:  side("head", prod, nil),
			want: []string{
				"**1 value(s) changed:** `Drain` " + d(bad.Drain) + " → " + d(prod.Drain) + ".",
				"`DrainMargin()` " + d(bad.DrainMargin()) + " → " + d(prod.DrainMargin()),
				"`drain-outlasts-detection` " + d(bad.DrainMargin()) + " → " + d(prod.DrainMargin()),
				"**Broken at `base`: `drain-outlasts-detection`.**",
				"Broken at `head`: none.",
				"| **`Drain`** | " + d(bad.Drain) + " | " + d(prod.Drain) + " | **changed** |",
				"| **`DrainMargin()`** | " + d(bad.DrainMargin()) + " | " + d(prod.DrainMargin()) + " | **changed** |",
				"| `drain-outlasts-detection` (changed) | Drain vs WorstCaseDetection | " + d(bad.DrainMargin()) + " | " +
					d(prod.DrainMargin()) + " | ≥ NodeSkew " + d(prod.NodeSkew) + " | **BROKEN** | holds |",
				"#### Broken at `base`\n\n- `drain-outlasts-detection`: " + bad.Violations()[0].Msg,
			},
			wantNot: []string{"Broken at `head`\n"},
		},
		{
			name: "a formula changed, no value did",
			old: side("base", prod, func(s *contract.Snapshot) {
				for i, v := range s.Derived {
					if v.Name == "WorstCaseDetection" {
						s.Derived[i].Int += int64(time.Second)
					}
				}
			}),
			new: side("head", prod, nil),
			want: []string{
				"No timing value changed.",
				"**1 derived value(s) changed:** `WorstCaseDetection()` " + d(prod.WorstCaseDetection()+time.Second) + " → " + d(prod.WorstCaseDetection()) + ".",
			},
		},
		{
			name: "drain broken by the change: called out at the new side",
			old:  side("base", prod, nil),
			new:  side("head", bad, nil),
			want: []string{
				"**Broken at `head`: `drain-outlasts-detection`.**",
				"#### Broken at `head`",
			},
		},
		{
			name: "field removed and field added",
			old: side("base", prod, func(s *contract.Snapshot) {
				dropField("NodeSkew")(s)
				s.Fields = append(s.Fields, contract.Value{Name: "LegacyPause", Kind: "duration", Int: int64(7 * time.Second), Text: "7s"})
			}),
			new: side("head", prod, nil),
			want: []string{
				"| **`NodeSkew`** | — | " + d(prod.NodeSkew) + " | **added** |",
				"| **`LegacyPause`** | 7s | — | **removed** |",
				"`drain-outlasts-detection` n/a (no NodeSkew) → " + d(prod.DrainMargin()),
				"Broken at `base`: none.",
			},
		},
		{
			name: "a field of another type is not judged",
			old: side("base", prod, func(s *contract.Snapshot) {
				for i, v := range s.Fields {
					if v.Name == "AppKeepAlive" {
						s.Fields[i] = contract.Value{Name: "AppKeepAlive", Kind: "other", Text: "forever"}
					}
				}
			}),
			new:  side("head", prod, nil),
			want: []string{"n/a (no AppKeepAlive)", "| **`AppKeepAlive`** | forever | " + d(prod.AppKeepAlive) + " | **changed** |"},
		},
		{
			name: "an old revision without Violations, and one whose own rules disagree",
			old: side("base", prod, func(s *contract.Snapshot) {
				s.HasViolations = false
			}),
			new: side("head", prod, func(s *contract.Snapshot) {
				s.Violations = []string{"some-rule: something"}
			}),
			want: []string{
				"`base` has no `Timing.Violations`: only this build's rules judged it.",
				"#### What `head` reports about itself, by its own rules\n\n- some-rule: something",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := diff(t, tt.old, tt.new)
			for _, w := range tt.want {
				assert.Contains(t, out, w)
			}
			for _, w := range tt.wantNot {
				assert.NotContains(t, out, w)
			}
		})
	}
}

// tempRepo copies the module's files that package infra is built from into a
// new git repository with one commit, and returns its directory.
func tempRepo(t *testing.T) string {
	t.Helper()
	root := moduleRoot(t)
	list := exec.Command("go", "list", "-deps", "-json", "./infra")
	list.Dir = root
	out, err := list.Output()
	require.NoError(t, err, "go list")
	dst := t.TempDir()
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var pkg struct {
			Dir        string
			GoFiles    []string
			EmbedFiles []string
			Module     *struct{ Path string }
		}
		require.NoError(t, dec.Decode(&pkg))
		if pkg.Module == nil || pkg.Module.Path != contract.ModulePath {
			continue
		}
		rel, err := filepath.Rel(root, pkg.Dir)
		require.NoError(t, err)
		for _, f := range append(pkg.GoFiles, pkg.EmbedFiles...) {
			copyFile(t, filepath.Join(pkg.Dir, f), filepath.Join(dst, rel, f))
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		copyFile(t, filepath.Join(root, f), filepath.Join(dst, f))
	}
	gitIn(t, dst, "init", "-q")
	commitAll(t, dst, "copy of the working tree")
	return dst
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
	require.NoError(t, os.WriteFile(to, data, 0o644))
}

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(),
		"GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.invalid",
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.invalid")
	out, err := cmd.CombinedOutput()
	require.NoErrorf(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

func commitAll(t *testing.T, dir, msg string) {
	t.Helper()
	gitIn(t, dir, "add", "-A")
	gitIn(t, dir, "commit", "-q", "--no-verify", "-m", msg)
}

// editTiming rewrites infra/timing.go of the repository at dir.
func editTiming(t *testing.T, dir string, edits ...func(string) string) {
	t.Helper()
	path := filepath.Join(dir, "infra", "timing.go")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	text := string(data)
	for _, e := range edits {
		edited := e(text)
		require.NotEqual(t, text, edited, "edit did not apply")
		text = edited
	}
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
}

// TestAtRevision reads the contract of a real commit through a real git
// worktree and go run: the changed number, the removed field, the margin and
// the broken rule must all show. It links package infra once (tens of
// seconds on a cold build cache).
func TestAtRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("builds another revision of package infra; run without -short")
	}
	repo := tempRepo(t)
	prod := infra.Prod()
	// The old revision drains only as long as worst-case detection: margin 0.
	broken := regexp.MustCompile(`(?m)^(\s*)Drain:\s*[^,]+,`)
	editTiming(t, repo,
		func(s string) string {
			return broken.ReplaceAllString(s, "${1}Drain: "+strings.TrimSuffix(prod.WorstCaseDetection().String(), "s")+" * time.Second,")
		},
		func(s string) string {
			return strings.Replace(s, "type Timing struct {", "type Timing struct {\n\tLegacyPause time.Duration", 1)
		},
		func(s string) string {
			return strings.Replace(s, "return Timing{", "return Timing{\n\t\tLegacyPause: 7 * time.Second,", 1)
		},
	)
	commitAll(t, repo, "drain as long as detection")
	head := gitIn(t, repo, "rev-parse", "HEAD")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	old, err := contract.AtRevision(ctx, repo, "HEAD")
	require.NoError(t, err)
	assert.Equal(t, "HEAD ("+head[:7]+")", old.Label)
	assert.Equal(t, head, old.Commit)
	assert.Equal(t, 1, strings.Count(gitIn(t, repo, "worktree", "list", "--porcelain"), "worktree "),
		"the temporary worktree must be removed")

	out := diff(t, old, contract.Current())
	for _, want := range []string{
		"| **`Drain`** | " + d(prod.WorstCaseDetection()) + " | " + d(prod.Drain) + " | **changed** |",
		"| **`LegacyPause`** | 7s | — | **removed** |",
		"`drain-outlasts-detection` 0s → " + d(prod.DrainMargin()),
		"**Broken at `HEAD (" + head[:7] + ")`: `drain-outlasts-detection`.**",
		"Broken at `working tree`: none.",
	} {
		assert.Contains(t, out, want)
	}
	// The old revision's own rules said the same as this build's.
	assert.NotContains(t, out, "reports about itself")
}

func TestAtRevisionErrors(t *testing.T) {
	repo := tempRepo(t)
	ctx := context.Background()
	tests := []struct {
		name, rev string
		want      string
	}{
		{"unknown revision", "no-such-branch", `revision "no-such-branch" is not a commit`},
		{"option-like revision", "--output=/tmp/x", "want a commit, branch or tag name"},
		{"empty revision", "", "want a commit, branch or tag name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := contract.AtRevision(ctx, repo, tt.rev)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}

	t.Run("revision without the contract", func(t *testing.T) {
		if testing.Short() {
			t.Skip("builds another revision; run without -short")
		}
		editTiming(t, repo, func(s string) string { return strings.Replace(s, "func Prod()", "func prod()", 1) })
		commitAll(t, repo, "no Prod")
		_, err := contract.AtRevision(ctx, repo, "HEAD")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "does this revision have infra.Prod?")
		assert.Contains(t, err.Error(), "undefined: infra.Prod", "the compiler's own words are passed on")
		assert.Equal(t, 1, strings.Count(gitIn(t, repo, "worktree", "list", "--porcelain"), "worktree "),
			"the worktree is removed after a failure too")
	})
}
