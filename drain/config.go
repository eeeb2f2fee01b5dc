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
	// Drain is how long real traffic is still served after health turns 503.
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
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %v must be positive", d.name, d.v))
		}
	}
	if c.MaxHeaderBytes <= 0 {
		errs = append(errs, fmt.Errorf("MaxHeaderBytes %d must be positive", c.MaxHeaderBytes))
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
	if len(errs) == 0 {
		errs = append(errs, c.Validate())
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("drain config from environment: %w", err)
	}
	return c, nil
}
