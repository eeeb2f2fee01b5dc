package hooks

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/mythex/infra/infra"
)

// Roles are the services every server runs, in the order the scripts check
// and report them.
var Roles = []string{"api", "orchestrator", "gateway", "publish-worker"}

// BalancerRole is the service the load balancer's target group sends to: the
// only one published beyond loopback.
const BalancerRole = "api"

// The variables compose.yaml interpolates. Deploy records their values in
// the server's state/deployed.env; the watchdog restarts from that file.
const (
	EnvVersion     = "MYTHEX_VERSION"
	EnvAppPort     = "MYTHEX_APP_PORT"
	EnvBind        = "MYTHEX_BIND"
	EnvImagePrefix = "MYTHEX_IMAGE_PREFIX"
)

// composeVars lists the variables above in the order deployed.env holds them.
var composeVars = []string{EnvVersion, EnvImagePrefix, EnvBind, EnvAppPort}

const (
	// DefaultImagePrefix names the images when MYTHEX_IMAGE_PREFIX is unset:
	// mythex/<role>:<version>.
	DefaultImagePrefix = "mythex"
	// defaultBind publishes api on every interface of the server, where the
	// load balancer reaches it.
	defaultBind = "0.0.0.0"
	// containerPort is where every service listens inside its container;
	// each container has its own network namespace, so one port fits all.
	containerPort = 8080
)

// The files go generate writes into hooks/, each checked for staleness by
// the tests.
const (
	ComposeFile   = "compose.yaml"
	ChecksumFile  = "compose.yaml.sha256"
	TimingEnvFile = "timing.env"
	TimerFile     = "mythex-watchdog.timer"
	ServiceFile   = "mythex-watchdog.service"
)

//go:embed compose.tmpl
var composeTemplate string

var composeTmpl = template.Must(template.New("compose").Option("missingkey=error").Parse(composeTemplate))

// ImageName is the image a role runs at a version.
func ImageName(prefix, role, version string) string {
	return prefix + "/" + role + ":" + version
}

// checkRenderable reports why t cannot drive the scripts: broken invariants,
// or a duration finer than the millisecond the scripts count in. breaks is
// empty except through BrokenReleaseFor.
func checkRenderable(t infra.Timing, breaks []infra.Rule) error {
	errs := []error{t.ValidateInvariants()}
	if len(breaks) > 0 {
		errs = []error{checkBreaksOnly(t, breaks)}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"StopGracePeriod", t.StopGracePeriod},
		{"ContainerHealthInterval", t.ContainerHealthInterval},
		{"ContainerHealthTimeout", t.ContainerHealthTimeout},
		{"Reentry", t.Reentry()},
		{"HealthCheckTimeout", t.HealthCheckTimeout},
		{"HealthCheckInterval", t.HealthCheckInterval},
		{"NodeSkew", t.NodeSkew},
		{"StartTimeout", t.StartTimeout},
		{"LockWait", t.LockWait},
		{"WatchdogInterval", t.WatchdogInterval},
	} {
		if d.v%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("%s %v must be whole milliseconds: the scripts count in milliseconds", d.name, d.v))
		}
	}
	// The scripts run one slot: a release of two would promise a handover
	// they never make (docs/capacity.md says what the slots design asks of
	// them).
	if t.Slots != 1 {
		errs = append(errs, fmt.Errorf("the hooks run one slot a server, and Slots is %d: the slots design (docs/capacity.md) is not built into them", t.Slots))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("timing cannot be rendered for the hooks: %w", err)
	}
	return nil
}

// span writes d the way compose and systemd both read it: whole seconds as
// "30s", anything finer as milliseconds ("600ms").
func span(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
}

type composeService struct {
	Role, Image, Publish string
}

// RenderCompose renders the compose definition for t. Its stop grace period
// must be whole seconds, the unit the Docker engine takes.
func RenderCompose(t infra.Timing) ([]byte, error) { return renderCompose(t, nil) }

