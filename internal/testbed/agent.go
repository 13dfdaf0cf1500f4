package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/api"
	_ "github.com/vpcni/vpcni/internal/builtin" // the modes and providers cfg names
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/ebpf"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// Process is a program the testbed started inside a namespace, with its
// PID recorded so a crashed run's leftovers can be stopped.
type Process struct {
	Name    string
	cmd     *exec.Cmd
	pidFile string
	done    chan struct{}
	waitErr error
	once    sync.Once
}

// Start runs argv inside namespace ns; its output goes to logPath.
func Start(runDir, name, ns, logPath string, argv ...string) (*Process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	log.Close()
	p := &Process{Name: name, cmd: cmd, pidFile: filepath.Join(runDir, name+".pid"), done: make(chan struct{})}
	// ip netns exec execs the program in place: the PID is the program's.
	_ = os.WriteFile(p.pidFile, fmt.Appendf(nil, "%d %s\n", cmd.Process.Pid, filepath.Base(argv[0])), 0o600)
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pid of the process.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited says whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process gracefully (SIGTERM, then SIGKILL after 10 s).
func (p *Process) Stop() error { return p.signal(syscall.SIGTERM, 10*time.Second) }

// Kill ends the process at once, as a crash would.
func (p *Process) Kill() error { return p.signal(syscall.SIGKILL, 5*time.Second) }

func (p *Process) signal(sig syscall.Signal, grace time.Duration) error {
	var err error
	p.once.Do(func() {
		defer os.Remove(p.pidFile)
		if p.Exited() {
			return
		}
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.done
			err = fmt.Errorf("%s did not stop within %s; killed", p.Name, grace)
		}
	})
	return err
}

// Agent is a vpcnid running in the testbed's node namespace.
type Agent struct {
	*Process
	Config     config.Config
	ConfigPath string
	LogPath    string
	Client     *api.Client
}

// AgentConfig returns a config for the node: the static pool over the
// given range of the segment, state and socket under dir.
func (t *Topology) AgentConfig(dir string, cidr string, exclude ...string) config.Config {
	cfg := config.Defaults()
	cfg.NodeName = t.NodeNS()
	cfg.SocketPath = filepath.Join(dir, "vpcnid.sock")
	cfg.StateDir = filepath.Join(dir, "state")
	// Uplink left empty: the agent takes the default route's interface, eth0.
	cfg.Provider = config.Provider{Type: "static", Settings: &static.Config{Ranges: []static.Range{{CIDR: cidr, Gateway: t.Gateway.String(), Exclude: exclude}}}}
	return cfg
}

// StartAgent writes cfg next to its socket and starts vpcnid from binDir in
// the node namespace, waiting until it answers.
func (t *Topology) StartAgent(binDir string, cfg config.Config) (*Agent, error) {
	a, err := StartAgentIn(t.RunDir, t.NodeNS(), binDir, cfg)
	if err != nil {
		return nil, err
	}
	t.Track(a.Process)
	return a, nil
}

// LaunchAgent is StartAgent without the wait: it returns as soon as vpcnid
// runs, so the caller can time its start-up.
func (t *Topology) LaunchAgent(binDir string, cfg config.Config) (*Agent, error) {
	a, err := LaunchAgentIn(t.RunDir, t.NodeNS(), binDir, cfg)
	if err != nil {
		return nil, err
	}
	t.Track(a.Process)
	return a, nil
}

// StartAgentIn starts vpcnid from binDir in namespace ns (its PID recorded
// in runDir), with cfg written next to its socket, and waits until it
// answers. The caller stops it.
func StartAgentIn(runDir, ns, binDir string, cfg config.Config) (*Agent, error) {
	a, err := LaunchAgentIn(runDir, ns, binDir, cfg)
	if err != nil {
		return nil, err
	}
	if err := a.WaitReady(20 * time.Second); err != nil {
		_ = a.Kill()
		return nil, err
	}
	if err := checkRoutedMode(a, cfg); err != nil {
		_ = a.Kill()
		return nil, err
	}
	return a, nil
}

