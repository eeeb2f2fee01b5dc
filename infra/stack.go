package infra

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/config"
	"github.com/pulumi/pulumi/sdk/v3/go/common/workspace"
)

// Project is the Pulumi project name (Pulumi.yaml) and so the namespace of
// every stack input.
const Project = "mythex-infra"

// The stack's inputs, as Pulumi names them. Timing is not among them: there is
// one timing contract, compiled in, for every stack.
const (
	KeyRegion           = "aws:region"
	KeyVPCID            = Project + ":vpcId"
	KeyPublicSubnetIDs  = Project + ":publicSubnetIds"
	KeyIPAddressType    = Project + ":ipAddressType"
	KeyCertificateARN   = Project + ":certificateArn"
	KeyAccessLogsBucket = Project + ":accessLogsBucket"
	KeyAppPort          = Project + ":appPort"
	KeyInstanceIDs      = Project + ":instanceIds"
	// KeySlotPort is the second slot's port, set when the contract's
	// RegisteredSlots is 2 and only then.
	KeySlotPort = Project + ":slotPort"
	// KeyAccessLogsExpireDays is how long the access logs are kept.
	KeyAccessLogsExpireDays = Project + ":accessLogsExpireDays"
)

// The range of accessLogsExpireDays: S3 expires objects after at least a
// day; past ten years the number is a mistake (hours, or a date), not a
// retention.
const (
	MinAccessLogsExpireDays = 1
	MaxAccessLogsExpireDays = 3650
)

// StackConfig is what differs between stacks: where the load balancer lives
// and which servers it fronts.
type StackConfig struct {
	// Region is the AWS region of every resource, the certificate's included.
	Region string
	// VPCID is the VPC of the security groups and the target group.
	VPCID string
	// PublicSubnetIDs are the load balancer's subnets, one per availability
	// zone; the ALB needs at least two zones.
	PublicSubnetIDs []string
	// IPAddressType is "ipv4" or "dualstack" (the subnets need IPv6 CIDRs).
	IPAddressType string
	// CertificateARN is the ACM certificate the HTTPS listener presents.
	CertificateARN string
	// AccessLogsBucket receives the load balancer's access logs.
	AccessLogsBucket string
	// AccessLogsExpireDays is how many days S3 keeps each access-log object
	// before its lifecycle rule deletes it: logs do not grow forever.
	AccessLogsExpireDays int
	// AppPort is where the api service listens on every server.
	AppPort int
	// InstanceIDs are the servers behind the load balancer.
	InstanceIDs []string
	// SlotPort is where a server's second slot publishes the api, in the
	// slots design (Timing.RegisteredSlots 2); 0 with one slot.
	SlotPort int
}

// Ports are the ports the target group holds each server on, one a slot
// the contract registers: AppPort, then SlotPort. CheckSlots has said the
// stack names them.
func (c StackConfig) Ports(t Timing) []int {
	return []int{c.AppPort, c.SlotPort}[:min(max(t.RegisteredSlots, 1), MaxSlots)]
}

// CheckSlots reports what the stack's ports say against the contract's
// design: a second port exactly when the target group registers two slots,
// distinct from the first. Nil when they agree.
func CheckSlots(t Timing, c StackConfig) error {
	var problems []string
	switch {
	case t.RegisteredSlots >= 2 && c.SlotPort == 0:
		problems = append(problems, fmt.Sprintf("%s is not set: the timing contract registers %d slots a server (RegisteredSlots), and the second publishes its own port",
			KeySlotPort, t.RegisteredSlots))
	case t.RegisteredSlots < 2 && c.SlotPort != 0:
		problems = append(problems, fmt.Sprintf("%s %d is set, but the timing contract registers one slot a server (RegisteredSlots %d): nothing would check it; remove it, or change the design in infra/timing.go (docs/capacity.md)",
			KeySlotPort, c.SlotPort, t.RegisteredSlots))
	}
	if c.SlotPort != 0 && c.SlotPort == c.AppPort {
		problems = append(problems, fmt.Sprintf("%s %d must differ from %s %d: each slot publishes its own port",
			KeySlotPort, c.SlotPort, KeyAppPort, c.AppPort))
	}
	if len(problems) > 0 {
		return &StackConfigError{Problems: problems}
	}
	return nil
}

