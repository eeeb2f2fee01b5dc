package rehearsal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
)

// writeRelease writes into dir what the servers of a profile deploy:
// compose.yaml, its checksum and timing.env, rendered by the hooks from t.
//
// The hooks rightly refuse to render a timing that breaks the invariants:
// production must never ship one. The before profile breaks them on purpose,
// with a drain shorter than the balancer's detection. Its servers differ from
// ref's only in that drain, so its release is rendered from t with the drain
// and the balancer-only fields taken from ref (a timing the hooks accept),
// and the drain setting the services read is then put back to t's. Every
// other number the servers read is t's own.
func writeRelease(dir string, t, ref infra.Timing) error {
	if t.ValidateInvariants() == nil {
		if err := hooks.WriteRelease(dir, t); err != nil {
			return fmt.Errorf("write release: %w", err)
		}
		return nil
	}
	r := t
	r.Drain = ref.Drain
	// Read by the balancer alone, never by a server.
	r.HealthCheckInterval = ref.HealthCheckInterval
	r.HealthyThreshold = ref.HealthyThreshold
	r.NodeSkew = ref.NodeSkew
	r.DeregistrationDelay = ref.DeregistrationDelay
	r.LBIdleTimeout = ref.LBIdleTimeout
	if err := hooks.WriteRelease(dir, r); err != nil {
		return fmt.Errorf("write release: the timing breaks more than the drain handshake: %w", err)
	}
	path := filepath.Join(dir, hooks.ComposeFile)
	compose, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("write release: %w", err)
	}
	if compose, err = swapEnv(compose, r.DrainConfig().Environ(), t.DrainConfig().Environ(), len(hooks.Roles)); err != nil {
		return fmt.Errorf("write release: %w", err)
	}
	if err := os.WriteFile(path, compose, 0o644); err != nil {
		return fmt.Errorf("write release: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, hooks.ChecksumFile), hooks.Checksum(compose), 0o644); err != nil {
		return fmt.Errorf("write release: %w", err)
	}
	return nil
}

// swapEnv replaces each environment entry of from that differs from its
// counterpart in to, as the compose file quotes it; each must occur exactly
// once per service.
func swapEnv(compose []byte, from, to []string, services int) ([]byte, error) {
	if len(from) != len(to) {
		return nil, fmt.Errorf("swap env: %d entries for %d", len(to), len(from))
	}
	for i := range from {
		if from[i] == to[i] {
			continue
		}
		old, err := json.Marshal(from[i])
		if err != nil {
			return nil, fmt.Errorf("swap env: %w", err)
		}
		repl, err := json.Marshal(to[i])
		if err != nil {
			return nil, fmt.Errorf("swap env: %w", err)
		}
		if n := bytes.Count(compose, old); n != services {
			return nil, fmt.Errorf("swap env: %s occurs %d times in the compose definition, want once per service (%d)", old, n, services)
		}
		compose = bytes.ReplaceAll(compose, old, repl)
	}
	return compose, nil
}
