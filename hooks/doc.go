// Package hooks holds what runs on every server: the one compose definition,
// rendered from the timing contract, and the scripts that deploy it, watch
// it and bootstrap a server, all under one lock.
//
// The article's four fixes each live in one place:
//
//   - One lock: lib.sh (lock_wait, lock_try), taken by deploy, bootstrap and
//     watchdog on the same path, never deleted.
//   - Four strikes: watchdog restarts a service only after
//     infra.Timing.WatchdogStrikes consecutive failed checks.
//   - One definition: compose.yaml, rendered from compose.tmpl and
//     infra.Prod(), published whole with compose.yaml.sha256 and refused by
//     the server when the checksum does not match. A server keeps each
//     release (definition, checksum, deployed values) in a directory of its
//     own and switches the symlink `current` to it with one rename.
//   - Verify, don't trust: deploy succeeds only after api, orchestrator,
//     gateway and publish-worker each answer with their role and the new
//     version, and every replaced container drained and exited 0.
//
// The numbers the scripts need are in timing.env, and the watchdog's
// systemd units are rendered, from the same timing. Regenerate every generated file with:
//
//	go generate ./hooks
//
// Tests fail when a generated file is stale.
package hooks

//go:generate go run ./internal/gen
