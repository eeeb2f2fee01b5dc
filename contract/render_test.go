package contract_test

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

func text(t *testing.T, tm infra.Timing) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, contract.WriteText(&b, tm, loadSource(t), prodFleet(t)))
	return b.String()
}

func markdown(t *testing.T, tm infra.Timing) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, contract.WriteMarkdown(&b, tm, loadSource(t), prodFleet(t)))
	return b.String()
}

// brokenDrain is Prod with a drain that ends exactly when worst-case
// detection does: no margin, so the drain-outlasts-detection rule breaks.
func brokenDrain() infra.Timing {
	tm := infra.Prod()
	tm.Drain = tm.WorstCaseDetection()
	return tm
}

func TestWriteTextShowsEveryValueReasonAndMargin(t *testing.T) {
	tm := infra.Prod()
	src := loadSource(t)
	out := text(t, tm)
	flat := strings.Join(strings.Fields(out), " ")
	for _, v := range contract.TakeSnapshot(tm).Fields {
		value := v.Text
		if v.Kind == "duration" {
			value = contract.FormatDuration(time.Duration(v.Int))
		}
		assert.Regexp(t, `(?m)^  `+v.Name+` +`+regexp.QuoteMeta(value)+` `, out, "value of %s", v.Name)
		assert.Contains(t, flat, src.Reason[v.Name], "reason of %s", v.Name)
	}
	for _, name := range src.Derived {
		assert.Regexp(t, `(?m)^  `+name+` +\S+ `, out)
	}
	for _, r := range contract.Relations {
		if !r.Binds(tm) {
			assert.Regexp(t, `(?m)^  idle +`+string(r.Rule)+` +`+regexp.QuoteMeta(contract.Line(r, tm)+"; binds with "+r.AppliesWhen)+`$`, out)
			continue
		}
		assert.Regexp(t, `(?m)^  holds +`+string(r.Rule)+` +`+regexp.QuoteMeta(contract.Line(r, tm))+`$`, out)
	}
	assert.Regexp(t, `(?m)^  holds +slots-registered +RegisteredSlots 1 vs Slots 1 \(needs ≥\)$`, out)
	assert.Contains(t, out, "GET "+infra.HealthPath+", healthy = "+strconv.Itoa(infra.HealthyStatus))
	assert.Contains(t, out, "Valid: every rule holds.")
	assert.NotContains(t, out, "BROKEN")
}

// TestWriteTextShowsTheSlotsDesign: a timing of two slots binds the
// handover relation, and shows it broken when it is.
func TestWriteTextShowsTheSlotsDesign(t *testing.T) {
	tm := infra.Prod()
	tm.Slots, tm.RegisteredSlots = 2, 2
	assert.Regexp(t, `(?m)^  holds +handover-keeps-capacity +HandoverRemoval 15s vs AdmissionMax 13s: margin 2s \(needs ≥ NodeSkew 1s\)$`, text(t, tm))
	tm.HealthCheckTimeout, tm.NodeSkew, tm.DrainQuiet, tm.Drain = 4*time.Second, 1500*time.Millisecond, 1500*time.Millisecond, 16*time.Second
	out := text(t, tm)
	assert.Regexp(t, `(?m)^  BROKEN +handover-keeps-capacity +HandoverRemoval 15s vs AdmissionMax 14s: margin 1s \(needs ≥ NodeSkew 1.5s\)$`, out)
	assert.Contains(t, out, "INVALID: 1 rule(s) broken")
	mixed := infra.Prod()
	mixed.Slots = 2
	assert.Regexp(t, `(?m)^  BROKEN +slots-registered +RegisteredSlots 1 vs Slots 2 \(needs ≥\)$`, text(t, mixed), "a count rule with its sides")
}

func TestWriteTextShowsBrokenRules(t *testing.T) {
	tm := brokenDrain()
	out := text(t, tm)
	assert.Regexp(t, `(?m)^  BROKEN +drain-outlasts-detection +Drain `, out)
	assert.Contains(t, strings.Join(strings.Fields(out), " "), tm.Violations()[0].Msg)
	assert.Contains(t, out, "INVALID: 1 rule(s) broken")
	assert.Contains(t, out, "(Prod has "+contract.FormatDuration(infra.Prod().Drain)+")", "a reason written for another value is flagged")
	assert.Contains(t, out, "too late")
}

