package drain

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The environment variables a service reads its Config from. The compose
// definition, rendered from the timing contract, sets every one of them, so a
// service never carries a number of its own.
const (
	EnvHealthPath      = "MYTHEX_HEALTH_PATH"
	EnvHealthyStatus   = "MYTHEX_HEALTHY_STATUS"
	EnvDrain           = "MYTHEX_DRAIN"
	EnvShutdownTimeout = "MYTHEX_SHUTDOWN_TIMEOUT"
	EnvKeepAlive       = "MYTHEX_KEEPALIVE"
	EnvReadHeader      = "MYTHEX_READ_HEADER_TIMEOUT"
	EnvReadTimeout     = "MYTHEX_READ_TIMEOUT"
	EnvWriteTimeout    = "MYTHEX_WRITE_TIMEOUT"
	EnvMaxHeaderBytes  = "MYTHEX_MAX_HEADER_BYTES"
	EnvMaxRequest      = "MYTHEX_MAX_REQUEST"
	EnvEvidence        = "MYTHEX_DRAIN_EVIDENCE"
	EnvCheckInterval   = "MYTHEX_HEALTH_CHECK_INTERVAL"
	EnvCheckTimeout    = "MYTHEX_HEALTH_CHECK_TIMEOUT"
	EnvUnhealthy       = "MYTHEX_UNHEALTHY_THRESHOLD"
	EnvDrainQuiet      = "MYTHEX_DRAIN_QUIET"
	EnvQuietRequests   = "MYTHEX_QUIET_REQUESTS"
	EnvMaxDrain        = "MYTHEX_MAX_DRAIN"
)

// Config is the server's side of the handshake with the balancer. Build it
// from the timing contract (infra.Timing.DrainConfig) or, inside a container,
// from the environment the compose definition sets (ConfigFromEnv).
type Config struct {
	// HealthPath is the route the balancer checks; it answers 503 while draining.
	HealthPath string
	// HealthyStatus is what HealthPath answers while the service is serving
	// and ready: the target group's matcher.
	HealthyStatus int
	// Drain is how long real traffic is still served after health turns 503
	// when the evidence drain cannot tell better (the fixed drain).
	Drain time.Duration
	// ShutdownTimeout bounds in-flight requests after the listener closes.
	ShutdownTimeout time.Duration
	// KeepAlive is the idle keep-alive timeout outside the drain; it must
	// outlast the balancer's idle timeout.
	KeepAlive time.Duration
	// ReadHeaderTimeout bounds reading a request's header, from its first
	// byte: a client that trickles its header (slowloris) is cut then.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, header and body. net/http
	// also ends a running request's context when it passes, so it must
	// outlast MaxRequest.
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its header to the end
	// of its answer; it must outlast MaxRequest. A handler that hijacks its
	// connection starts with no deadline.
	WriteTimeout time.Duration
	// MaxHeaderBytes bounds a request's header; a larger one is answered 431.
	MaxHeaderBytes int
	// MaxRequest is the longest a request may take and still be answered
	// through the balancer. Handlers that hold requests (long polls, the
	// reference service's /work) stay within it.
	MaxRequest time.Duration

	// Evidence turns on the evidence drain (see Server): the drain ends
	// when the balancer's checks and the silence of real traffic show that
	// it has stopped sending, and goes on past Drain while requests still
	// arrive. Off, the drain lasts Drain exactly.
	Evidence bool
	// HealthCheckInterval and HealthCheckTimeout are the balancer's: how
	// often each of its nodes checks this server, and how long one check
	// may take.
	HealthCheckInterval time.Duration
	HealthCheckTimeout  time.Duration
	// UnhealthyThreshold is how many failed checks take a server out of a
	// balancer node's rotation.
	UnhealthyThreshold int
	// DrainQuiet is how long no real request may arrive before the drain
	// ends on evidence, and what "requests have stopped" means past Drain.
	DrainQuiet time.Duration
	// QuietRequests is the least number of real requests in the DrainQuiet
	// before the drain for silence to count as evidence.
	QuietRequests int
	// MaxDrain bounds a drain that requests keep going past Drain.
	MaxDrain time.Duration
}

// EarliestEnd is the soonest the evidence drain may end after health turned
// 503: no balancer node can have acted before its UnhealthyThreshold-th
// failed check, (UnhealthyThreshold − 1) intervals after the first at the
// soonest, and the requests it sent just before acting arrive within
// DrainQuiet. infra.Timing.EarliestDrainEnd is the same bound.
func (c Config) EarliestEnd() time.Duration {
	return c.HealthCheckInterval*time.Duration(c.UnhealthyThreshold-1) + c.DrainQuiet
}

