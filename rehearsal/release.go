package rehearsal

import (
	"fmt"

	"github.com/mythex/infra/hooks"
)

// writeRelease writes into dir what the servers of p deploy: compose.yaml,
// its checksum and timing.env, rendered by the hooks from p's timing.
//
// The hooks rightly refuse to render a timing that breaks an invariant:
// production must never ship one. A profile that breaks relations on purpose
// names them (Profile.Breaks) and is rendered by hooks.BrokenReleaseFor, the
// one way to render a broken timing, which refuses any other broken rule.
func writeRelease(dir string, p Profile) error {
	var err error
	if len(p.Breaks) == 0 {
		err = hooks.WriteRelease(dir, p.Timing)
	} else {
		err = hooks.BrokenReleaseFor(dir, p.Timing, p.Breaks...)
	}
	if err != nil {
		return fmt.Errorf("write release of profile %s: %w", p.Name, err)
	}
	return nil
}
