package hooks

import (
	"errors"
	"fmt"
	"slices"

	"github.com/mythex/infra/infra"
)

// BrokenReleaseFor is the only way to render a timing that breaks an
// invariant: the rehearsal's invariant matrix deploys it to show the symptom
// users would see when that one relation is broken. It writes what
// WriteRelease writes, for a t that breaks the relations named by breaks and
// no other rule the renderer checks; any other broken rule, or a named
// relation t keeps, is refused like an invalid timing. Production and go
// generate render with WriteRelease and Generated, which refuse every broken
// timing; TestBrokenReleaseOnlyForTheRehearsal keeps it that way.
func BrokenReleaseFor(dir string, t infra.Timing, breaks ...infra.Rule) error {
	if len(breaks) == 0 {
		return errors.New("broken release: name the relations it breaks")
	}
	return writeRelease(dir, t, breaks)
}

// checkBreaksOnly reports every rule ValidateInvariants finds broken in t
// other than breaks, and each of breaks t keeps.
func checkBreaksOnly(t infra.Timing, breaks []infra.Rule) error {
	var errs []error
	broken := map[infra.Rule]bool{}
	var inv *infra.InvalidTimingError
	if err := t.ValidateInvariants(); errors.As(err, &inv) {
		for _, v := range inv.Violations {
			if slices.Contains(breaks, v.Rule) {
				broken[v.Rule] = true
				continue
			}
			errs = append(errs, v)
		}
	} else if err != nil {
		return fmt.Errorf("broken release: %w", err)
	}
	for _, r := range breaks {
		if !broken[r] {
			errs = append(errs, fmt.Errorf("the timing is meant to break %s but keeps it", r))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("broken release for %v: %w", breaks, err)
	}
	return nil
}
