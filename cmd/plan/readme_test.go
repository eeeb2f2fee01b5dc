package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// TestReadmeQuotesThePlan: the plan the README shows a newcomer is the
// plan's own output. Every line of its sample (a ```text block after the
// README's first `go run ./cmd/plan`) is a line of the prod plan; "…"
// stands for any text and a line "..." for any lines. A changed number or
// wording in the plan fails here until the README quotes it again.
func TestReadmeQuotesThePlan(t *testing.T) {
	sample := readmePlanSample(t)
	var out bytes.Buffer
	require.NoError(t, writePlan(&out, infra.Prod(), loadProd(t), ""))
	plan := strings.Split(out.String(), "\n")

	next := 0 // the sample's lines appear in the plan in order
	for _, want := range sample {
		if want == "..." {
			continue
		}
		found := -1
		for i := next; i < len(plan); i++ {
			if lineMatches(plan[i], want) {
				found = i
				break
			}
		}
		if !assert.GreaterOrEqual(t, found, 0,
			"README.md quotes a plan line that `go run ./cmd/plan` does not print (after line %d):\n  %s", next+1, want) {
			continue
		}
		next = found + 1
	}
}

// lineMatches says whether got is want, where each "…" in want stands for
// any text.
func lineMatches(got, want string) bool {
	parts := strings.Split(want, "…")
	if !strings.HasPrefix(got, parts[0]) {
		return false
	}
	got = got[len(parts[0]):]
	for i, p := range parts[1:] {
		if i == len(parts)-2 {
			return strings.HasSuffix(got, p)
		}
		j := strings.Index(got, p)
		if j < 0 {
			return false
		}
		got = got[j+len(p):]
	}
	return got == ""
}

// readmePlanSample is the README's sample of the plan's output.
func readmePlanSample(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	start := -1
	for i, l := range lines {
		if strings.Contains(l, "`go run ./cmd/plan`") && !strings.HasPrefix(l, "go run") {
			start = i
			break
		}
	}
	require.GreaterOrEqual(t, start, 0, "README.md no longer explains `go run ./cmd/plan`")
	for i := start; i < len(lines); i++ {
		if lines[i] != "```text" {
			continue
		}
		var sample []string
		for _, l := range lines[i+1:] {
			if l == "```" {
				require.NotEmpty(t, sample, "README.md's plan sample is empty")
				return sample
			}
			sample = append(sample, l)
		}
		break
	}
	t.Fatal("README.md has no ```text sample of the plan after it explains `go run ./cmd/plan`")
	return nil
}
