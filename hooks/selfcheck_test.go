package hooks

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/needs"
)

// The deploy's and the watchdog's health checks (lib.sh's health_code, run
// by verify_service) are the server's own: the drain library must not count
// them as a balancer node. A one-off check it counted would be a node that
// never fails its checks, and every drain within its window would run its
// fixed length, the evidence drain lost. The check goes to a real drain
// server on loopback, as to a container's published port.
func TestHooksCheckHealthAsTheServersOwn(t *testing.T) {
	needs.Have(t, needs.Tool("curl", "apt-get install curl"))
	srv, err := drain.New(infra.Prod().DrainConfig(), http.NotFoundHandler())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.SkipDrain()
		select {
		case <-srv.Entered(drain.Stopped):
		case <-time.After(30 * time.Second):
			t.Error("the drain server did not stop")
		}
	})

	lib, err := filepath.Abs("lib.sh")
	require.NoError(t, err)
	timingEnv, err := filepath.Abs(TimingEnvFile)
	require.NoError(t, err)
	const script = `set -euo pipefail
source "$1"
load_timing
health_code "$2" 5
printf '\n%s\n' "$SELF_CHECK_HEADER"`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script, "health_code", lib, ln.Addr().String())
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYTHEX_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "MYTHEX_TIMING_ENV="+timingEnv, "MYTHEX_ROOT="+t.TempDir())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	code, header, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	assert.Equal(t, "200", code, "the server is healthy")
	assert.Equal(t, drain.HeaderSelfCheck, header, "lib.sh names the drain library's header")
	assert.Empty(t, srv.Evidence().Nodes, "the hooks' check was counted as a balancer node")
}
