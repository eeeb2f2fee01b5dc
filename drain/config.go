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
	}{{"Drain", c.Drain}, {"ShutdownTimeout", c.ShutdownTimeout}, {"KeepAlive", c.KeepAlive}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %v must be positive", d.name, d.v))
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
	c.HealthPath = need(EnvHealthPath)
	if v := need(EnvHealthyStatus); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvHealthyStatus, err))
		}
		c.HealthyStatus = n
	}
	c.Drain = dur(EnvDrain)
	c.ShutdownTimeout = dur(EnvShutdownTimeout)
	c.KeepAlive = dur(EnvKeepAlive)
	if len(errs) == 0 {
		errs = append(errs, c.Validate())
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("drain config from environment: %w", err)
	}
	return c, nil
}
