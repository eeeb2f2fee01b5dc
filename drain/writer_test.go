package drain_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

// hijackWays are the two ways a handler takes its connection over:
// the type assertion older WebSocket libraries make, and
// http.ResponseController, which newer ones use.
var hijackWays = []struct {
	name   string
	hijack func(http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error)
}{
	{"http.Hijacker", func(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
		h, ok := w.(http.Hijacker)
		if !ok {
			return nil, nil, fmt.Errorf("%T does not implement http.Hijacker", w)
		}
		return h.Hijack()
	}},
	{"http.ResponseController", func(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
		return http.NewResponseController(w).Hijack()
	}},
}

// upgrader answers a WebSocket-style upgrade the way a WebSocket library
// does: it hijacks the connection, answers 101 itself, then echoes every
// line until the client closes.
type upgrader struct {
	hijack   func(http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error)
	upgraded chan struct{}
}

func (u *upgrader) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "upgrade required", http.StatusUpgradeRequired)
		return
	}
	conn, brw, err := u.hijack(w)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	if brw.Flush() != nil {
		return
	}
	u.upgraded <- struct{}{}
	for {
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := brw.WriteString(line); err != nil || brw.Flush() != nil {
			return
		}
	}
}

// upgrade sends an upgrade request on a new connection and returns the
// connection once the server has answered 101.
func upgrade(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, wait)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode, "upgrade refused: %s", body)
	return c, br
}

func echo(t *testing.T, c net.Conn, br *bufio.Reader, line string) {
	t.Helper()
	_, err := io.WriteString(c, line+"\n")
	require.NoError(t, err)
	got, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, line+"\n", got)
}

// A WebSocket upgraded during the drain works, outlives the listener, and
// the shutdown waits for it: it is closed by its own end, not cut.
func TestUpgradeDuringDrainIsServedAndWaitedFor(t *testing.T) {
	t.Parallel()
	for _, way := range hijackWays {
		t.Run(way.name, func(t *testing.T) {
			t.Parallel()
			u := &upgrader{hijack: way.hijack, upgraded: make(chan struct{}, 1)}
			r := start(t, prod(), u)
			r.srv.StartDrain()
			waitFor(t, r.srv.Entered(drain.Draining), "draining")

			c, br := upgrade(t, r.addr)
			waitFor(t, u.upgraded, "upgraded")
			echo(t, c, br, "during the drain")

			r.srv.SkipDrain()
			waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")
			echo(t, c, br, "after the listener closed")
			select {
			case <-r.srv.Entered(drain.Stopped):
				require.FailNow(t, "stopped with an upgraded connection open: the process would exit under it")
			default:
			}

			require.NoError(t, c.Close())
			waitFor(t, r.srv.Entered(drain.Stopped), "stopped once the connection closed")
			require.NoError(t, <-r.served)
			stopped := r.change(t, drain.Stopped)
			assert.Equal(t, drain.ReasonAllFinished, stopped.Reason)
			assert.Less(t, stopped.Lasted, prod().ShutdownTimeout)
			assert.Empty(t, r.logs.records(t, "hijacked connection cut at shutdown timeout"))
		})
	}
}

// An upgraded connection still open at the shutdown timeout is closed and
// logged, like a request cut there.
func TestHijackedConnectionCutAtShutdownTimeoutIsLogged(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(0.1)
	u := &upgrader{hijack: hijackWays[0].hijack, upgraded: make(chan struct{}, 1)}
	r := start(t, timing.DrainConfig(), u)
	c, br := upgrade(t, r.addr)
	waitFor(t, u.upgraded, "upgraded")
	echo(t, c, br, "serving")

	r.srv.SkipDrain()
	waitFor(t, r.srv.Entered(drain.Stopped), "stopped")
	require.NoError(t, <-r.served)

	// The client sees its connection closed.
	_, err := br.ReadString('\n')
	assert.ErrorIs(t, err, io.EOF)

	stopped := r.change(t, drain.Stopped)
	assert.Equal(t, drain.ReasonDeadline, stopped.Reason)
	assert.GreaterOrEqual(t, stopped.Lasted, timing.ShutdownTimeout)
	cuts := r.logs.records(t, "hijacked connection cut at shutdown timeout")
	require.Len(t, cuts, 1)
	assert.Equal(t, "/ws", cuts[0]["path"])
	assert.Equal(t, "WARN", cuts[0]["level"])
	assert.Empty(t, r.logs.records(t, "request cut at shutdown timeout"), "logged once, as a hijacked connection")
	assert.InDelta(t, 1, r.logs.records(t, "phase stopped")[0]["cut"], 0)
}

// A streaming handler flushes through the drain's writer, and its response
// still closes the connection.
func TestFlushDuringDrain(t *testing.T) {
	t.Parallel()
	ways := []struct {
		name  string
		flush func(http.ResponseWriter) error
	}{
		{"http.Flusher", func(w http.ResponseWriter) error {
			f, ok := w.(http.Flusher)
			if !ok {
				return fmt.Errorf("%T does not implement http.Flusher", w)
			}
			f.Flush()
			return nil
		}},
		{"http.ResponseController", func(w http.ResponseWriter) error { return http.NewResponseController(w).Flush() }},
	}
	for _, way := range ways {
		t.Run(way.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = io.WriteString(w, "first;")
				if err := way.flush(w); err != nil {
					_, _ = io.WriteString(w, err.Error())
					return
				}
				<-release
				_, _ = io.WriteString(w, "second")
			})
			r := start(t, prod(), h)
			r.srv.StartDrain()
			waitFor(t, r.srv.Entered(drain.Draining), "draining")

			c, err := net.DialTimeout("tcp", r.addr, wait)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			_, err = io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
			require.NoError(t, err)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "the header must arrive with the flush, before the handler ends")
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.True(t, resp.Close, "a draining response closes its connection")
			first := make([]byte, len("first;"))
			_, err = io.ReadFull(resp.Body, first)
			require.NoError(t, err)
			assert.Equal(t, "first;", string(first), "flushed while the handler still runs")

			close(release)
			rest, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, "second", string(rest))
		})
	}
}

// A handler that writes nothing answers an implicit 200; during the drain
// that answer must close its connection too.
func TestEmptyHandlerClosesItsConnectionDuringDrain(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	r := start(t, prod(), h)
	c := dial(t, r.addr)
	got, err := c.Get("/empty")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, got.Status)
	require.False(t, got.Close, "keep-alive while serving")

	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.Draining), "draining")
	got, err = c.Get("/empty")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, got.Status)
	assert.True(t, got.Close, "an implicit 200 during the drain must carry Connection: close")
	assert.True(t, closedByServer(t, c))
}