// checkRoutedMode makes sure an agent RoutedModeEnv switched to mode ebpf
// runs its fast path: a run of the lab e2e in that mode that silently fell
// back would prove nothing.
func checkRoutedMode(a *Agent, cfg config.Config) error {
	// cfg as the test wrote it: only an agent switched from veth is
	// checked (a test of mode ebpf's own fallback starts one on purpose).
	if os.Getenv(RoutedModeEnv) != ebpf.Mode || cfg.Datapath.Mode != "veth" {
		return nil
	}
	log, err := os.ReadFile(a.LogPath)
	if err != nil {
		return err
	}
	// The log is appended to across restarts: the latest word counts.
	if loaded := strings.LastIndex(string(log), "ebpf fast path loaded"); loaded < 0 || loaded < strings.LastIndex(string(log), "ebpf fast path unavailable") {
		return fmt.Errorf("%s=%s: vpcnid in %s did not load its fast path:\n%s", RoutedModeEnv, ebpf.Mode, cfg.NodeName, log)
	}
	fmt.Printf("vpcni-test: %s=%s: vpcnid on %s runs mode ebpf, fast path loaded\n", RoutedModeEnv, ebpf.Mode, cfg.NodeName)
	return nil
}

// LaunchAgentIn is StartAgentIn without the wait. Its log is appended to,
// so an earlier run's lines stay before the new ones.
func LaunchAgentIn(runDir, ns, binDir string, cfg config.Config) (*Agent, error) {
	routedMode(&cfg)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir := filepath.Dir(cfg.SocketPath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	a := &Agent{Config: cfg, ConfigPath: filepath.Join(dir, "vpcnid.yaml"), LogPath: filepath.Join(dir, "vpcnid.log"), Client: api.NewClient(cfg.SocketPath)}
	if err := os.WriteFile(a.ConfigPath, data, 0o600); err != nil {
		return nil, err
	}
	if a.Process, err = Start(runDir, "vpcnid-"+ns, ns, a.LogPath, filepath.Join(binDir, "vpcnid"), "-config", a.ConfigPath); err != nil {
		return nil, err
	}
	return a, nil
}

// RestartServeWait bounds how long Restart waits for the agent to serve.
const RestartServeWait = time.Minute

// Restart starts the same agent again after it stopped or was killed, and
// returns once it serves pods (WaitServing), not merely answers on its
// socket: an agent that answers its state but refuses every ADD has not
// come back. On that failure the agent is returned too, still running
// (Down stops it), for its log.
func (t *Topology) Restart(binDir string, a *Agent) (*Agent, error) {
	n, err := t.StartAgent(binDir, a.Config)
	if err != nil {
		return nil, err
	}
	if err := n.WaitServing(RestartServeWait); err != nil {
		return n, err
	}
	return n, nil
}

// statusRequest is the CNI STATUS a runtime sends (the plugin forwards
// the network configuration; the agent reads none of it).
var statusRequest = &api.CNIRequest{Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"testbed","type":"vpcni"}`)}

// WaitServing waits until the agent's STATUS verb says it can serve an
// ADD now, as a runtime asks before it sends pods; past d it returns the
// last answer.
func (a *Agent) WaitServing(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if a.Exited() {
			log, _ := os.ReadFile(a.LogPath)
			return fmt.Errorf("vpcnid exited before it served: %s", log)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := a.Client.Do(ctx, api.PathStatus, statusRequest, nil)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vpcnid did not become ready to serve pods within %s: STATUS: %w", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitReady waits until the agent answers on its socket (its state; it
// may not serve pods yet: see WaitServing).
func (a *Agent) WaitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if a.Exited() {
			log, _ := os.ReadFile(a.LogPath)
			return fmt.Errorf("vpcnid exited during start-up: %s", log)
		}
		c, err := net.DialTimeout("unix", a.Config.SocketPath, time.Second)
		if err == nil {
			c.Close()
			var st api.State
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err = a.Client.Do(ctx, api.PathState, nil, &st)
			cancel()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("vpcnid did not become reachable"), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// State asks the agent for its state.
func (a *Agent) State() (*api.State, error) {
	var st api.State
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return &st, a.Client.Do(ctx, api.PathState, nil, &st)
}

// RoutedModeEnv, set to "ebpf", runs every agent a test configures in
// mode veth in mode ebpf instead (its GARP setting kept): make
// e2e-lab-ebpf runs the whole lab e2e so.
const RoutedModeEnv = "VPCNI_ROUTED_MODE"

func routedMode(cfg *config.Config) {
	if os.Getenv(RoutedModeEnv) != ebpf.Mode || cfg.Datapath.Mode != "veth" {
		return
	}
	s := &ebpf.Settings{}
	if vs, ok := cfg.Datapath.Settings.(*veth.Settings); ok {
		s.GARP = vs.GARP
	}
	cfg.Datapath = config.Datapath{Mode: ebpf.Mode, Settings: s}
}
