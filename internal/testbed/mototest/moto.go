// Package mototest runs moto_server (Python moto's EC2 and friends) on
// loopback for tests: an EC2 implementation nobody here wrote, to hold
// vpcni's EC2 code and the lab's own endpoint to.
//
// A test binary runs at most one moto_server, on a port of its own. Start
// starts it, or joins the one already running; the last test to finish
// with it stops it. Main holds one for a whole package instead. Its PID is recorded under /tmp/vpcni-moto, so a run
// that crashed leaves nothing a later run does not stop.
package mototest

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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
)

// Dir holds the PID files, fixture-<test binary pid>.pid holding
// "<moto_server pid> <test binary pid> <port>", and the servers' logs.
var Dir = filepath.Join(os.TempDir(), "vpcni-moto")

func fileFor(owner int, ext string) string {
	return filepath.Join(Dir, fmt.Sprintf("fixture-%d.%s", owner, ext))
}

var (
	mu      sync.Mutex
	running *server
)

type server struct {
	cmd     *exec.Cmd
	url     string
	pidFile string
	users   int
	exited  chan struct{}
}

// Start returns the base URL of a moto_server on loopback ("http://127.0.0.1:PORT").
// The first user gets it freshly reset (POST /moto-api/reset); tests using
// it at the same time share its state, so each should work in a VPC of its
// own. It is stopped when the last test using it ends. A missing
// moto_server fails the test: it is installed wherever the tests run.
func Start(t testing.TB) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if running == nil {
		s, err := launch()
		if err != nil {
			t.Fatalf("moto_server: %v", err)
		}
		running = s
	}
	s := running
	if s.users == 0 {
		if err := reset(s.url); err != nil {
			t.Fatalf("moto_server: %v", err)
		}
	}
	s.users++
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if s.users--; s.users == 0 {
			s.stop()
			running = nil
		}
	})
	return s.url
}

// Reset empties moto's state.
func Reset(t testing.TB, url string) {
	t.Helper()
	if err := reset(url); err != nil {
		t.Fatal(err)
	}
}

func reset(url string) error {
	resp, err := http.Post(url+"/moto-api/reset", "text/plain", nil)
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reset: HTTP %d", resp.StatusCode)
	}
	return nil
}

func launch() (*server, error) {
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		return nil, fmt.Errorf("not installed (pip install 'moto[server]'); the EC2 tests need it: %w", err)
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return nil, err
	}
	reapLeftovers()
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logPath := fileFor(os.Getpid(), "log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, url: "http://127.0.0.1:" + strconv.Itoa(port),
		pidFile: fileFor(os.Getpid(), "pid"), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	// The pyenv shim execs python in place: the PID is the server's.
	if err := os.WriteFile(s.pidFile, fmt.Appendf(nil, "%d %d %d\n", cmd.Process.Pid, os.Getpid(), port), 0o644); err != nil {
		s.stop()
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second) // ~1 s here
	for {
		if reset(s.url) == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(logPath)
			s.stop()
			return nil, fmt.Errorf("exited at start: %s", tail(out))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("not answering after 30 s (log: " + logPath + ")")
		}
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	os.Remove(s.pidFile)
	os.Remove(fileFor(os.Getpid(), "log"))
}

// reapLeftovers stops the moto_servers of test binaries that are gone
// (a crashed or killed run), each by its recorded PID, and only if that
// PID is still a moto_server.
func reapLeftovers() {
	files, _ := filepath.Glob(filepath.Join(Dir, "fixture-*.pid"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var pid, owner, port int
		if _, err := fmt.Sscan(string(data), &pid, &owner, &port); err != nil || f != fileFor(owner, "pid") {
			continue // not one of ours
		}
		if owner != os.Getpid() && alive(owner) {
			continue // another test binary's, in use
		}
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), "moto_server") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		os.Remove(f)
		os.Remove(fileFor(owner, "log"))
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func freePort() (int, error) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Region every client of the fixture uses.
const Region = "us-east-1"

// Main runs a test package (m.Run) with a moto_server up for the whole
// package, its URL in *url, and stops it afterwards: for packages whose
// every test uses moto. A missing moto_server fails the package (the name
// is only for its message).
func Main(m *testing.M, name string, url *string) int {
	mu.Lock()
	s, err := launch()
	if err == nil {
		s.users++ // held until m.Run returns
		running = s
	}
	mu.Unlock()
	if err != nil {
		fmt.Printf("vpcni-test: %s: moto_server: %v\n", name, err)
		return 1
	}
	*url = s.url
	code := m.Run()
	mu.Lock()
	s.stop()
	running = nil
	mu.Unlock()
	return code
}

// Server is a moto_server's endpoint, for building clients.
type Server struct {
	// URL is its endpoint, e.g. http://127.0.0.1:40123.
	URL string
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

// Ctx is a test's context, bounded.
func Ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}