func renderCompose(t infra.Timing, breaks []infra.Rule) ([]byte, error) {
	if err := checkRenderable(t, breaks); err != nil {
		return nil, err
	}
	if t.StopGracePeriod%time.Second != 0 {
		return nil, fmt.Errorf("timing cannot be rendered for compose: StopGracePeriod %v must be whole seconds: the Docker engine takes the stop timeout in seconds", t.StopGracePeriod)
	}
	ref := func(name, fallback string) string { return "${" + name + ":-" + fallback + "}" }
	versionRef := "${" + EnvVersion + ":?set " + EnvVersion + " to the release to run}"
	var services []composeService
	for _, role := range Roles {
		publish := "127.0.0.1:" // loopback, on a port Docker picks
		if role == BalancerRole {
			publish = ref(EnvBind, defaultBind) + ":${" + EnvAppPort + ":?set " + EnvAppPort + " to the target group's port}"
		}
		services = append(services, composeService{
			Role:    role,
			Image:   ImageName(ref(EnvImagePrefix, DefaultImagePrefix), role, versionRef),
			Publish: publish,
		})
	}
	var drainEnv []string
	for _, kv := range t.DrainConfig().Environ() {
		// JSON strings are YAML strings; $ would start an interpolation.
		q, err := json.Marshal(strings.ReplaceAll(kv, "$", "$$"))
		if err != nil {
			return nil, fmt.Errorf("quote %q: %w", kv, err)
		}
		drainEnv = append(drainEnv, string(q))
	}
	data := map[string]any{
		"Services":           services,
		"StopGrace":          span(t.StopGracePeriod),
		"Drain":              t.Drain.String(),
		"Shutdown":           t.ShutdownTimeout.String(),
		"KillMargin":         t.KillSlack().String(),
		"HealthInterval":     span(t.ContainerHealthInterval),
		"HealthTimeout":      span(t.ContainerHealthTimeout),
		"Retries":            t.UnhealthyThreshold,
		"DrainEnv":           drainEnv,
		"ContainerPort":      containerPort,
		"VersionRef":         versionRef,
		"VarVersion":         EnvVersion,
		"VarAppPort":         EnvAppPort,
		"VarBind":            EnvBind,
		"VarImagePrefix":     EnvImagePrefix,
		"DefaultBind":        defaultBind,
		"DefaultImagePrefix": DefaultImagePrefix,
	}
	var b bytes.Buffer
	if err := composeTmpl.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("render compose definition: %w", err)
	}
	return b.Bytes(), nil
}

// Checksum is the published checksum file of a compose definition, in
// sha256sum's format.
func Checksum(compose []byte) []byte {
	sum := sha256.Sum256(compose)
	return []byte(hex.EncodeToString(sum[:]) + "  " + ComposeFile + "\n")
}

// RenderTimingEnv renders the numbers the scripts read. Durations are whole
// milliseconds, so bash's integer arithmetic handles a scaled timing too.
func RenderTimingEnv(t infra.Timing) ([]byte, error) { return renderTimingEnv(t, nil) }

func renderTimingEnv(t infra.Timing, breaks []infra.Rule) ([]byte, error) {
	if err := checkRenderable(t, breaks); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(`# The numbers the hooks scripts need, generated from the timing contract
# (infra.Timing) by ` + "`go generate ./hooks`" + `: do not edit. Durations are
# milliseconds. The scripts parse this file (they do not source it).
`)
	for _, kv := range timingEnvValues(t) {
		// A value is bare, or wholly in one pair of double quotes when it
		// holds a space; lib.sh's load_timing reads exactly that.
		v := kv[1]
		if strings.Contains(v, " ") {
			v = `"` + v + `"`
		}
		fmt.Fprintf(&b, "%s=%s\n", kv[0], v)
	}
	return b.Bytes(), nil
}

// timingEnvValues are timing.env's keys and what each means, unquoted, in
// the file's order.
func timingEnvValues(t infra.Timing) [][2]string {
	ms := func(d time.Duration) string { return strconv.FormatInt(int64(d/time.Millisecond), 10) }
	return [][2]string{
		{"MYTHEX_LOCK_WAIT_MS", ms(t.LockWait)},
		{"MYTHEX_START_TIMEOUT_MS", ms(t.StartTimeout)},
		{"MYTHEX_STOP_GRACE_PERIOD_MS", ms(t.StopGracePeriod)},
		{"MYTHEX_CONTAINER_HEALTH_INTERVAL_MS", ms(t.ContainerHealthInterval)},
		{"MYTHEX_CONTAINER_HEALTH_TIMEOUT_MS", ms(t.ContainerHealthTimeout)},
		// How long a deploy watches its new containers stay healthy: as
		// long as the balancer takes to re-admit the server, so a container
		// that cannot stay up that long fails the deploy, and the wait
		// overlaps the re-entry the rollout waits for anyway; and for at
		// least this many of each container's own checks, which a busy
		// server runs later than their interval says.
		{"MYTHEX_SETTLE_MS", ms(t.Reentry())},
		{"MYTHEX_SETTLE_CHECKS", strconv.Itoa(t.SettleChecks())},
		{"MYTHEX_WATCHDOG_INTERVAL_MS", ms(t.WatchdogInterval)},
		{"MYTHEX_DEPLOY_DOWNTIME_MS", ms(t.DeployDowntime())},
		{"MYTHEX_WATCHDOG_HOLD_MS", ms(t.WatchdogHold())},
		{"MYTHEX_DEPLOY_HOLD_MS", ms(t.DeployHold)},
		{"MYTHEX_REMOTE_HOLD_MS", ms(t.RemoteHold())},
		{"MYTHEX_WATCHDOG_STRIKES", strconv.Itoa(t.WatchdogStrikes)},
		{"MYTHEX_HEALTH_PATH", infra.HealthPath},
		{"MYTHEX_HEALTHY_STATUS", strconv.Itoa(infra.HealthyStatus)},
		{"MYTHEX_SERVICES", strings.Join(Roles, " ")},
		{"MYTHEX_COMPOSE_VARS", strings.Join(composeVars, " ")},
	}
}

// RenderTimer renders the systemd timer that runs the watchdog every
// WatchdogInterval.
func RenderTimer(t infra.Timing) ([]byte, error) { return renderTimer(t, nil) }

