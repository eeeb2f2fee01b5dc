package draintest

import (
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// RefusedAddr returns a loopback address that refuses every connection,
// as a server whose process is gone does, until close is called: a socket
// is bound to its port but does not listen. A port merely closed again
// could be taken by any other bind meanwhile; without SO_REUSEADDR no
// other socket can bind it beside this one.
func RefusedAddr() (addr string, close func() error, err error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("socket: %w", err)
	}
	closeFD := func() error { return syscall.Close(fd) }
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = closeFD()
		return "", nil, fmt.Errorf("bind a loopback port: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		_ = closeFD()
		return "", nil, fmt.Errorf("getsockname: %w", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		_ = closeFD()
		return "", nil, fmt.Errorf("getsockname: %T is not an IPv4 address", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port)), closeFD, nil
}