// ConfigSource looks up one stack input by its full key ("project:name"), as
// the Pulumi engine hands it to the program: scalars as text, lists as JSON.
// (*pulumi.Context).GetConfig is one; a map read from a stack file is another.
type ConfigSource func(key string) (string, bool)

// StackConfigError lists every problem with a stack's inputs.
type StackConfigError struct {
	Problems []string
}

func (e *StackConfigError) Error() string {
	lines := make([]string, 0, len(e.Problems)+1)
	lines = append(lines, fmt.Sprintf("invalid stack config: %d problem(s)", len(e.Problems)))
	for _, p := range e.Problems {
		lines = append(lines, "  - "+p)
	}
	return strings.Join(lines, "\n")
}

// ParseStackConfig reads and validates every stack input from get. A missing
// or malformed input is reported together with every other problem.
func ParseStackConfig(get ConfigSource) (StackConfig, error) {
	var c StackConfig
	var problems []string
	unread := map[string]bool{} // keys missing or of the wrong type
	fail := func(key, format string, args ...any) {
		problems = append(problems, key+" "+fmt.Sprintf(format, args...))
		unread[key] = true
	}
	text := func(key string) string {
		v, ok := get(key)
		if !ok || strings.TrimSpace(v) == "" {
			fail(key, "is not set")
			return ""
		}
		return v
	}
	list := func(key string) []string {
		v := text(key)
		if v == "" {
			return nil
		}
		var l []string
		if err := json.Unmarshal([]byte(v), &l); err != nil {
			fail(key, "%q must be a list of strings (pulumi config set --path '%s[0]' VALUE)", v, key)
			return nil
		}
		return l
	}
	c.Region = text(KeyRegion)
	c.VPCID = text(KeyVPCID)
	c.PublicSubnetIDs = list(KeyPublicSubnetIDs)
	c.IPAddressType = text(KeyIPAddressType)
	c.CertificateARN = text(KeyCertificateARN)
	c.AccessLogsBucket = text(KeyAccessLogsBucket)
	if v := text(KeyAppPort); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			fail(KeyAppPort, "%q must be an integer", v)
		}
		c.AppPort = n
	}
	c.InstanceIDs = list(KeyInstanceIDs)
	// Optional: only the slots design has a second port.
	if v, ok := get(KeySlotPort); ok && strings.TrimSpace(v) != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			fail(KeySlotPort, "%q must be an integer", v)
		}
		c.SlotPort = n
	}
	if v := text(KeyAccessLogsExpireDays); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			fail(KeyAccessLogsExpireDays, "%q must be a whole number of days", v)
		}
		c.AccessLogsExpireDays = n
	}

	// Shape rules for what was read; an unread input is reported once.
	for _, p := range c.problems() {
		if !unread[p.key] {
			problems = append(problems, p.msg)
		}
	}
	if len(problems) > 0 {
		return StackConfig{}, &StackConfigError{Problems: problems}
	}
	return c, nil
}

// Validate reports every problem the stack inputs show on their own, all at
// once, naming the input and its value: missing inputs, malformed IDs and
// ARNs, too few subnets, a certificate ARN of another region, a bucket name S3
// refuses. What only AWS knows is LookupStack's: each subnet's VPC and
// availability zone, each instance's VPC and network interface, the region's
// log writer. Neither checks the certificate's status (ISSUED), nor that the
// bucket name is free: `pulumi preview` does not either, `pulumi up` fails on
// them (docs/runbook.md checks them first).
func (c StackConfig) Validate() error {
	ps := c.problems()
	if len(ps) == 0 {
		return nil
	}
	msgs := make([]string, len(ps))
	for i, p := range ps {
		msgs[i] = p.msg
	}
	return &StackConfigError{Problems: msgs}
}