func TestTimeline(t *testing.T) {
	tests := []struct {
		name  string
		tm    infra.Timing
		terms []string
		want  map[string]string
	}{
		{
			name:  "prod",
			tm:    infra.Prod(),
			terms: []string{"SIGTERM", "EarliestDrainEnd", "WorstCaseDetection", "Drain", "ShutdownDeadline", "MaxDrain", "MaxShutdownDeadline", "StopGracePeriod"},
			want:  map[string]string{"WorstCaseDetection": "has noticed:", "StopGracePeriod": "never reached"},
		},
		{
			name: "drain shorter than detection: closes first, and says so",
			tm: func() infra.Timing {
				tm := infra.Prod()
				tm.Drain = tm.WorstCaseDetection() - 2*time.Second
				return tm
			}(),
			terms: []string{"SIGTERM", "EarliestDrainEnd", "Drain", "WorstCaseDetection", "ShutdownDeadline", "MaxDrain", "MaxShutdownDeadline", "StopGracePeriod"},
			want:  map[string]string{"WorstCaseDetection": "502"},
		},
		{
			name: "grace shorter than shutdown: killed mid-shutdown",
			tm: func() infra.Timing {
				tm := infra.Prod()
				tm.StopGracePeriod = tm.ShutdownDeadline() - time.Second
				return tm
			}(),
			terms: []string{"SIGTERM", "EarliestDrainEnd", "WorstCaseDetection", "Drain", "StopGracePeriod", "ShutdownDeadline", "MaxDrain", "MaxShutdownDeadline"},
			want:  map[string]string{"StopGracePeriod": "exit 137"},
		},
		{
			name: "grace shorter than a drain to MaxDrain: killed mid-shutdown after it",
			tm: func() infra.Timing {
				tm := infra.Prod()
				tm.StopGracePeriod = tm.MaxShutdownDeadline()
				return tm
			}(),
			terms: []string{"SIGTERM", "EarliestDrainEnd", "WorstCaseDetection", "Drain", "ShutdownDeadline", "MaxDrain", "MaxShutdownDeadline", "StopGracePeriod"},
			want:  map[string]string{"StopGracePeriod": "ran to MaxDrain is still shutting down (exit 137)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events := contract.Timeline(tt.tm)
			var terms []string
			for i, e := range events {
				terms = append(terms, e.Term)
				if i > 0 {
					assert.LessOrEqual(t, events[i-1].At, e.At)
				}
				if w, ok := tt.want[e.Term]; ok {
					assert.Contains(t, e.What, w, e.Term)
				}
			}
			assert.Equal(t, tt.terms, terms)
			assert.Equal(t, tt.tm.WorstCaseDetection(), at(events, "WorstCaseDetection"))
			assert.Equal(t, tt.tm.ListenerCloses(), at(events, "Drain"))
			assert.Equal(t, tt.tm.ShutdownDeadline(), at(events, "ShutdownDeadline"))
			assert.Equal(t, tt.tm.StopGracePeriod, at(events, "StopGracePeriod"))
			assert.Equal(t, tt.tm.EarliestDrainEnd(), at(events, "EarliestDrainEnd"))
			assert.Equal(t, tt.tm.MaxDrain, at(events, "MaxDrain"))
			assert.Equal(t, tt.tm.MaxShutdownDeadline(), at(events, "MaxShutdownDeadline"))
		})
	}
}

func at(events []contract.Event, term string) time.Duration {
	for _, e := range events {
		if e.Term == term {
			return e.At
		}
	}
	return -1
}

var ganttTask = regexp.MustCompile(`^    ([^:;#]+) :((?:crit|done|active|milestone), )*([a-z0-9]+), ([0-9.]+), ([0-9.]+s?)$`)

