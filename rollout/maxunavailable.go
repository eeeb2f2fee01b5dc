package rollout

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseMaxUnavailable reads -max-unavailable for a fleet of servers: a
// count, or a percentage of the servers rounded down, at least 1. Whether
// the fleet can take it is infra.CheckRollout's to say.
func ParseMaxUnavailable(arg string, servers int) (int, error) {
	if pct, ok := strings.CutSuffix(arg, "%"); ok {
		v, err := strconv.Atoi(pct)
		if err != nil || v < 1 || v > 100 {
			return 0, fmt.Errorf("-max-unavailable %q must be a count (1 or more) or a percentage (1%% to 100%%)", arg)
		}
		return max(1, servers*v/100), nil
	}
	v, err := strconv.Atoi(arg)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("-max-unavailable %q must be a count (1 or more) or a percentage (1%% to 100%%)", arg)
	}
	return v, nil
}
