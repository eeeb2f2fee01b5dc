package draintest

import (
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The address refuses connections, and no listener can take its port,
// until it is closed; then its port is free again.
func TestRefusedAddr(t *testing.T) {
	addr, closeAddr, err := RefusedAddr()
	require.NoError(t, err)
	c, err := net.Dial("tcp", addr)
	if err == nil {
		_ = c.Close()
	}
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "a connection to %s", addr)
	l, err := net.Listen("tcp", addr)
	if err == nil {
		_ = l.Close()
	}
	assert.ErrorIs(t, err, syscall.EADDRINUSE, "another listener on %s", addr)

	require.NoError(t, closeAddr())
	l, err = net.Listen("tcp", addr)
	require.NoError(t, err, "the port is free once closed")
	require.NoError(t, l.Close())
}
