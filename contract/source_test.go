package contract_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := contract.FindModuleRoot(".")
	require.NoError(t, err)
	return root
}

func loadSource(t *testing.T) *contract.Source {
	t.Helper()
	src, err := contract.LoadSource(moduleRoot(t))
	require.NoError(t, err)
	return src
}

func TestFindModuleRoot(t *testing.T) {
	root := moduleRoot(t)
	assert.FileExists(t, filepath.Join(root, "infra", "timing.go"))

	nested, err := contract.FindModuleRoot(filepath.Join(root, "contract"))
	require.NoError(t, err)
	assert.Equal(t, root, nested)

	_, err = contract.FindModuleRoot(t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), contract.ModulePath)
}

func TestLoadSourceReadsEveryField(t *testing.T) {
	src := loadSource(t)
	data, err := os.ReadFile(filepath.Join(moduleRoot(t), "infra", "timing.go"))
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(data)), " ")

	typ := reflect.TypeOf(infra.Timing{})
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Name
		// Each reason is a comment of the file, and not the field's doc.
		assert.Contains(t, text, "// "+strings.SplitN(src.Reason[name], " ", 2)[0], "reason of %s", name)
		assert.NotEqual(t, src.Meaning[name], src.Reason[name], "%s: meaning and reason must be different comments", name)
		assert.True(t, strings.HasPrefix(src.Meaning[name], name+" "), "%s: the field doc names the field: %q", name, src.Meaning[name])
	}
	for _, name := range src.Derived {
		assert.True(t, strings.HasPrefix(src.DerivedDoc[name], name+" "), "doc of %s: %q", name, src.DerivedDoc[name])
	}
	assert.Contains(t, src.Derived, "WorstCaseDetection")
	assert.NotContains(t, src.Derived, "Scaled", "Scaled takes an argument: not a derived value")
	assert.Equal(t, []string{"RolloutMin", "RolloutMax", "RollbackBound", "FailedRolloutMax"}, src.Fleet,
		"the methods that take a rollout's servers and maxUnavailable, in source order")
	for _, name := range src.Fleet {
		assert.True(t, strings.HasPrefix(src.FleetDoc[name], name+" "), "doc of %s: %q", name, src.FleetDoc[name])
		assert.NotContains(t, src.Derived, name)
	}
	assert.True(t, strings.HasPrefix(src.FuncDoc["RolloutBatches"], "RolloutBatches is how many batches"), src.FuncDoc["RolloutBatches"])
	assert.True(t, strings.HasPrefix(src.FuncDoc["RolloutBatchesMax"], "RolloutBatchesMax is the most batches"), src.FuncDoc["RolloutBatchesMax"])
	assert.True(t, strings.HasPrefix(src.FuncDoc["RollbackBatchesMax"], "RollbackBatchesMax is the most batches"), src.FuncDoc["RollbackBatchesMax"])
	assert.Contains(t, src.FuncDoc, "CheckRollout")
	assert.NotContains(t, src.FuncDoc, "RolloutMin", "a method is not a function of the package")
	assert.Contains(t, src.Rules, infra.RuleDrainOutlasts)
	assert.Contains(t, src.ConstDoc["HealthPath"], "health")
}

// copyInfra copies package infra's non-test files and the module's go.mod
// into a temporary module root, passing timing.go through edit.
func copyInfra(t *testing.T, edit func(string) string) string {
	t.Helper()
	root := moduleRoot(t)
	dst := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dst, "infra"), 0o755))
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dst, "go.mod"), gomod, 0o644))
	files, err := filepath.Glob(filepath.Join(root, "infra", "*.go"))
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		text := string(data)
		if filepath.Base(f) == "timing.go" {
			edited := edit(text)
			require.NotEqual(t, text, edited, "the edit must change timing.go")
			text = edited
		}
		require.NoError(t, os.WriteFile(filepath.Join(dst, "infra", filepath.Base(f)), []byte(text), 0o644))
	}
	return dst
}

// dropCommentAbove removes the comment lines just above the first line that
// starts with key (after indentation).
func dropCommentAbove(text, key string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), key) {
			j := i
			for j > 0 && strings.HasPrefix(strings.TrimSpace(lines[j-1]), "//") {
				j--
			}
			return strings.Join(append(lines[:j:j], lines[i:]...), "\n")
		}
	}
	return text
}

func TestLoadSourceFailsLoudly(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(string) string
		wantErr []string
	}{
		{
			name:    "reason of Drain removed",
			edit:    func(s string) string { return dropCommentAbove(s, "Drain:") },
			wantErr: []string{"field Drain has no reason"},
		},
		{
			name: "reason of Drain detached by a blank line",
			edit: func(s string) string {
				return strings.Replace(s, "\t\tDrain:", "\n\t\tDrain:", 1)
			},
			wantErr: []string{"field Drain has no reason"},
		},
		{
			name: "two reasons removed, both reported",
			edit: func(s string) string {
				return dropCommentAbove(dropCommentAbove(s, "KillMargin:"), "LockWait:")
			},
			wantErr: []string{"field KillMargin has no reason", "field LockWait has no reason"},
		},
		{
			name:    "doc of a field removed",
			edit:    func(s string) string { return dropCommentAbove(s, "NodeSkew time.Duration") },
			wantErr: []string{"field NodeSkew has no doc comment"},
		},
		{
			name:    "doc of a derived value removed",
			edit:    func(s string) string { return dropCommentAbove(s, "func (t Timing) DrainMargin()") },
			wantErr: []string{"method Timing.DrainMargin has no doc comment"},
		},
		{
			name:    "doc of a fleet value removed",
			edit:    func(s string) string { return dropCommentAbove(s, "func (t Timing) RollbackBound(") },
			wantErr: []string{"method Timing.RollbackBound has no doc comment"},
		},
		{
			name:    "doc of RolloutBatches removed",
			edit:    func(s string) string { return dropCommentAbove(s, "func RolloutBatches(") },
			wantErr: []string{"func RolloutBatches has no doc comment"},
		},
		{
			name:    "doc of RollbackBatchesMax removed",
			edit:    func(s string) string { return dropCommentAbove(s, "func RollbackBatchesMax(") },
			wantErr: []string{"func RollbackBatchesMax has no doc comment"},
		},
		{
			name: "the source has a fleet value the binary does not",
			edit: func(s string) string {
				return s + "\n// RolloutSpare is not compiled in.\nfunc (t Timing) RolloutSpare(servers, maxUnavailable int) time.Duration { return 0 }\n"
			},
			wantErr: []string{"the source declares fleet durations [RolloutMin RolloutMax RollbackBound FailedRolloutMax RolloutSpare], the compiled Timing has [FailedRolloutMax RollbackBound RolloutMax RolloutMin]"},
		},
		{
			name: "Prod sets a field the binary does not know",
			edit: func(s string) string {
				return strings.Replace(s, "return Timing{", "return Timing{\n\t\t// Why not.\n\t\tBogus: 1,", 1)
			},
			wantErr: []string{"Prod() sets Bogus"},
		},
		{
			name:    "no Prod",
			edit:    func(s string) string { return strings.Replace(s, "func Prod()", "func prod()", 1) },
			wantErr: []string{"no func Prod"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyInfra(t, tt.edit)
			_, err := contract.LoadSource(dir)
			require.Error(t, err)
			for _, want := range tt.wantErr {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

func TestLoadSourceAcceptsUnchangedCopy(t *testing.T) {
	dir := copyInfra(t, func(s string) string { return s + "\n" })
	src, err := contract.LoadSource(dir)
	require.NoError(t, err)
	assert.Equal(t, loadSource(t), src)
}
