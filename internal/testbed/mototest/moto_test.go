package mototest

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestShareAndStop: two tests at once share one server; it stops, and its
// PID file goes, when the last is done.
func TestShareAndStop(t *testing.T) {
	var url1, url2, pidFile string
	var pid int
	t.Run("group", func(t *testing.T) {
		t.Run("a", func(t *testing.T) {
			t.Parallel()
			url1 = Start(t)
			time.Sleep(200 * time.Millisecond) // overlap with b
		})
		t.Run("b", func(t *testing.T) {
			t.Parallel()
			url2 = Start(t)
			mu.Lock()
			pidFile, pid = running.pidFile, running.cmd.Process.Pid
			mu.Unlock()
			resp, err := http.Post(url2+"/", "application/x-www-form-urlencoded", strings.NewReader("Action=DescribeVpcs&Version=2016-11-15"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			time.Sleep(200 * time.Millisecond)
		})
	})
	if url1 == "" || url1 != url2 {
		t.Fatalf("two tests at once got %q and %q", url1, url2)
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Fatalf("PID file %s after the last user: %v", pidFile, err)
	}
	if alive(pid) {
		t.Fatalf("moto_server %d still runs after the last user", pid)
	}
	if _, err := http.Get(url1 + "/moto-api/"); err == nil {
		t.Fatalf("%s still answers", url1)
	}
}

// TestReapsCrashedLeftover: a moto_server recorded by a test binary that
// is gone is stopped by its PID at the next launch.
func TestReapsCrashedLeftover(t *testing.T) {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	left := exec.Command("moto_server", "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	if err := left.Start(); err != nil {
		t.Fatalf("moto_server: %v", err)
	}
	done := make(chan struct{})
	go func() { left.Wait(); close(done) }()
	t.Cleanup(func() { left.Process.Kill(); <-done })
	// An owner that is gone: a process that has exited.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	f := fileFor(gone.Process.Pid, "pid")
	if err := os.WriteFile(f, fmt.Appendf(nil, "%d %d %d\n", left.Process.Pid, gone.Process.Pid, port), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // python has exec'd moto_server by now
	url := Start(t)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("the leftover moto_server %d still runs", left.Process.Pid)
	}
	if _, err := os.Stat(f); !os.IsNotExist(err) {
		t.Fatalf("the leftover's PID file stays: %v", err)
	}
	if url == "" {
		t.Fatal("no URL")
	}
}