type problem struct {
	key string
	msg string
}

var (
	regionRe   = regexp.MustCompile(`^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]+$`)
	vpcRe      = regexp.MustCompile(`^vpc-([0-9a-f]{8}|[0-9a-f]{17})$`)
	subnetRe   = regexp.MustCompile(`^subnet-([0-9a-f]{8}|[0-9a-f]{17})$`)
	instanceRe = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)
	// arn:partition:acm:region:account:certificate/uuid
	acmARNRe = regexp.MustCompile(`^arn:aws(-cn|-us-gov|-iso|-iso-b)?:acm:([a-z0-9-]+):[0-9]{12}:certificate/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	bucketRe = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
)

// ipAddressTypes are the listener address families an internet-facing ALB
// takes from us; dualstack-without-public-ipv4 needs IPAM pools we do not run.
var ipAddressTypes = []string{"ipv4", "dualstack"}

func (c StackConfig) problems() []problem {
	var ps []problem
	add := func(key, format string, args ...any) {
		ps = append(ps, problem{key, key + " " + fmt.Sprintf(format, args...)})
	}
	if !regionRe.MatchString(c.Region) {
		add(KeyRegion, "%q is not an AWS region (like eu-west-1)", c.Region)
	}
	if !vpcRe.MatchString(c.VPCID) {
		add(KeyVPCID, "%q is not a VPC ID (vpc- and 8 or 17 hex digits)", c.VPCID)
	}
	idList(KeyPublicSubnetIDs, c.PublicSubnetIDs, subnetRe, "a subnet ID (subnet- and 8 or 17 hex digits)", 2,
		"an internet-facing ALB needs subnets in at least two availability zones", add)
	if !slices.Contains(ipAddressTypes, c.IPAddressType) {
		add(KeyIPAddressType, "%q must be one of %s", c.IPAddressType, strings.Join(ipAddressTypes, ", "))
	}
	if m := acmARNRe.FindStringSubmatch(c.CertificateARN); m == nil {
		add(KeyCertificateARN, "%q is not an ACM certificate ARN (arn:aws:acm:REGION:ACCOUNT:certificate/UUID)", c.CertificateARN)
	} else if regionRe.MatchString(c.Region) && m[2] != c.Region {
		add(KeyCertificateARN, "%q is in region %s, but the load balancer is in %s %s: an ALB only takes certificates from its own region",
			c.CertificateARN, m[2], KeyRegion, c.Region)
	}
	if msg := bucketProblem(c.AccessLogsBucket); msg != "" {
		add(KeyAccessLogsBucket, "%q %s", c.AccessLogsBucket, msg)
	}
	if c.AppPort < 1 || c.AppPort > 65535 {
		add(KeyAppPort, "%d must be within 1–65535", c.AppPort)
	}
	if c.SlotPort != 0 && (c.SlotPort < 1 || c.SlotPort > 65535) {
		add(KeySlotPort, "%d must be within 1–65535", c.SlotPort)
	}
	idList(KeyInstanceIDs, c.InstanceIDs, instanceRe, "an EC2 instance ID (i- and 8 or 17 hex digits)", 1,
		"the target group needs at least one server", add)
	if c.AccessLogsExpireDays < MinAccessLogsExpireDays || c.AccessLogsExpireDays > MaxAccessLogsExpireDays {
		add(KeyAccessLogsExpireDays, "%d must be within %d–%d days", c.AccessLogsExpireDays, MinAccessLogsExpireDays, MaxAccessLogsExpireDays)
	}
	return ps
}

// idList checks a list of AWS IDs: enough of them, each well formed, none twice.
func idList(key string, ids []string, re *regexp.Regexp, what string, least int, why string,
	add func(key, format string, args ...any)) {
	if len(ids) < least {
		add(key, "has %d entries, needs at least %d: %s", len(ids), least, why)
	}
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		if !re.MatchString(id) {
			add(key, "[%d] %q is not %s", i, id, what)
		}
		if j, dup := seen[id]; dup {
			add(key, "[%d] %q repeats [%d]", i, id, j)
			continue
		}
		seen[id] = i
	}
}

// bucketProblem applies the S3 general purpose bucket naming rules; "" when
// name follows them.
func bucketProblem(name string) string {
	switch {
	case len(name) < 3 || len(name) > 63:
		return "must be 3–63 characters long"
	case !bucketRe.MatchString(name):
		return "must be lowercase letters, digits, dots and hyphens, beginning and ending with a letter or digit"
	case strings.Contains(name, ".."):
		return "must not contain two adjacent dots"
	case net.ParseIP(name) != nil:
		return "must not be formatted as an IP address"
	}
	for _, p := range []string{"xn--", "sthree-", "amzn-s3-demo-"} {
		if strings.HasPrefix(name, p) {
			return fmt.Sprintf("must not begin with %q (reserved by S3)", p)
		}
	}
	for _, s := range []string{"-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"} {
		if strings.HasSuffix(name, s) {
			return fmt.Sprintf("must not end with %q (reserved by S3)", s)
		}
	}
	return ""
}

// StackFile is a stack's configuration as read from its Pulumi.<stack>.yaml
// with Pulumi's own loaders, in the form the engine hands to the program.
type StackFile struct {
	// Stack is the stack's name, from the file name.
	Stack string
	// Config maps each full key to its value: scalars as text, lists and
	// objects as JSON.
	Config map[string]string
}

// Get is the file's ConfigSource.
func (f StackFile) Get(key string) (string, bool) {
	v, ok := f.Config[key]
	return v, ok
}

// LoadStackFile reads the stack file at path and the Pulumi.yaml beside it
// the way the Pulumi CLI does, so the dry plan sees exactly what `pulumi up`
// would give the program. Secrets are refused: the plan has no key for them.
func LoadStackFile(path string) (StackFile, error) {
	base := filepath.Base(path)
	stack, ok := strings.CutPrefix(base, "Pulumi.")
	if ok {
		stack, ok = strings.CutSuffix(stack, ".yaml")
	}
	if !ok || stack == "" {
		return StackFile{}, fmt.Errorf("stack file %s: name must be Pulumi.<stack>.yaml", path)
	}
	// Pulumi's loader takes a missing stack file for an empty one.
	if _, err := os.Stat(path); err != nil {
		return StackFile{}, fmt.Errorf("read stack file: %w", err)
	}
	projectPath := filepath.Join(filepath.Dir(path), "Pulumi.yaml")
	proj, err := workspace.LoadProject(projectPath)
	if err != nil {
		return StackFile{}, fmt.Errorf("load project for stack file %s: %w", path, err)
	}
	if string(proj.Name) != Project {
		return StackFile{}, fmt.Errorf("project %s is named %q, want %q", projectPath, proj.Name, Project)
	}
	ps, err := workspace.LoadProjectStack(nil, proj, path)
	if err != nil {
		return StackFile{}, fmt.Errorf("load stack file %s: %w", path, err)
	}
	var errs []error
	for k, v := range ps.Config {
		if v.Secure() {
			errs = append(errs, fmt.Errorf("%s is a secret; the dry plan cannot decrypt it", k))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return StackFile{}, fmt.Errorf("stack file %s: %w", path, err)
	}
	plain, err := ps.Config.Decrypt(config.NopDecrypter)
	if err != nil {
		return StackFile{}, fmt.Errorf("read config of stack file %s: %w", path, err)
	}
	f := StackFile{Stack: stack, Config: make(map[string]string, len(plain))}
	for k, v := range plain {
		f.Config[k.String()] = v
	}
	return f, nil
}
