package rollout

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes one line per server: where it was, where it is, what
// happened.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "server\trelease before\trelease now\tverified\twhat happened")
	for _, s := range r.Servers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Server, dash(s.Before), dash(s.Now), s.Verified, strings.Join(s.What, "; "))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the rollout's table: %w", err)
	}
	return nil
}

// WriteJSON writes the report as JSON, every server's story included.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write the rollout's report: %w", err)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
