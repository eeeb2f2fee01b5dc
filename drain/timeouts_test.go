package drain_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

// slowloris opens a connection and sends a request header one line at a
// time, every `every`, never finishing it. It returns the connection and a
// channel that yields the time the server closed it (a read saw EOF or a
// reset).
func slowloris(t *testing.T, addr string, every time.Duration) (net.Conn, <-chan time.Time) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, wait)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, "GET /work HTTP/1.1\r\nHost: test\r\n")
	require.NoError(t, err)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := fmt.Fprintf(c, "X-Slow-%d: still coming\r\n", i); err != nil {
				return
			}
		}
	}()
	closed := make(chan time.Time, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(wait))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return // never closed: the test times out on closed
		}
		closed <- time.Now()
	}()
	return c, closed
}

func waitClosed(t *testing.T, closed <-chan time.Time, what string) time.Time {
	t.Helper()
	select {
	case at := <-closed:
		return at
	case <-time.After(wait):
		require.FailNow(t, "connection never closed by the server", what)
	}
	return time.Time{}
}

// A client that sends its header slowly (slowloris) holds a connection no
// longer than ReadHeaderTimeout, however steadily it trickles.
func TestSlowHeaderIsCutAfterReadHeaderTimeout(t *testing.T) {
	t.Parallel()
	cfg := infra.Prod().Scaled(0.1).DrainConfig()
	r := start(t, cfg, routes(newGate()))
	opened := time.Now()
	_, closed := slowloris(t, r.addr, cfg.ReadHeaderTimeout/10)
	held := waitClosed(t, closed, "slowloris").Sub(opened)
	assert.GreaterOrEqual(t, held, cfg.ReadHeaderTimeout, "cut before the header timeout")
	assert.Less(t, held, cfg.ReadTimeout, "held %v: the header timeout did not act", held)
	// The server still serves everyone else.
	got, err := dial(t, r.addr).Get("/work")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, got.Status)
}

// A trickling header cannot hold a shutdown to its deadline: the header
// timeout is below the shutdown timeout, so the connection is gone first.
// net/http's Shutdown sees a connection gone only at its next poll, and its
// polls back off to 500 ms apart: at a tenth of production the header
// timeout's lead (0.5 s) ends by the poll at 511 ms, and a header cut some
// 20 ms late on a busy machine is seen at the next, 1011 ms, past the 1 s
// deadline (a run beside a CPU hog failed so). At 0.4 the lead is 2 s,
// several polls.
func TestSlowHeaderDoesNotHoldTheShutdown(t *testing.T) {
	t.Parallel()
	cfg := infra.Prod().Scaled(0.4).DrainConfig()
	r := start(t, cfg, routes(newGate()))
	_, closed := slowloris(t, r.addr, cfg.ReadHeaderTimeout/10)
	r.srv.SkipDrain()
	waitFor(t, r.srv.Entered(drain.Stopped), "stopped")
	waitClosed(t, closed, "slowloris at shutdown")
	stopped := r.change(t, drain.Stopped)
	assert.Equal(t, drain.ReasonAllFinished, stopped.Reason, "a slow header held the shutdown to its deadline")
}

// A header over MaxHeaderBytes is refused with 431 rather than read into
// memory.
func TestHeaderOverMaxHeaderBytesIsRefused(t *testing.T) {
	t.Parallel()
	cfg := prod()
	r := start(t, cfg, routes(newGate()))
	tests := []struct {
		name string
		size int
		want int
	}{
		{"within the limit", cfg.MaxHeaderBytes / 2, http.StatusOK},
		// net/http allows 4 KiB of slack over MaxHeaderBytes.
		{"over the limit", cfg.MaxHeaderBytes + 8<<10, http.StatusRequestHeaderFieldsTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", r.addr, wait)
			require.NoError(t, err)
			defer c.Close()
			req := "GET /work HTTP/1.1\r\nHost: test\r\nX-Big: " + strings.Repeat("a", tt.size) + "\r\n\r\n"
			// The server may answer before it has read everything.
			go func() { _, _ = io.WriteString(c, req) }()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			_ = resp.Body.Close()
			assert.Equal(t, tt.want, resp.StatusCode)
		})
	}
}

// held answers after the duration its query asks for. It stops waiting
// when its context ends, unless asked to ignore it (ctx=ignore), as a
// handler busy with work that takes no context would.
func held(w http.ResponseWriter, r *http.Request) {
	d, err := time.ParseDuration(r.URL.Query().Get("for"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	done := r.Context().Done()
	if r.URL.Query().Get("ctx") == "ignore" {
		done = nil
	}
	select {
	case <-time.After(d):
		_, _ = io.WriteString(w, "held "+d.String())
	case <-done:
	}
}

// The read and write deadlines cut nothing the balancer still waits for (a
// request as long as MaxRequest is answered, its context not ended by the
// read deadline), and still bound a request that runs on past them.
func TestRequestDeadlinesCutOnlyWhatTheBalancerGaveUpOn(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(0.01)
	cfg := timing.DrainConfig()
	// The header bound, 50 ms at this scale, runs from accept: it would cut
	// a busy machine's client before it writes, and its cut would pass for
	// the deadlines' below. As long as the keep-alive, it cuts neither.
	cfg.ReadHeaderTimeout = cfg.KeepAlive
	require.GreaterOrEqual(t, cfg.MaxRequest, timing.ShutdownTimeout, "a request the drain lets finish is within MaxRequest")
	r := start(t, cfg, http.HandlerFunc(held))

	got, err := dial(t, r.addr).Get("/held?for=" + cfg.MaxRequest.String())
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, got.Status)
	assert.Equal(t, "held "+cfg.MaxRequest.String(), got.Body)

	over := max(cfg.ReadTimeout, cfg.WriteTimeout) + cfg.MaxRequest/2
	_, err = dial(t, r.addr).Get("/held?ctx=ignore&for=" + over.String())
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a request past the deadlines gets no answer")
}
