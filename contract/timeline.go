package contract

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/mythex/infra/infra"
)

// Event is one moment of a drain, counted from SIGTERM.
type Event struct {
	At time.Duration
	// Term names the Timing field or method that sets At.
	Term string
	What string
}

// Timeline is what happens to one server after Docker sends SIGTERM, in the
// order the contract promises. With a broken contract the order changes, and
// so does the text: the timeline tells the truth about the numbers it gets.
func Timeline(t infra.Timing) []Event {
	detect := t.WorstCaseDetection()
	events := []Event{
		{0, "SIGTERM", "health answers 503; real requests are still served"},
		{t.EarliestDrainEnd(), "EarliestDrainEnd", "the soonest the drain ends on evidence: every node has failed its checks and no request has come for DrainQuiet"},
		{detect, "WorstCaseDetection", "the balancer has noticed: every node has stopped routing here"},
		{t.ListenerCloses(), "Drain", "the listener closes, unless requests still arrive; in-flight requests go on"},
		{t.ShutdownDeadline(), "ShutdownDeadline", "in-flight requests are done (any still running are cut) and the process exits"},
		{t.MaxDrain, "MaxDrain", "the latest the listener closes, with requests still arriving (logged as an error)"},
		{t.MaxShutdownDeadline(), "MaxShutdownDeadline", "after a drain that ran to MaxDrain, in-flight requests are done and the process exits"},
		{t.StopGracePeriod, "StopGracePeriod", fmt.Sprintf("Docker would send SIGKILL; never reached, the process exited %s before (%s after a drain that ran to MaxDrain)",
			FormatDuration(t.KillSlack()), FormatDuration(t.StopGracePeriod-t.MaxShutdownDeadline()))},
	}
	if detect >= t.ListenerCloses() {
		events[2].What = "the balancer has noticed, too late: it sent requests to a closed listener (502s) since Drain"
	}
	switch {
	case t.KillSlack() <= 0:
		events[7].What = "Docker sends SIGKILL while the shutdown is still running (exit 137)"
	case t.StopGracePeriod <= t.MaxShutdownDeadline():
		events[7].What = "Docker sends SIGKILL while a drain that ran to MaxDrain is still shutting down (exit 137)"
	}
	// Stable: equal times keep the causal order written above.
	sort.SliceStable(events, func(i, j int) bool { return events[i].At < events[j].At })
	return events
}

func writeTimelineText(w io.Writer, t infra.Timing, indent string) error {
	for _, e := range Timeline(t) {
		if _, err := fmt.Fprintf(w, "%st=%-7s %-19s %s\n", indent, FormatDuration(e.At), e.Term, e.What); err != nil {
			return fmt.Errorf("write timeline: %w", err)
		}
	}
	return nil
}

// secs prints a duration as a number of seconds for a mermaid axis in
// dateFormat X (Unix seconds).
func secs(d time.Duration) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", d.Seconds()), "0"), ".")
}

// writeGantt draws the drain as a mermaid gantt chart, which GitHub renders
// in a pull request, so a reviewer sees the picture change with the numbers.
func writeGantt(w io.Writer, t infra.Timing) error {
	detect, closes, deadline, kill := t.WorstCaseDetection(), t.ListenerCloses(), t.ShutdownDeadline(), t.StopGracePeriod
	var b strings.Builder
	task := func(name, tags, id string, from, to time.Duration) {
		if tags != "" {
			tags += ", "
		}
		fmt.Fprintf(&b, "    %s :%s%s, %s, %s\n", name, tags, id, secs(from), secs(to))
	}
	b.WriteString("```mermaid\ngantt\n")
	b.WriteString("    title Drain of one server, seconds after SIGTERM\n")
	b.WriteString("    dateFormat X\n    axisFormat %Ss\n")
	b.WriteString("    section Balancer\n")
	task(fmt.Sprintf("may still route here, worst case %s", FormatDuration(detect)), "crit", "route", 0, detect)
	if detect < closes {
		task(fmt.Sprintf("stopped routing, margin %s", FormatDuration(closes-detect)), "done", "margin", detect, closes)
	} else {
		task(fmt.Sprintf("routes to a closed listener for %s (502s)", FormatDuration(detect-closes)), "crit", "gap", closes, detect)
	}
	b.WriteString("    section Health check\n")
	task("answers 503", "active", "h503", 0, deadline)
	b.WriteString("    section Server\n")
	task("serves real traffic (Drain)", "", "serve", 0, closes)
	if t.MaxDrain > closes {
		task(fmt.Sprintf("serves on while requests still arrive, up to MaxDrain %s", FormatDuration(t.MaxDrain)), "active", "extend", closes, t.MaxDrain)
	}
	task("listener closed, in-flight finish (ShutdownTimeout)", "", "inflight", closes, deadline)
	if deadline < kill {
		task(fmt.Sprintf("exited, %s before SIGKILL", FormatDuration(kill-deadline)), "done", "slack", deadline, kill)
	} else {
		task(fmt.Sprintf("killed mid-shutdown, %s short", FormatDuration(deadline-kill)), "crit", "cut", kill, deadline)
	}
	b.WriteString("    section Docker\n")
	fmt.Fprintf(&b, "    SIGKILL (StopGracePeriod %s) :milestone, kill, %s, 0s\n", FormatDuration(kill), secs(kill))
	b.WriteString("```\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write gantt: %w", err)
	}
	return nil
}
