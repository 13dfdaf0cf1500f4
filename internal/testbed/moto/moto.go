// Package moto runs moto_server (Python moto 5.2.1, an EC2 emulator others
// wrote; preinstalled on dev and CI machines) on a loopback port of its own
// for a test package, and builds Go SDK EC2 clients for it.
//
// A server is recorded by PID in a file named after the test package, so
// a run that crashed leaves nothing behind for long: the next run of the
// same package stops that leftover (if the PID still runs moto_server)
// before it starts its own.
package moto

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
)

// Region every client of the fixture uses.
const Region = "us-east-1"

// Server is a moto_server this process started.
type Server struct {
	// URL is its endpoint, e.g. http://127.0.0.1:40123.
	URL     string
	cmd     *exec.Cmd
	pidFile string
	done    chan struct{}
}

// runDir holds the fixtures' PID files.
func runDir() string { return filepath.Join(os.TempDir(), "vpcni-moto") }

// Start starts moto_server on a free loopback port and waits until it
// answers; name tells one test package's server from another's (its PID
// file). A leftover of an earlier run under the same name is stopped
// first.
func Start(name string) (*Server, error) {
	exe, err := exec.LookPath("moto_server")
	if err != nil {
		return nil, fmt.Errorf("moto_server is not installed (pip install 'moto[server]==5.2.1'): %w", err)
	}
	if err := os.MkdirAll(runDir(), 0o700); err != nil {
		return nil, err
	}
	pidFile := filepath.Join(runDir(), name+".pid")
	stopLeftover(pidFile)
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	logf, err := os.Create(filepath.Join(runDir(), name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a signal to the test's group does not reach it
	// twice, and Stop ends moto's children with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	logf.Close()
	s := &Server{URL: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd, pidFile: pidFile, done: make(chan struct{})}
	_ = os.WriteFile(pidFile, fmt.Appendf(nil, "%d\n", cmd.Process.Pid), 0o600)
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.waitReady(30 * time.Second); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls moto's own API until it answers.
func (s *Server) waitReady(d time.Duration) error {
	c := http.Client{Timeout: time.Second}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		select {
		case <-s.done:
			return fmt.Errorf("moto_server exited at start; see %s", filepath.Join(runDir(), strings.TrimSuffix(filepath.Base(s.pidFile), ".pid")+".log"))
		default:
		}
		resp, err := c.Get(s.URL + "/moto-api/data.json")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("moto_server at %s did not answer within %s", s.URL, d)
}

// Stop ends the server (SIGTERM to its group, SIGKILL after 5 s).
func (s *Server) Stop() error {
	defer os.Remove(s.pidFile)
	pid := s.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-s.done:
		return nil
	case <-time.After(5 * time.Second):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-s.done
	return errors.New("moto_server did not stop within 5s; killed")
}

// stopLeftover kills the moto_server an earlier run recorded in pidFile,
// if that PID still runs moto_server (a recycled PID is left alone).
func stopLeftover(pidFile string) {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	defer os.Remove(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "moto_server") {
		return
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
}

// Reset empties moto's state (every backend).
func (s *Server) Reset() error {
	resp, err := http.Post(s.URL+"/moto-api/reset", "text/plain", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Client is an EC2 client for the server with moto's test keys. It keeps
// the SDK's retries: over loopback the SDK now and then loses a
// connection it closed itself (aws-sdk-go-v2 issue 2737), which a retry
// covers; moto never throttles, so nothing else is retried.
func (s *Server) Client() *ec2.Client {
	return ec2.New(ec2.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("testing", "testing", ""),
	})
}

// Main runs a test package (m.Run) with a moto_server up, its URL in
// *url, and stops it afterwards. Without moto_server the package says
// NOT RUN — and fails when VPCNI_REQUIRE_ROOT is set, as under make test,
// so a suite never passes by not running.
func Main(m *testing.M, name string, url *string) int {
	s, err := Start(name)
	if err != nil {
		fmt.Printf("vpcni-test: %v; NOT RUN\n", err)
		if os.Getenv("VPCNI_REQUIRE_ROOT") != "" {
			return 1
		}
		return 0
	}
	*url = s.URL
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Println("vpcni-test:", err)
	}
	return code
}

// Ctx is a test's context, bounded.
func Ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}
