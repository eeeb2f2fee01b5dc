// Package sshd runs Debian's OpenSSH server on loopback, so the rollout's
// production path (ssh, tar, remote-deploy) runs for real in the hooks'
// tests and in `rehearse -ssh`: a throwaway host key and user key, a free
// port, and a TCP relay in front of it that can drop every connection, as a
// network does.
//
// Each simulated server is a Host entry of an ssh configuration, as each
// instance id is in production. A server's own settings (MYTHEX_ROOT,
// MYTHEX_PROJECT, MYTHEX_SYSTEMD_DIR, MYTHEX_BIND), which a real server
// leaves at their defaults, reach its session through ssh's SetEnv and
// sshd's AcceptEnv.
package sshd

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Install is how to get what this package runs.
const Install = "apt-get install openssh-server"

// HostKeyAlias is the name the host key is known under, whatever the port.
const HostKeyAlias = "mythex-test-sshd"

// Find returns the sshd binary, or an error naming the install command.
func Find() (string, error) {
	for _, c := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(c); err != nil {
			return "", fmt.Errorf("%s is missing: apt-get install openssh-client", c)
		}
	}
	if p, err := exec.LookPath("sshd"); err == nil {
		return p, nil
	}
	const p = "/usr/sbin/sshd" // not on a non-root PATH
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("OpenSSH's server is missing: %s", Install)
	}
	return p, nil
}

// Keygen makes an ed25519 key pair at path and returns the public half.
func Keygen(path string) ([]byte, error) {
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ssh-keygen: %w: %s", err, out)
	}
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		return nil, fmt.Errorf("ssh-keygen: %w", err)
	}
	return bytes.TrimSpace(pub), nil
}

// Server is one sshd on loopback, reached through Relay.
type Server struct {
	// User is who logs in: the user running sshd.
	User string
	// UserKey is the private key sshd accepts.
	UserKey string
	// HostPub is the host key's public half.
	HostPub []byte
	// Relay is the address clients use; Cut drops every connection.
	Relay *Relay

	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
}

// Start runs sshd with its keys and configuration in dir, and returns once
// it listens.
func Start(dir string, timeout time.Duration) (*Server, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	u, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	if os.Geteuid() == 0 {
		// sshd running as root needs its privilege separation directory,
		// which Debian's sshd.service creates (RuntimeDirectory=sshd).
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			return nil, fmt.Errorf("sshd: %w", err)
		}
	}
	s := &Server{User: u.Username, UserKey: filepath.Join(dir, "user_key"), done: make(chan struct{})}
	if s.HostPub, err = Keygen(filepath.Join(dir, "host_key")); err != nil {
		return nil, err
	}
	userPub, err := Keygen(s.UserKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), append(userPub, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	config := fmt.Sprintf(`ListenAddress 127.0.0.1:%d
HostKey %s
PidFile %s
AuthorizedKeysFile %s
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
AcceptEnv MYTHEX_*
LogLevel VERBOSE
`, port, filepath.Join(dir, "host_key"), filepath.Join(dir, "sshd.pid"), filepath.Join(dir, "authorized_keys"))
	configFile := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	s.cmd = exec.Command(bin, "-D", "-e", "-f", configFile)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("sshd: %w", err)
	}
	// Ready once it says it listens; everything it says is kept.
	ready := make(chan struct{})
	var once sync.Once
	listening := "Server listening on 127.0.0.1 port " + strconv.Itoa(port)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.logs.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			if strings.Contains(sc.Text(), listening) {
				once.Do(func() { close(ready) })
			}
		}
		once.Do(func() { close(ready) })
	}()
	select {
	case <-ready:
	case <-time.After(timeout):
	}
	if !strings.Contains(s.Log(), listening) {
		s.Stop()
		return nil, fmt.Errorf("sshd did not start within %v:\n%s", timeout, s.Log())
	}
	if s.Relay, err = startRelay("127.0.0.1:" + strconv.Itoa(port)); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Stop ends sshd and the relay.
func (s *Server) Stop() {
	if s.Relay != nil {
		s.Relay.close()
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
}

// Log is everything sshd has said.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// KnownHosts is the known_hosts line of the host key.
func (s *Server) KnownHosts() []byte {
	return []byte(HostKeyAlias + " " + string(s.HostPub) + "\n")
}

// Host is one simulated server: its ssh name and its settings on this
// machine.
type Host struct {
	Name, Root, Project, Bind string
}

// WriteClientConfig writes, into dir, an ssh configuration with one Host
// entry per host, reached through the relay with the user key, whose host
// key is checked against knownHosts (written beside it). extra goes into
// every entry. It returns the configuration's path.
func (s *Server) WriteClientConfig(dir string, knownHosts []byte, extra string, hosts ...Host) (string, error) {
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, knownHosts, 0o600); err != nil {
		return "", fmt.Errorf("ssh config: %w", err)
	}
	var b strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&b, `Host %s
  HostName 127.0.0.1
  Port %d
  User %s
  IdentityFile %s
  IdentitiesOnly yes
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  HostKeyAlias %s
  LogLevel ERROR
  SetEnv MYTHEX_ROOT=%s MYTHEX_PROJECT=%s MYTHEX_SYSTEMD_DIR=%s MYTHEX_BIND=%s
%s
`, h.Name, s.Relay.Port, s.User, s.UserKey, kh, HostKeyAlias, h.Root, h.Project, filepath.Join(h.Root, "systemd"), h.Bind, extra)
	}
	path := filepath.Join(dir, "ssh_config")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("ssh config: %w", err)
	}
	return path, nil
}

// CheckSession makes sure a host's settings reach its ssh session, before
// anything runs there with production's defaults (/opt/mythex).
func CheckSession(config string, h Host) error {
	out, err := exec.Command("ssh", "-F", config, "-o", "BatchMode=yes", "--", h.Name, "printenv MYTHEX_ROOT").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ssh %s: %w: %s", h.Name, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != h.Root {
		return fmt.Errorf("ssh %s: MYTHEX_ROOT is %q in the session, want %q (SetEnv/AcceptEnv)", h.Name, got, h.Root)
	}
	return nil
}

// Relay forwards loopback connections to sshd and can cut them all.
type Relay struct {
	Port int

	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startRelay(target string) (*Relay, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("ssh relay: %w", err)
	}
	r := &Relay{Port: l.Addr().(*net.TCPAddr).Port, l: l}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, in, out)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return r, nil
}

// Cut drops every connection through the relay, as a network that fails.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

func (r *Relay) close() {
	_ = r.l.Close()
	r.Cut()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
