package testbed

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// TB is the part of testing.TB a Logged process needs (the package is
// linked into vpcnictl too, which must not carry the testing package).
type TB interface {
	Helper()
	Fatal(args ...any)
	Failed() bool
	Logf(format string, args ...any)
	Cleanup(func())
}

// Logged is a process a test runs for its lifetime (vpcni-controller, in
// the API server tests), its stdout and stderr kept in one buffer the test
// reads while it is written.
type Logged struct {
	cmd  *exec.Cmd
	done chan struct{}

	mu  sync.Mutex
	out bytes.Buffer
}

// StartLogged starts bin with args. At the test's end it is stopped (see
// Stop), and its output shown if the test failed.
func StartLogged(t TB, bin string, args ...string) *Logged {
	t.Helper()
	l := &Logged{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	l.cmd.Stdout, l.cmd.Stderr = l, l
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.cmd.Wait(); close(l.done) }()
	t.Cleanup(func() {
		l.Stop()
		if t.Failed() {
			t.Logf("%s's output:\n%s", filepath.Base(bin), l.Output())
		}
	})
	return l
}

// Write implements io.Writer for the process's output.
func (l *Logged) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.Write(p)
}

// Output is what the process wrote so far.
func (l *Logged) Output() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.String()
}

// Stop sends SIGTERM and waits for the process (SIGKILL after 15 s);
// again, or once it exited, it does nothing.
func (l *Logged) Stop() {
	select {
	case <-l.done:
		return
	default:
	}
	_ = l.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-l.done:
	case <-time.After(15 * time.Second):
		_ = l.cmd.Process.Kill()
		<-l.done
	}
}
