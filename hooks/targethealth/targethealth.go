// Package targethealth stands in for the one AWS call the rollout makes,
// elbv2 describe-target-health, where there is no AWS: in the hooks' tests
// and in the rehearsal. It answers from a function of the target, so a test
// can script a timeline and the rehearsal can answer from its balancers.
//
// It speaks two ways, and a test shows that both give the same answer:
//
//   - the AWS CLI's: WriteCLI writes an `aws` command that sends its
//     arguments here and prints the answer as `aws elbv2
//     describe-target-health --output json` prints it (cheap enough to poll
//     on a scaled timing, which the real CLI's Python start-up is not);
//   - the API's: the query protocol the real CLI speaks (Action=
//     DescribeTargetHealth, XML answers), for the real CLI with
//     --endpoint-url.
package targethealth

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The states AWS documents for TargetHealth.State.
const (
	Initial           = "initial"
	Healthy           = "healthy"
	Unhealthy         = "unhealthy"
	UnhealthyDraining = "unhealthy.draining"
	Unused            = "unused"
	Draining          = "draining"
	Unavailable       = "unavailable"
)

// Health is one target's TargetHealth. Reason and Description are empty
// when AWS leaves them out (a healthy target).
type Health struct {
	State       string `json:"State"`
	Reason      string `json:"Reason,omitempty"`
	Description string `json:"Description,omitempty"`
}

// Call is one describe-target-health request, as the stand-in received it.
type Call struct {
	At             time.Time
	TargetGroupARN string
	ID             string
	Port           int
}

// Server answers describe-target-health on loopback.
type Server struct {
	// URL is where it listens; the real CLI takes it as --endpoint-url.
	URL string

	health func(Call) (Health, error)
	srv    *http.Server

	mu    sync.Mutex
	calls []Call
}

// Start serves describe-target-health answered by health, which may fail a
// call (as a throttled API does): the CLI then exits non-zero.
func Start(health func(Call) (Health, error)) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("describe-target-health stand-in: %w", err)
	}
	s := &Server{URL: "http://" + l.Addr().String(), health: health}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /cli", s.handleCLI)
	mux.HandleFunc("POST /", s.handleQuery)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

// Close stops serving.
func (s *Server) Close() error {
	if err := s.srv.Close(); err != nil {
		return fmt.Errorf("describe-target-health stand-in: %w", err)
	}
	return nil
}

// Calls returns every call so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

func (s *Server) answer(c Call) (Health, error) {
	c.At = time.Now()
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return s.health(c)
}

// description is one entry of TargetHealthDescriptions, as the CLI prints it.
type description struct {
	Target struct {
		ID   string `json:"Id"`
		Port int    `json:"Port"`
	} `json:"Target"`
	HealthCheckPort string `json:"HealthCheckPort"`
	TargetHealth    Health `json:"TargetHealth"`
}

// CLIOutput is what `aws elbv2 describe-target-health --output json` prints
// for one target.
func CLIOutput(id string, port int, h Health) ([]byte, error) {
	d := description{HealthCheckPort: strconv.Itoa(port), TargetHealth: h}
	d.Target.ID, d.Target.Port = id, port
	out, err := json.MarshalIndent(map[string][]description{"TargetHealthDescriptions": {d}}, "", "    ")
	if err != nil {
		return nil, fmt.Errorf("describe-target-health answer: %w", err)
	}
	return append(out, '\n'), nil
}

// parseCLI reads the arguments of a describe-target-health call; anything else
// is refused, as a stand-in must not accept what the real CLI would not.
func parseCLI(args []string) (Call, error) {
	var c Call
	if len(args) < 2 || args[0] != "elbv2" || args[1] != "describe-target-health" {
		return c, fmt.Errorf("only `aws elbv2 describe-target-health` is stood in for, not %q", args)
	}
	output := ""
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			return c, fmt.Errorf("%s needs a value", args[i])
		}
		v := args[i+1]
		switch args[i] {
		case "--target-group-arn":
			c.TargetGroupARN = v
		case "--targets":
			for _, kv := range strings.Split(v, ",") {
				k, val, _ := strings.Cut(kv, "=")
				switch k {
				case "Id":
					c.ID = val
				case "Port":
					p, err := strconv.Atoi(val)
					if err != nil {
						return c, fmt.Errorf("--targets %q: Port %q is not a number", v, val)
					}
					c.Port = p
				default:
					return c, fmt.Errorf("--targets %q: unknown key %q", v, k)
				}
			}
		case "--output":
			output = v
		default:
			return c, fmt.Errorf("unknown option %s", args[i])
		}
	}
	var errs []error
	if c.TargetGroupARN == "" {
		errs = append(errs, errors.New("--target-group-arn is required"))
	}
	if c.ID == "" || c.Port == 0 {
		errs = append(errs, errors.New("--targets Id=…,Port=… is required"))
	}
	if output != "json" {
		errs = append(errs, fmt.Errorf("--output %q: only json is stood in for", output))
	}
	return c, errors.Join(errs...)
}

