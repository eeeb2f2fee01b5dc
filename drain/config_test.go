package drain_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

func envOf(pairs []string) func(string) string {
	m := map[string]string{}
	for _, kv := range pairs {
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				m[kv[:i]] = kv[i+1:]
				break
			}
		}
	}
	return func(k string) string { return m[k] }
}

// What the compose definition renders is what a service reads back.
func TestEnvironRoundTrips(t *testing.T) {
	for _, f := range []float64{1, 0.1, 0.01} {
		want := infra.Prod().Scaled(f).DrainConfig()
		got, err := drain.ConfigFromEnv(envOf(want.Environ()))
		require.NoError(t, err, "scale %v", f)
		assert.Equal(t, want, got, "scale %v", f)
	}
}

func TestConfigFromEnvReportsEveryProblem(t *testing.T) {
	prod := infra.Prod().DrainConfig().Environ()
	with := func(extra ...string) []string { return append(append([]string(nil), prod...), extra...) }
	tests := []struct {
		name    string
		env     []string
		wantErr []string
	}{
		{"nothing set", nil, []string{
			"MYTHEX_HEALTH_PATH is not set", "MYTHEX_HEALTHY_STATUS is not set", "MYTHEX_DRAIN is not set",
			"MYTHEX_SHUTDOWN_TIMEOUT is not set", "MYTHEX_KEEPALIVE is not set",
			"MYTHEX_READ_HEADER_TIMEOUT is not set", "MYTHEX_READ_TIMEOUT is not set", "MYTHEX_WRITE_TIMEOUT is not set",
			"MYTHEX_MAX_HEADER_BYTES is not set", "MYTHEX_MAX_REQUEST is not set",
			"MYTHEX_DRAIN_EVIDENCE is not set", "MYTHEX_HEALTH_CHECK_INTERVAL is not set",
			"MYTHEX_HEALTH_CHECK_TIMEOUT is not set", "MYTHEX_UNHEALTHY_THRESHOLD is not set",
			"MYTHEX_DRAIN_QUIET is not set", "MYTHEX_QUIET_REQUESTS is not set", "MYTHEX_MAX_DRAIN is not set",
		}},
		{"evidence switch not a boolean", with("MYTHEX_DRAIN_EVIDENCE=maybe"), []string{"MYTHEX_DRAIN_EVIDENCE", `"maybe"`}},
		{"evidence numbers that cannot work", with("MYTHEX_MAX_DRAIN=10s", "MYTHEX_QUIET_REQUESTS=0", "MYTHEX_DRAIN_QUIET=0s",
			"MYTHEX_UNHEALTHY_THRESHOLD=0", "MYTHEX_HEALTH_CHECK_INTERVAL=-5s"), []string{
			"MaxDrain 10s must not be below Drain 15s", "QuietRequests 0 must be positive", "DrainQuiet 0s must be positive",
			"UnhealthyThreshold 0 must be positive", "HealthCheckInterval -5s must be positive",
		}},
		{"bad values", with("MYTHEX_HEALTHY_STATUS=ok", "MYTHEX_DRAIN=15", "MYTHEX_KEEPALIVE=soon"), []string{
			"MYTHEX_HEALTHY_STATUS", `"ok"`, "MYTHEX_DRAIN", `"15"`, "MYTHEX_KEEPALIVE", `"soon"`,
		}},
		{"parsed but invalid", with("MYTHEX_HEALTH_PATH=healthz", "MYTHEX_SHUTDOWN_TIMEOUT=-1s"), []string{
			`HealthPath "healthz" must start with /`, "ShutdownTimeout -1s must be positive",
		}},
		{"header size not a number", with("MYTHEX_MAX_HEADER_BYTES=lots"), []string{"MYTHEX_MAX_HEADER_BYTES", `"lots"`}},
		{"bounds not positive", with("MYTHEX_MAX_HEADER_BYTES=0", "MYTHEX_READ_HEADER_TIMEOUT=0s"), []string{
			"MaxHeaderBytes 0 must be positive", "ReadHeaderTimeout 0s must be positive",
		}},
		{"deadlines that cut what the balancer waits for", with("MYTHEX_READ_TIMEOUT=30s", "MYTHEX_WRITE_TIMEOUT=20s"), []string{
			"ReadTimeout 30s must exceed MaxRequest 30s", "WriteTimeout 20s must exceed MaxRequest 30s",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := drain.ConfigFromEnv(envOf(tt.env))
			require.Error(t, err)
			for _, want := range tt.wantErr {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}
