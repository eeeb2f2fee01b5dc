package rollout

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mythex/infra/infra"
)

// ReleaseFiles is what a release is on a server: the hooks and the
// published definition, shipped with every call.
var ReleaseFiles = []string{"deploy", "bootstrap", "watchdog", "remote-deploy", "lib.sh", "timing.env",
	"compose.yaml", "compose.yaml.sha256", "mythex-watchdog.service", "mythex-watchdog.timer"}

// SSH runs remote-deploy on a server over ssh: it ships the release's
// files (from HooksDir) to RemoteReleases/Version and runs its
// remote-deploy there. ssh's connection set-up and keep-alives are bounded
// by the contract; the call itself by its context.
type SSH struct {
	HooksDir       string
	Version        string
	Config         string   // ssh -F; "" ssh's own
	RemoteReleases string   // absolute
	Sudo           []string // how the remote commands become root; empty: as the ssh user
	AppPort        int
	ImagePrefix    string
	Timing         infra.Timing
	// Stdout and Stderr take the servers' output, each line after the
	// server's name; nil discards it. The servers of a batch write side by
	// side: each must be safe for concurrent use (an *os.File is).
	Stdout, Stderr io.Writer
}

// Options are the ssh options every call uses: a host whose key is not
// known is refused, and a connection that cannot be set up, or that goes
// silent, ends by the contract's bounds.
func (s SSH) Options() []string {
	t := s.Timing
	var o []string
	if s.Config != "" {
		o = append(o, "-F", s.Config)
	}
	return append(o,
		"-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "ConnectTimeout="+wholeSeconds(t.SSHConnectTimeout()),
		"-o", "ServerAliveInterval="+wholeSeconds(t.SSHAliveInterval()),
		"-o", "ServerAliveCountMax="+strconv.Itoa(t.SSHAliveCountMax()),
	)
}

// wholeSeconds is d in the whole seconds ssh takes, rounded up, at least 1.
func wholeSeconds(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// Status implements Transport.
func (s SSH) Status(ctx context.Context, server string) (Status, error) {
	var out bytes.Buffer
	if err := s.run(ctx, server, &out, "--status"); err != nil {
		return Status{}, err
	}
	return ParseStatus(out.String())
}

// Deploy implements Transport.
func (s SSH) Deploy(ctx context.Context, server, version string) error {
	return s.run(ctx, server, nil, version)
}

// Rollback implements Transport.
func (s SSH) Rollback(ctx context.Context, server, version string) error {
	return s.run(ctx, server, nil, "--rollback", version)
}

// Attach implements Transport: remote-deploy --attach waits on the server
// for the deploy or rollback to end, then answers as --status does, with
// the server's record of how it ended on a line of its own.
func (s SSH) Attach(ctx context.Context, server, version string) (Status, error) {
	var out bytes.Buffer
	if err := s.run(ctx, server, &out, "--attach", version); err != nil {
		return Status{}, err
	}
	st, err := ParseStatus(out.String())
	if err != nil {
		return Status{}, err
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if rec, ok := strings.CutPrefix(line, "last-deploy "); ok {
			st.Last = rec
		}
	}
	return st, nil
}

// ParseStatus reads remote-deploy --status's line: release=V previous=P
// verified=yes|no.
func ParseStatus(out string) (Status, error) {
	var st Status
	verified := ""
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "release":
			st.Release = v
		case "previous":
			st.Previous = v
		case "verified":
			verified = v
		}
	}
	switch verified {
	case "yes":
		st.Verified = true
	case "no":
	default:
		return Status{}, fmt.Errorf("--status answered something unreadable: %q", line)
	}
	return st, nil
}

// quote is word as one POSIX shell word.
func quote(word string) string {
	return "'" + strings.ReplaceAll(word, "'", `'\''`) + "'"
}

func (s SSH) remote(args ...string) string {
	sudo := ""
	for _, w := range s.Sudo {
		sudo += quote(w) + " "
	}
	dest := s.RemoteReleases + "/" + s.Version
	cmd := fmt.Sprintf("set -e; %smkdir -p -m 0755 -- %s; %star --no-same-owner --no-same-permissions -C %s -xf -; %senv MYTHEX_APP_PORT=%s MYTHEX_IMAGE_PREFIX=%s %s",
		sudo, quote(dest), sudo, quote(dest), sudo, quote(strconv.Itoa(s.AppPort)), quote(s.ImagePrefix), quote(dest+"/remote-deploy"))
	for _, a := range args {
		cmd += " " + quote(a)
	}
	return cmd
}

// archive is the release as a tar, every file root's with no group or
// other write: root runs them on the server.
func (s SSH) archive() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range ReleaseFiles {
		b, err := os.ReadFile(filepath.Join(s.HooksDir, name))
		if err != nil {
			return nil, fmt.Errorf("the release's files: %w", err)
		}
		st, err := os.Stat(filepath.Join(s.HooksDir, name))
		if err != nil {
			return nil, fmt.Errorf("the release's files: %w", err)
		}
		h := &tar.Header{Name: name, Mode: int64(st.Mode().Perm() &^ 0o022), Size: int64(len(b)), ModTime: st.ModTime(), Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("archive %s: %w", name, err)
		}
		if _, err := tw.Write(b); err != nil {
			return nil, fmt.Errorf("archive %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("archive the release: %w", err)
	}
	return buf.Bytes(), nil
}

// ErrSSH is ssh's own failure (exit 255): the connection failed or
// dropped; whatever had started on the server runs on.
var ErrSSH = errors.New("ssh failed or the connection dropped")

func (s SSH) run(ctx context.Context, server string, stdout io.Writer, args ...string) error {
	tarball, err := s.archive()
	if err != nil {
		return err
	}
	argv := append(s.Options(), "--", server, s.remote(args...))
	cmd := exec.CommandContext(ctx, "ssh", argv...)
	cmd.Stdin = bytes.NewReader(tarball)
	// Its own process group: a Ctrl-C to the rollout's group reaches the
	// rollout alone, which decides what a cancel stops.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second
	outW := prefixWriter(s.Stdout, server)
	if stdout != nil {
		outW = stdout
	}
	errW := prefixWriter(s.Stderr, server)
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Run()
	if f, ok := errW.(flusher); ok {
		f.flush()
	}
	if f, ok := outW.(flusher); ok {
		f.flush()
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s %s: no end within its bound (%w); it runs on to its end on the server", server, strings.Join(args, " "), context.Cause(ctx))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 255 {
		return fmt.Errorf("%s %s: %w (exit 255)", server, strings.Join(args, " "), ErrSSH)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", server, strings.Join(args, " "), err)
	}
	return nil
}

type flusher interface{ flush() }

// lineWriter writes each line it is given after a prefix.
type lineWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func prefixWriter(w io.Writer, server string) io.Writer {
	if w == nil {
		return io.Discard
	}
	return &lineWriter{w: w, prefix: "[" + server + "] "}
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		if _, err := fmt.Fprintf(l.w, "%s%s\n", l.prefix, l.buf[:i]); err != nil {
			return len(p), fmt.Errorf("relay a server's output: %w", err)
		}
		l.buf = l.buf[i+1:]
	}
}

func (l *lineWriter) flush() {
	if len(l.buf) > 0 {
		sc := bufio.NewScanner(bytes.NewReader(l.buf))
		for sc.Scan() {
			fmt.Fprintf(l.w, "%s%s\n", l.prefix, sc.Text())
		}
		l.buf = nil
	}
}