// gantt returns the mermaid block of a markdown document, checked line by
// line against the subset of the gantt syntax it is meant to use.
func gantt(t *testing.T, md string) map[string][2]float64 {
	t.Helper()
	start := strings.Index(md, "```mermaid\n")
	require.GreaterOrEqual(t, start, 0, "no mermaid block")
	body := md[start+len("```mermaid\n"):]
	end := strings.Index(body, "```")
	require.Greater(t, end, 0, "mermaid block not closed")
	lines := strings.Split(strings.TrimRight(body[:end], "\n"), "\n")
	require.Equal(t, "gantt", lines[0])
	assert.Contains(t, lines, "    dateFormat X")
	tasks := map[string][2]float64{}
	for _, l := range lines[1:] {
		switch {
		case strings.HasPrefix(l, "    title "), strings.HasPrefix(l, "    dateFormat "),
			strings.HasPrefix(l, "    axisFormat "), strings.HasPrefix(l, "    section "):
			continue
		}
		m := ganttTask.FindStringSubmatch(l)
		require.NotNilf(t, m, "not a gantt task line: %q", l)
		id := m[3]
		require.NotContains(t, tasks, id, "task ids must be unique")
		from, err := strconv.ParseFloat(m[4], 64)
		require.NoError(t, err)
		to := from
		if !strings.HasSuffix(m[5], "s") {
			to, err = strconv.ParseFloat(m[5], 64)
			require.NoError(t, err)
		}
		assert.LessOrEqualf(t, from, to, "task %s ends before it starts", id)
		tasks[id] = [2]float64{from, to}
	}
	return tasks
}

func TestMarkdownGantt(t *testing.T) {
	tm := infra.Prod()
	tasks := gantt(t, markdown(t, tm))
	s := func(d time.Duration) float64 { return d.Seconds() }
	assert.Equal(t, [2]float64{0, s(tm.WorstCaseDetection())}, tasks["route"])
	assert.Equal(t, [2]float64{s(tm.WorstCaseDetection()), s(tm.Drain)}, tasks["margin"])
	assert.Equal(t, [2]float64{0, s(tm.Drain)}, tasks["serve"])
	assert.Equal(t, [2]float64{s(tm.Drain), s(tm.ShutdownDeadline())}, tasks["inflight"])
	assert.Equal(t, [2]float64{s(tm.ShutdownDeadline()), s(tm.StopGracePeriod)}, tasks["slack"])
	assert.Equal(t, [2]float64{s(tm.StopGracePeriod), s(tm.StopGracePeriod)}, tasks["kill"])

	broken := gantt(t, markdown(t, brokenDrain()))
	assert.NotContains(t, broken, "margin")
	assert.Contains(t, broken, "gap")
}

func TestMarkdown(t *testing.T) {
	tm := infra.Prod()
	src := loadSource(t)
	md := markdown(t, tm)
	assert.True(t, strings.HasPrefix(md, "<!-- Code generated by `"+contract.GenerateCommand+"`. DO NOT EDIT. -->\n"))
	for _, v := range contract.TakeSnapshot(tm).Fields {
		assert.Contains(t, md, "| `"+v.Name+"` | ", v.Name)
		assert.Contains(t, md, strings.ReplaceAll(src.Reason[v.Name], "|", `\|`), "reason of %s", v.Name)
	}
	for _, r := range contract.Relations {
		assert.Contains(t, md, "| `"+string(r.Rule)+"` | "+r.Left.Name+" "+contract.FormatDuration(r.Left.Value(tm)))
	}
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| ") {
			assert.True(t, strings.HasSuffix(line, " |"), "table row: %q", line)
		}
	}
	assert.Contains(t, md, "all hold.")
	assert.NotContains(t, md, "BROKEN")

	bad := markdown(t, brokenDrain())
	assert.Contains(t, bad, "**BROKEN**: "+brokenDrain().Violations()[0].Msg)

	limits := infra.Prod()
	limits.HealthCheckInterval = 301 * time.Second
	assert.Contains(t, markdown(t, limits), "HealthCheckInterval 5m1s must be within")
}

func TestWriteFindsSourceFromWorkingDirectory(t *testing.T) {
	var b bytes.Buffer
	fleet := prodFleet(t)
	require.NoError(t, contract.Write(&b, infra.Prod(), fleet))
	assert.Equal(t, text(t, infra.Prod()), b.String())

	t.Chdir(t.TempDir())
	err := contract.Write(&b, infra.Prod(), fleet)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run this inside the repository")
}