func (s *Server) handleCLI(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c, err := parseCLI(r.PostForm["arg"])
	if err != nil {
		http.Error(w, "aws: "+err.Error(), http.StatusBadRequest)
		return
	}
	h, err := s.answer(c)
	if err != nil {
		http.Error(w, "An error occurred (Throttling) when calling the DescribeTargetHealth operation: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	out, err := CLIOutput(c.ID, c.Port, h)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(out)
}

// The query API's answer, as the API reference shows it.
type queryResponse struct {
	XMLName      xml.Name      `xml:"DescribeTargetHealthResponse"`
	Xmlns        string        `xml:"xmlns,attr"`
	Descriptions []queryMember `xml:"DescribeTargetHealthResult>TargetHealthDescriptions>member"`
	RequestID    string        `xml:"ResponseMetadata>RequestId"`
}

type queryMember struct {
	HealthCheckPort string `xml:"HealthCheckPort"`
	TargetHealth    struct {
		State       string `xml:"State"`
		Reason      string `xml:"Reason,omitempty"`
		Description string `xml:"Description,omitempty"`
	} `xml:"TargetHealth"`
	Target struct {
		Port int    `xml:"Port"`
		ID   string `xml:"Id"`
	} `xml:"Target"`
}

func (s *Server) handleQuery(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f := r.PostForm
	if f.Get("Action") != "DescribeTargetHealth" || f.Get("Version") != "2015-12-01" {
		http.Error(w, fmt.Sprintf("only DescribeTargetHealth 2015-12-01 is stood in for, not %s %s", f.Get("Action"), f.Get("Version")), http.StatusBadRequest)
		return
	}
	port, err := strconv.Atoi(f.Get("Targets.member.1.Port"))
	if err != nil || f.Get("Targets.member.2.Id") != "" {
		http.Error(w, "one target with a numeric port is stood in for", http.StatusBadRequest)
		return
	}
	c := Call{TargetGroupARN: f.Get("TargetGroupArn"), ID: f.Get("Targets.member.1.Id"), Port: port}
	h, err := s.answer(c)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	m := queryMember{HealthCheckPort: strconv.Itoa(port)}
	m.TargetHealth.State, m.TargetHealth.Reason, m.TargetHealth.Description = h.State, h.Reason, h.Description
	m.Target.Port, m.Target.ID = port, c.ID
	out, err := xml.Marshal(queryResponse{
		Xmlns:        "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/",
		Descriptions: []queryMember{m},
		RequestID:    "00000000-0000-4000-8000-000000000000",
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	_, _ = w.Write(append([]byte(xml.Header), out...))
}

// WriteCLI writes an `aws` command into dir that answers describe-target-
// health from s, printing what the real CLI prints; put dir first on PATH.
// It fails (exit 22, the message on stderr) where the real CLI would fail.
func (s *Server) WriteCLI(dir string) (string, error) {
	path := filepath.Join(dir, "aws")
	script := `#!/usr/bin/env bash
# Stands in for the AWS CLI's ` + "`elbv2 describe-target-health`" + `: the
# arguments go to a loopback stand-in, which answers as the CLI prints.
set -euo pipefail

main() {
  local args=() a out status=0
  for a in "$@"; do
    args+=(--data-urlencode "arg=$a")
  done
  out="$(curl --silent --show-error --fail-with-body "${args[@]}" "` + s.URL + `/cli" 2>&1)" || status=$?
  if ((status != 0)); then
    printf '%s\n' "$out" >&2
    exit "$status"
  fi
  printf '%s\n' "$out"
}

main "$@"
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		return "", fmt.Errorf("write the aws stand-in: %w", err)
	}
	return path, nil
}
