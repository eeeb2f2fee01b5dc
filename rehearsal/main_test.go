package rehearsal

import (
	"fmt"
	"os"
	"testing"

	"github.com/mythex/infra/internal/dockerlock"
)

// suiteServers is the rehearsal suite's budget of simulated servers. Its
// Docker tests wait on their timelines (drains, health checks, load
// windows) far more than they compute: one of them, with its two or three
// servers behind twelve nodes under load, keeps about 55 % of a 2-core
// machine busy. Five servers let two of them run side by side (the
// runner's cancel beside the transition, the fleet beside the ssh path);
// the matrix runs alone (TestMatrix says why).
const suiteServers = 5

func TestMain(m *testing.M) {
	if err := dockerlock.SetParallel(suiteServers); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
