// Command crashonce runs a program and, the first time its container
// starts, kills it and exits 1 after a delay: a release that starts healthy
// and crashes a few seconds later, for the rehearsal's broken-release
// scenario. When Docker restarts the container it runs the program alone,
// so the crash shows once, as a die event and a restart, and the service
// serves again.
//
//	crashonce DELAY PROGRAM [ARG...]
//
// It records its first run in a file of the container's own writable layer,
// which a restart keeps and a new container does not have.
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// doneFile marks that this container crashed once. The image runs as root,
// so / is writable.
const doneFile = "/crashonce.done"

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: crashonce DELAY PROGRAM [ARG...]")
		os.Exit(2)
	}
	delay, err := time.ParseDuration(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashonce:", err)
		os.Exit(2)
	}
	program, args := os.Args[2], os.Args[2:]
	if _, err := os.Stat(doneFile); err == nil {
		// Restarted after the crash: the program alone, as PID 1.
		err := syscall.Exec(program, args, os.Environ())
		fmt.Fprintln(os.Stderr, "crashonce:", err)
		os.Exit(1)
	} else if !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintln(os.Stderr, "crashonce:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(doneFile, nil, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "crashonce:", err)
		os.Exit(1)
	}
	cmd := exec.Command(program, args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "crashonce:", err)
		os.Exit(1)
	}
	// A stop before the crash reaches the program, as it would without
	// this wrapper.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case s := <-sig:
		_ = cmd.Process.Signal(s)
		<-done
		os.Exit(0)
	case err := <-done:
		fmt.Fprintln(os.Stderr, "crashonce: the program ended first:", err)
		os.Exit(1)
	case <-time.After(delay):
		fmt.Fprintf(os.Stderr, "crashonce: crashing after %v\n", delay)
		_ = cmd.Process.Kill()
		os.Exit(1)
	}
}
