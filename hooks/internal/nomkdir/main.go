// Command nomkdir runs a command that cannot create a directory in one
// directory or anywhere below it, for the hooks' tests:
//
//	nomkdir DIR COMMAND [ARG...]
//
// mkdir there fails with EACCES even for root, as it would under a security
// policy; creating, writing and renaming files there still works. A full
// disk is the usual cause in production, but it fails every write at once,
// and the tests need this one step to fail alone.
//
// It uses Landlock (Linux 5.13 or later, enabled by default in Debian's
// kernels), which only grants: the command may create directories beneath
// every directory that is neither DIR nor one of its ancestors. Directly in
// an ancestor of DIR it cannot either. The restriction is the process's
// own and ends with it: nothing is left to undo.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"unsafe"
)

// From linux/landlock.h and the syscall table every architecture shares.
const (
	sysCreateRuleset   = 444
	sysAddRule         = 445
	sysRestrictSelf    = 446
	createRulesetABI   = 1 << 0
	accessFSMakeDir    = 1 << 7
	rulePathBeneath    = 1
	prSetNoNewPrivs    = 38
	exitUsage, exitRun = 2, 1
)

type rulesetAttr struct {
	handledAccessFS uint64
}

// pathBeneathAttr is packed in the kernel (12 bytes); Go pads it to 16,
// past what the kernel reads.
type pathBeneathAttr struct {
	allowedAccess uint64
	parentFd      int32
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: nomkdir DIR COMMAND [ARG...]")
		os.Exit(exitUsage)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "nomkdir:", err)
		os.Exit(exitRun)
	}
}

func run(dir string, argv []string) error {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	allowed, err := elsewhere(dir)
	if err != nil {
		return err
	}
	// Landlock restricts the calling thread; the thread that restricts
	// itself is the one that execs, and the command starts with it alone.
	runtime.LockOSThread()
	if err := restrict(allowed); err != nil {
		return err
	}
	return syscall.Exec(path, argv, os.Environ())
}

// elsewhere lists every directory that is not dir and holds neither dir
// nor any of its ancestors: the siblings of dir and of each ancestor.
func elsewhere(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, err
	}
	var out []string
	for child := real; child != "/"; child = filepath.Dir(child) {
		parent := filepath.Dir(child)
		entries, err := os.ReadDir(parent)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			p, err := filepath.EvalSymlinks(filepath.Join(parent, e.Name()))
			if err != nil {
				continue // a dangling link leads nowhere
			}
			// A link to dir's own path would grant it again.
			if p == child || p == "/" || strings.HasPrefix(real+"/", p+"/") {
				continue
			}
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

func restrict(allowed []string) error {
	abi, _, errno := syscall.RawSyscall(sysCreateRuleset, 0, 0, createRulesetABI)
	if errno != 0 {
		return fmt.Errorf("this kernel has no Landlock (%w): Linux 5.13 or later with landlock in its lsm= list is needed", errno)
	}
	attr := rulesetAttr{handledAccessFS: accessFSMakeDir}
	fd, _, errno := syscall.RawSyscall(sysCreateRuleset, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset (ABI %d): %w", abi, errno)
	}
	for _, p := range allowed {
		if err := allow(int(fd), p); err != nil {
			return err
		}
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", errno)
	}
	if _, _, errno := syscall.RawSyscall(sysRestrictSelf, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", errno)
	}
	return syscall.Close(int(fd))
}

func allow(ruleset int, dir string) error {
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOENT) {
		return nil // gone, or unreadable: nothing is made there anyway
	} else if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer syscall.Close(fd)
	attr := pathBeneathAttr{allowedAccess: accessFSMakeDir, parentFd: int32(fd)}
	if _, _, errno := syscall.RawSyscall6(sysAddRule, uintptr(ruleset), rulePathBeneath, uintptr(unsafe.Pointer(&attr)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_add_rule %s: %w", dir, errno)
	}
	return nil
}
