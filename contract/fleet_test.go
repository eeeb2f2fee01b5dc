package contract_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

// prodFleet is the fleet TIMING.md is generated for.
func prodFleet(t *testing.T) contract.Fleet {
	t.Helper()
	f, err := contract.LoadProdFleet(moduleRoot(t))
	require.NoError(t, err)
	return f
}

// prodServers counts Pulumi.prod.yaml's instance IDs as the stack loader
// hands them to the program.
func prodServers(t *testing.T) int {
	t.Helper()
	stack, err := infra.LoadStackFile(filepath.Join(moduleRoot(t), contract.ProdStackFile))
	require.NoError(t, err)
	var ids []string
	require.NoError(t, json.Unmarshal([]byte(stack.Config[infra.KeyInstanceIDs]), &ids))
	require.NotEmpty(t, ids)
	return len(ids)
}

// fleetRows is what the contract must show of a rollout of k servers, n at a
// time, computed here from package infra.
func fleetRows(tm infra.Timing, k, n int) map[string]string {
	call := func(name string) string { return fmt.Sprintf("%s(%d, %d)", name, k, n) }
	return map[string]string{
		call("RolloutBatches"):     strconv.Itoa(infra.RolloutBatches(k, n)),
		call("RolloutBatchesMax"):  strconv.Itoa(infra.RolloutBatchesMax(k, n)),
		call("RollbackBatchesMax"): strconv.Itoa(infra.RollbackBatchesMax(k, n)),
		call("RolloutMin"):         contract.FormatDuration(tm.RolloutMin(k, n)),
		call("RolloutMax"):         contract.FormatDuration(tm.RolloutMax(k, n)),
		call("RollbackBound"):      contract.FormatDuration(tm.RollbackBound(k, n)),
		call("FailedRolloutMax"):   contract.FormatDuration(tm.FailedRolloutMax(k, n)),
	}
}

func TestLoadProdFleet(t *testing.T) {
	f := prodFleet(t)
	assert.Equal(t, contract.Fleet{Stack: "prod", Servers: prodServers(t), MaxUnavailable: infra.DefaultMaxUnavailable}, f)

	_, err := contract.LoadProdFleet(t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the prod fleet: read stack file")
}

func TestLoadProdFleetHere(t *testing.T) {
	f, err := contract.LoadProdFleetHere()
	require.NoError(t, err)
	assert.Equal(t, prodFleet(t), f)

	t.Chdir(t.TempDir())
	_, err = contract.LoadProdFleetHere()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run this inside the repository")
}

func TestStackFleet(t *testing.T) {
	stack, err := infra.LoadStackFile(filepath.Join(moduleRoot(t), contract.ProdStackFile))
	require.NoError(t, err)
	stack.Stack = "staging"
	stack.Config[infra.KeyInstanceIDs] = `["i-0123456789abcdef0","i-0123456789abcdef1","i-0123456789abcdef2"]`
	f, err := contract.StackFleet(stack)
	require.NoError(t, err)
	assert.Equal(t, contract.Fleet{Stack: "staging", Servers: 3, MaxUnavailable: 1}, f)

	stack.Config[infra.KeyInstanceIDs] = `[]`
	_, err = contract.StackFleet(stack)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "servers of stack staging: invalid stack config")
	assert.Contains(t, err.Error(), "instanceIds has 0 entries")
}

func TestFleetValues(t *testing.T) {
	src := loadSource(t)
	tm := infra.Prod()
	for _, f := range []contract.Fleet{
		{Stack: "prod", Servers: 2, MaxUnavailable: 1},
		{Stack: "one", Servers: 1, MaxUnavailable: 1},
		{Stack: "big", Servers: 10, MaxUnavailable: 4},
	} {
		t.Run(f.Stack, func(t *testing.T) {
			vs, err := contract.FleetValues(tm, f, src)
			require.NoError(t, err)
			want := fleetRows(tm, f.Servers, f.MaxUnavailable)
			got := map[string]string{}
			for _, v := range vs {
				got[v.Call] = v.Value
				name, _, _ := strings.Cut(v.Call, "(")
				assert.True(t, strings.HasPrefix(v.Doc, name+" "), "the doc of %s names it: %q", name, v.Doc)
			}
			assert.Equal(t, want, got)
			assert.Equal(t, fmt.Sprintf("RolloutBatches(%d, %d)", f.Servers, f.MaxUnavailable), vs[0].Call, "the batches come first")
		})
	}
	// Each value is the method's own, not another's.
	vs, err := contract.FleetValues(tm, contract.Fleet{Stack: "prod", Servers: 2, MaxUnavailable: 1}, src)
	require.NoError(t, err)
	calls := make([]string, len(vs))
	for i, v := range vs {
		calls[i] = v.Call
	}
	assert.Equal(t, []string{"RolloutBatches(2, 1)", "RolloutBatchesMax(2, 1)", "RollbackBatchesMax(2, 1)",
		"RolloutMin(2, 1)", "RolloutMax(2, 1)", "RollbackBound(2, 1)", "FailedRolloutMax(2, 1)"}, calls,
		"the batch counts, then the durations in source order")
}

