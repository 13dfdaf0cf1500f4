package scale

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

// proc is a process the bench runs for its length (kwok, vpcni-controller):
// its output goes to <dir>/<name>.log, its PID and binary to
// <dir>/<name>.pid, so that a run that crashed leaves nothing the next one
// cannot stop (apiserver.StopRecorded, by that PID, only while /proc says it still
// runs that binary).
type proc struct {
	name, dir string
	cmd       *exec.Cmd
	done      chan struct{}
}

func startProc(dir, name, bin string, args ...string) (*proc, error) {
	if err := apiserver.StopRecorded(dir, name); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	p := &proc{name: name, dir: dir, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	// A process group of its own: a Ctrl-C of the test does not reach it
	// half-way; stop or the next run's apiserver.StopRecorded ends it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	exe, _ := filepath.EvalSymlinks(bin)
	if exe == "" {
		exe = bin
	}
	if err := os.WriteFile(apiserver.PIDFile(dir, name), fmt.Appendf(nil, "%d %s\n", p.cmd.Process.Pid, exe), 0o600); err != nil {
		_ = p.cmd.Process.Kill()
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// log is the end of the process's output, for a failure's message.
func (p *proc) log(lines int) string {
	data, _ := os.ReadFile(filepath.Join(p.dir, p.name+".log"))
	all := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// stop sends SIGTERM, then SIGKILL after 15 s, and removes the PID file.
func (p *proc) stop() {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	_ = os.Remove(apiserver.PIDFile(p.dir, p.name))
}

// rssKiB reads a process's resident set (VmRSS) and its peak (VmHWM).
func rssKiB(pid int) (rss, peak int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			peak = n
		}
	}
	return rss, peak, nil
}

// cpuSeconds is the process's user+system CPU time so far.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100, nil // USER_HZ is 100 on Linux
}