// Validate reports every field that cannot work, all at once.
func (c Config) Validate() error {
	var errs []error
	if c.HealthPath == "" || c.HealthPath[0] != '/' {
		errs = append(errs, fmt.Errorf("HealthPath %q must start with /", c.HealthPath))
	}
	if c.HealthyStatus < 200 || c.HealthyStatus > 299 {
		errs = append(errs, fmt.Errorf("HealthyStatus %d must be a 2xx status", c.HealthyStatus))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Drain", c.Drain}, {"ShutdownTimeout", c.ShutdownTimeout}, {"KeepAlive", c.KeepAlive},
		{"ReadHeaderTimeout", c.ReadHeaderTimeout}, {"ReadTimeout", c.ReadTimeout},
		{"WriteTimeout", c.WriteTimeout}, {"MaxRequest", c.MaxRequest},
		{"HealthCheckInterval", c.HealthCheckInterval}, {"HealthCheckTimeout", c.HealthCheckTimeout},
		{"DrainQuiet", c.DrainQuiet}, {"MaxDrain", c.MaxDrain},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %v must be positive", d.name, d.v))
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"MaxHeaderBytes", c.MaxHeaderBytes}, {"UnhealthyThreshold", c.UnhealthyThreshold}, {"QuietRequests", c.QuietRequests}} {
		if n.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %d must be positive", n.name, n.v))
		}
	}
	// The drain past Drain is an extension: its bound cannot cut the fixed
	// drain short.
	if c.Drain > 0 && c.MaxDrain > 0 && c.MaxDrain < c.Drain {
		errs = append(errs, fmt.Errorf("MaxDrain %v must not be below Drain %v", c.MaxDrain, c.Drain))
	}
	// The timing contract derives these; a Config built by hand must not
	// cut a request its own MaxRequest allows.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ReadTimeout", c.ReadTimeout}, {"WriteTimeout", c.WriteTimeout}} {
		if c.MaxRequest > 0 && d.v > 0 && d.v <= c.MaxRequest {
			errs = append(errs, fmt.Errorf("%s %v must exceed MaxRequest %v, or it cuts requests the balancer still waits for", d.name, d.v, c.MaxRequest))
		}
	}
	return errors.Join(errs...)
}

// Environ returns c as KEY=value pairs, in the form ConfigFromEnv reads.
func (c Config) Environ() []string {
	return []string{
		EnvHealthPath + "=" + c.HealthPath,
		EnvHealthyStatus + "=" + strconv.Itoa(c.HealthyStatus),
		EnvDrain + "=" + c.Drain.String(),
		EnvShutdownTimeout + "=" + c.ShutdownTimeout.String(),
		EnvKeepAlive + "=" + c.KeepAlive.String(),
		EnvReadHeader + "=" + c.ReadHeaderTimeout.String(),
		EnvReadTimeout + "=" + c.ReadTimeout.String(),
		EnvWriteTimeout + "=" + c.WriteTimeout.String(),
		EnvMaxHeaderBytes + "=" + strconv.Itoa(c.MaxHeaderBytes),
		EnvMaxRequest + "=" + c.MaxRequest.String(),
		EnvEvidence + "=" + strconv.FormatBool(c.Evidence),
		EnvCheckInterval + "=" + c.HealthCheckInterval.String(),
		EnvCheckTimeout + "=" + c.HealthCheckTimeout.String(),
		EnvUnhealthy + "=" + strconv.Itoa(c.UnhealthyThreshold),
		EnvDrainQuiet + "=" + c.DrainQuiet.String(),
		EnvQuietRequests + "=" + strconv.Itoa(c.QuietRequests),
		EnvMaxDrain + "=" + c.MaxDrain.String(),
	}
}

// ConfigFromEnv reads a Config through getenv (os.Getenv in a service). Every
// variable is required: a default here would be a second copy of the
// contract. All problems are reported at once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	var errs []error
	need := func(key string) string {
		v := getenv(key)
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is not set", key))
		}
		return v
	}
	dur := func(key string) time.Duration {
		v := need(key)
		if v == "" {
			return 0
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
		return d
	}
	num := func(key string) int {
		v := need(key)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
		return n
	}
	c.HealthPath = need(EnvHealthPath)
	c.HealthyStatus = num(EnvHealthyStatus)
	c.Drain = dur(EnvDrain)
	c.ShutdownTimeout = dur(EnvShutdownTimeout)
	c.KeepAlive = dur(EnvKeepAlive)
	c.ReadHeaderTimeout = dur(EnvReadHeader)
	c.ReadTimeout = dur(EnvReadTimeout)
	c.WriteTimeout = dur(EnvWriteTimeout)
	c.MaxHeaderBytes = num(EnvMaxHeaderBytes)
	c.MaxRequest = dur(EnvMaxRequest)
	if v := need(EnvEvidence); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvEvidence, err))
		}
		c.Evidence = b
	}
	c.HealthCheckInterval = dur(EnvCheckInterval)
	c.HealthCheckTimeout = dur(EnvCheckTimeout)
	c.UnhealthyThreshold = num(EnvUnhealthy)
	c.DrainQuiet = dur(EnvDrainQuiet)
	c.QuietRequests = num(EnvQuietRequests)
	c.MaxDrain = dur(EnvMaxDrain)
	if len(errs) == 0 {
		errs = append(errs, c.Validate())
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("drain config from environment: %w", err)
	}
	return c, nil
}
