package dockerlock

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// The hold outlives garbage collection: another process cannot take the
// lock while this test binary holds it. (A finalized *os.File would close
// the descriptor and release the lock under the suite.)
func TestHoldSurvivesGarbageCollection(t *testing.T) {
	_, err := exec.LookPath("flock")
	require.NoError(t, err, "this test needs flock (apt-get install util-linux)")
	dir := t.TempDir()
	Path = dir + "/suites.lock"
	Hold(t)
	require.True(t, holding())
	runtime.GC()
	runtime.GC()
	out, err := exec.Command("flock", "-n", Path, "true").CombinedOutput()
	require.Error(t, err, "another process took the lock while this binary holds it: %s", out)
	_, statErr := os.Stat(Path)
	require.NoError(t, statErr, "the lock file is never deleted")
}