func TestFleetValuesRefuseAnUnsafeRollout(t *testing.T) {
	src := loadSource(t)
	for _, f := range []contract.Fleet{
		{Stack: "prod", Servers: 2, MaxUnavailable: 2},
		{Stack: "prod", Servers: 2, MaxUnavailable: 0},
		{Stack: "empty", Servers: 0, MaxUnavailable: 1},
	} {
		_, err := contract.FleetValues(infra.Prod(), f, src)
		var ire *infra.InvalidRolloutError
		require.ErrorAs(t, err, &ire, "%+v", f)
		assert.True(t, strings.HasPrefix(err.Error(), "stack "+f.Stack+": invalid rollout"), err.Error())

		var b bytes.Buffer
		assert.ErrorAs(t, contract.WriteText(&b, infra.Prod(), src, f), &ire)
		assert.ErrorAs(t, contract.WriteMarkdown(&b, infra.Prod(), src, f), &ire)
		assert.Zero(t, b.Len(), "nothing is written for a rollout that is refused")
	}
}

func TestTextShowsTheFleet(t *testing.T) {
	tm := infra.Prod()
	k := prodServers(t)
	out := text(t, tm)
	assert.Contains(t, out, fmt.Sprintf("\nFleet rollout: stack prod's %d servers (mythex-infra:instanceIds in Pulumi.prod.yaml) at --max-unavailable 1, the default\n", k))
	for call, value := range fleetRows(tm, k, 1) {
		assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(call)+` +`+regexp.QuoteMeta(value)+` +`+call[:strings.Index(call, "(")]+` `, out)
	}
	assert.Regexp(t, `(?m)^  RolloutBatchMax +`+regexp.QuoteMeta(contract.FormatDuration(tm.RolloutBatchMax()))+` +RolloutBatchMax bounds`, out, "a derived value")

	src := loadSource(t)
	var b bytes.Buffer
	require.NoError(t, contract.WriteText(&b, tm, src, contract.Fleet{Stack: "big", Servers: 10, MaxUnavailable: 3}))
	assert.Contains(t, b.String(), "\nFleet rollout: stack big's 10 servers (mythex-infra:instanceIds in Pulumi.big.yaml) at --max-unavailable 3\n",
		"not the default: not called so")
	assert.Regexp(t, `(?m)^  RolloutBatches\(10, 3\) +4 +RolloutBatches is`, b.String())

	b.Reset()
	require.NoError(t, contract.WriteText(&b, tm, src, contract.Fleet{Stack: "one", Servers: 1, MaxUnavailable: 1}))
	assert.Contains(t, b.String(), "\nFleet rollout: stack one's 1 server (mythex-infra:instanceIds in Pulumi.one.yaml) at --max-unavailable 1, the default\n")
}

func TestMarkdownShowsTheFleet(t *testing.T) {
	tm := infra.Prod()
	src := loadSource(t)
	k := prodServers(t)
	md := markdown(t, tm)
	_, section, found := strings.Cut(md, "\n## Fleet rollout\n\n")
	require.True(t, found, "TIMING.md has a fleet rollout section")
	assert.True(t, strings.HasPrefix(section, fmt.Sprintf(
		"For stack `prod`'s %d servers (`mythex-infra:instanceIds` in `Pulumi.prod.yaml`) at `--max-unavailable 1`, the default.\n\n", k)),
		section)
	assert.Contains(t, section, "| Function | Value | What it is |\n|---|---:|---|\n")
	for call, value := range fleetRows(tm, k, 1) {
		name := call[:strings.Index(call, "(")]
		doc := src.FuncDoc[name]
		if doc == "" {
			doc = src.FleetDoc[name]
		}
		require.NotEmpty(t, doc, name)
		assert.Contains(t, section, "| `"+call+"` | "+value+" | "+strings.ReplaceAll(doc, "|", `\|`)+" |\n")
	}
	assert.Contains(t, md, "| `RolloutBatchMax()` | "+contract.FormatDuration(tm.RolloutBatchMax())+" | ", "a derived value")
	assert.Less(t, strings.Index(md, "\n## Derived values"), strings.Index(md, "\n## Fleet rollout"), "after the values it is made of")
}
