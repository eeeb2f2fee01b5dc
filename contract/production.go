package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/mythex/infra/infra"
)

// AtProduction reads the contract production runs from path, the prod
// stack's outputs as `pulumi stack output --json` writes them: its `timing`
// output holds every field of the timing of the last `pulumi up`. A field
// the output lacks (a stack last deployed before it was exported) is left
// out of the side, so the verdict judges it as added, and says so. An empty
// or unreadable file, an answer without a timing object, or a value of the
// wrong kind is an error naming every problem: the deploy never judges a
// change against a production it could not read.
func AtProduction(path string) (Side, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Side{}, fmt.Errorf("production's timing: %w", err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return Side{}, fmt.Errorf("production's timing: %s is empty (did `pulumi stack output --json` fail?)", path)
	}
	var outputs map[string]json.RawMessage
	if err := json.Unmarshal(data, &outputs); err != nil {
		return Side{}, fmt.Errorf("production's timing: %s is not the JSON object `pulumi stack output --json` writes: %w", path, err)
	}
	raw, ok := outputs["timing"]
	if !ok {
		return Side{}, fmt.Errorf("production's timing: %s has no `timing` output: the stack has never been deployed by `pulumi up` of this program (a first deploy runs `pulumi up` by hand, docs/runbook.md)", path)
	}
	var timing map[string]json.RawMessage
	if err := json.Unmarshal(raw, &timing); err != nil || timing == nil {
		return Side{}, fmt.Errorf("production's timing: the `timing` output in %s is not an object: %s", path, raw)
	}
	var problems []string
	var fields []Value
	for _, f := range TakeSnapshot(infra.Timing{}).Fields {
		key := infra.OutputKey(f.Name)
		v, ok := timing[key]
		if !ok {
			continue
		}
		if string(v) == "null" {
			problems = append(problems, fmt.Sprintf("timing.%s is null", key))
			continue
		}
		switch f.Kind {
		case "duration":
			var s string
			d, err := time.Duration(0), json.Unmarshal(v, &s)
			if err == nil {
				d, err = time.ParseDuration(s)
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("timing.%s %s is not a duration like \"15s\"", key, v))
				continue
			}
			fields = append(fields, Value{Name: f.Name, Kind: f.Kind, Int: int64(d), Text: d.String()})
		case "int":
			var n int64
			if err := json.Unmarshal(v, &n); err != nil {
				problems = append(problems, fmt.Sprintf("timing.%s %s is not a whole number", key, v))
				continue
			}
			fields = append(fields, Value{Name: f.Name, Kind: f.Kind, Int: n, Text: fmt.Sprint(n)})
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return Side{}, fmt.Errorf("production's timing in %s: %s", path, strings.Join(problems, "; "))
	}
	if len(fields) == 0 {
		return Side{}, errors.New("production's timing: the `timing` output in " + path + " has none of the timing's fields")
	}
	side := Side{Label: "production", Snap: Snapshot{Fields: fields, Derived: []Value{}, Violations: []string{}}}
	if all := TakeSnapshot(infra.Timing{}).Fields; len(fields) == len(all) {
		// Every field known: the derived values and violations are this
		// build's reading of production's numbers.
		j := judge(side)
		side.Snap = TakeSnapshot(j.t)
	}
	return side, nil
}