func renderTimer(t infra.Timing, breaks []infra.Rule) ([]byte, error) {
	if err := checkRenderable(t, breaks); err != nil {
		return nil, err
	}
	// systemd may delay a timer by AccuracySec (1 min by default, longer than
	// the production interval); a sixtieth of the interval keeps four strikes about
	// three intervals apart. Delays only ever lengthen the tolerance.
	accuracy := max((t.WatchdogInterval / 60).Truncate(time.Millisecond), time.Millisecond)
	return fmt.Appendf(nil, `# Generated from the timing contract (infra.Timing) by `+"`go generate ./hooks`"+`:
# do not edit. Runs the watchdog every WatchdogInterval; bootstrap installs
# and enables it.
[Unit]
Description=Run the Mythex watchdog every watchdog interval

[Timer]
# OnUnitActiveSec alone never fires a first time; OnActiveSec starts the
# cycle when the timer starts (at boot, or when bootstrap enables it).
OnActiveSec=%[1]s
OnUnitActiveSec=%[1]s
AccuracySec=%[2]s
Unit=mythex-watchdog.service

[Install]
WantedBy=timers.target
`, span(t.WatchdogInterval), span(accuracy)), nil
}

// WatchdogTimeouts are the systemd bounds of one watchdog run: start is
// TimeoutStartSec, stop is TimeoutStopSec. The watchdog bounds its own lock
// hold by WatchdogHold; systemd's start timeout is the backstop past it,
// half of the lock wait's margin later, and the stop timeout (SIGTERM to
// SIGKILL) takes the other half, so a wedged watchdog has let go of the lock
// before a deploy that began waiting when it started gives up.
func WatchdogTimeouts(t infra.Timing) (start, stop time.Duration) {
	half := ((t.LockWait - t.WatchdogHold()) / 2).Truncate(time.Millisecond)
	// A zero margin would render 0, which systemd reads as no timeout.
	half = max(half, time.Millisecond)
	return t.WatchdogHold() + half, half
}

// RenderService renders the watchdog's systemd unit. bootstrap replaces
// @MYTHEX_ROOT@ with the server's directory, inside the quotes systemd reads.
func RenderService(t infra.Timing) ([]byte, error) { return renderService(t, nil) }

func renderService(t infra.Timing, breaks []infra.Rule) ([]byte, error) {
	if err := checkRenderable(t, breaks); err != nil {
		return nil, err
	}
	start, stop := WatchdogTimeouts(t)
	return fmt.Appendf(nil, `# Generated from the timing contract (infra.Timing) by `+"`go generate ./hooks`"+`:
# do not edit. The Mythex watchdog, one run per tick of mythex-watchdog.timer.
# bootstrap installs this unit with @MYTHEX_ROOT@ replaced by the server's
# directory.
[Unit]
Description=Mythex watchdog: restart a service only after consecutive failed checks
After=docker.service
Wants=docker.service

[Service]
Type=oneshot
Environment="MYTHEX_ROOT=@MYTHEX_ROOT@"
ExecStart="@MYTHEX_ROOT@/hooks/watchdog"
# The watchdog bounds its own lock hold by WatchdogHold (%[3]s); this is
# the backstop, and with TimeoutStopSec it ends within LockWait (%[4]s).
TimeoutStartSec=%[1]s
TimeoutStopSec=%[2]s
# It runs as root only to talk to the Docker socket and write its own
# state: no capability, no new privilege, a read-only system but for
# MYTHEX_ROOT.
User=root
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ReadWritePaths="@MYTHEX_ROOT@"
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
SystemCallArchitectures=native
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
UMask=0022
`, span(start), span(stop), span(t.WatchdogHold()), span(t.LockWait)), nil
}

// Generated returns every file go generate writes into hooks/, by name.
func Generated(t infra.Timing) (map[string][]byte, error) { return generated(t, nil) }

func generated(t infra.Timing, breaks []infra.Rule) (map[string][]byte, error) {
	compose, err := renderCompose(t, breaks)
	if err != nil {
		return nil, err
	}
	env, err := renderTimingEnv(t, breaks)
	if err != nil {
		return nil, err
	}
	timer, err := renderTimer(t, breaks)
	if err != nil {
		return nil, err
	}
	service, err := renderService(t, breaks)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		ComposeFile:   compose,
		ChecksumFile:  Checksum(compose),
		TimingEnvFile: env,
		TimerFile:     timer,
		ServiceFile:   service,
	}, nil
}

// WriteRelease writes what a deploy takes from its release directory for
// timing t: compose.yaml, its checksum, and timing.env. The rehearsal and the
// tests write one per scaled timing; production ships hooks/ itself.
func WriteRelease(dir string, t infra.Timing) error { return writeRelease(dir, t, nil) }

func writeRelease(dir string, t infra.Timing, breaks []infra.Rule) error {
	files, err := generated(t, breaks)
	if err != nil {
		return err
	}
	for _, name := range []string{ComposeFile, ChecksumFile, TimingEnvFile} {
		if err := os.WriteFile(filepath.Join(dir, name), files[name], 0o644); err != nil {
			return fmt.Errorf("write release file: %w", err)
		}
	}
	return nil
}
