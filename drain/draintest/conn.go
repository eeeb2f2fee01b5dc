// Package draintest helps test a service that serves through drain the way a
// load balancer meets it: one raw client connection at a time, so a test
// decides which requests share a kept-alive connection, as a balancer's
// connection pool does, and sees whether the server closed it.
package draintest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Conn is one client connection to a server.
type Conn struct {
	c       net.Conn
	br      *bufio.Reader
	timeout time.Duration
}

// Answer is what one request got back.
type Answer struct {
	Status int
	// Close is whether the response told the client to close the connection.
	Close bool
	Body  string
}

// Dial opens a connection to addr; each exchange on it must finish within
// timeout.
func Dial(addr string, timeout time.Duration) (*Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &Conn{c: c, br: bufio.NewReader(c), timeout: timeout}, nil
}

// Close closes the connection.
func (c *Conn) Close() error {
	return c.c.Close()
}

// Get sends GET path on this connection and reads the whole answer.
func (c *Conn) Get(path string) (Answer, error) {
	return c.Do(http.MethodGet, path)
}

// Do sends one request on this connection and reads the whole answer.
func (c *Conn) Do(method, path string) (Answer, error) {
	req, err := http.NewRequest(method, "http://"+c.c.RemoteAddr().String()+path, nil)
	if err != nil {
		return Answer{}, fmt.Errorf("building request: %w", err)
	}
	if err := c.c.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return Answer{}, fmt.Errorf("setting deadline: %w", err)
	}
	if err := req.Write(c.c); err != nil {
		return Answer{}, fmt.Errorf("writing %s %s: %w", method, path, err)
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return Answer{}, fmt.Errorf("reading response to %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{}, fmt.Errorf("reading body of %s %s: %w", method, path, err)
	}
	return Answer{Status: resp.StatusCode, Close: resp.Close, Body: strings.TrimSpace(string(body))}, nil
}

// ClosedByServer waits up to the connection's timeout for the server to
// close it: a read that sees EOF.
func (c *Conn) ClosedByServer() (bool, error) {
	if err := c.c.SetReadDeadline(time.Now().Add(c.timeout)); err != nil {
		return false, fmt.Errorf("setting deadline: %w", err)
	}
	_, err := c.br.ReadByte()
	return errors.Is(err, io.EOF), nil
}
