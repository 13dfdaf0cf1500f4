package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// labState is what `lab serve` writes once the lab is up.
type labState struct {
	Prefix   string `json:"prefix"`
	URL      string `json:"endpoint"`
	SubnetID string `json:"subnetID"`
	// SubnetID6 is the IPv6 subnet's, on a lab with one.
	SubnetID6 string       `json:"subnetID6,omitempty"`
	Router    lab.Host     `json:"router"`
	Legacy    lab.Host     `json:"legacy"`
	Nodes     []labNodeRef `json:"nodes"`
}

type labNodeRef struct {
	lab.Host
	Socket string `json:"socket"`
}

func labDir(prefix string) string { return filepath.Join("/run/vpcni-lab", prefix) }

func labCmd(args []string, out io.Writer) error {
	if len(args) == 0 {
		return usageError{"lab: name one of up|down|status|exec"}
	}
	fs := flag.NewFlagSet("lab "+args[0], flag.ContinueOnError)
	prefix := fs.String("prefix", "vpcni-lab", "namespace prefix")
	nodes := fs.Int("nodes", 3, "cluster nodes")
	subnet := fs.String("subnet", "10.90.0.0/24", "the tenant subnet")
	agents := fs.Bool("agents", true, "run vpcnid on every node (false: none, e.g. for a real Kubernetes node whose DaemonSet runs it)")
	var nc labNodeConfig
	fs.StringVar(&nc.Datapath, "datapath", "veth", "the agents' datapath mode, or one per node: veth,veth,ebpf (the last one for the nodes after)")
	fs.StringVar(&nc.Provider, "provider", "openstack", "the cloud the lab serves and the agents' provider: openstack (Neutron) or aws (EC2 and instance metadata)")
	fs.StringVar(&nc.ProviderMode, "provider-mode", "fixed-ips", "the agents' openstack provider mode (macvlan and bridge need address-pairs)")
	fs.BoolVar(&nc.PrefixMode, "prefix-mode", false, "with --provider aws: the agents take /28 prefixes instead of single addresses")
	fs.StringVar(&nc.Subnet6, "subnet6", "", "an IPv6 /64 on the tenant network as well (openstack): every VM gets an address of it, and the agents' pods one too (\"\": IPv4 only)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "up":
		return labUp(*prefix, *nodes, *subnet, *agents, nc, out)
	case "serve":
		return labServe(*prefix, *nodes, *subnet, *agents, nc)
	case "down":
		return labDown(*prefix, out)
	case "status":
		return labStatus(*prefix, out)
	case "exec":
		if fs.NArg() < 2 {
			return usageError{"lab exec: name a host (router, legacy, n1, ...) and a command"}
		}
		cmd := exec.Command("ip", append([]string{"netns", "exec", *prefix + "-" + fs.Arg(0)}, fs.Args()[1:]...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, out, os.Stderr
		return cmd.Run()
	}
	return usageError{fmt.Sprintf("lab: unknown command %q", args[0])}
}

// labNodeConfig is how the lab's agents run.
type labNodeConfig struct {
	Datapath     string
	Provider     string
	ProviderMode string
	PrefixMode   bool
	Subnet6      string
}

func (c labNodeConfig) args() []string {
	return []string{"--datapath", cmp.Or(c.Datapath, "veth"), "--provider", cmp.Or(c.Provider, "openstack"),
		"--provider-mode", cmp.Or(c.ProviderMode, "fixed-ips"), "--prefix-mode=" + strconv.FormatBool(c.PrefixMode), "--subnet6", c.Subnet6}
}

// provider is the agents' provider section on lab l: the lab's endpoint on
// each node's loopback.
func (c labNodeConfig) provider(l *lab.Lab) config.Provider {
	if l.EC2 != nil {
		// Credentials come from the node's instance role, served by its
		// metadata, as on EC2.
		return config.Provider{Type: "aws", Settings: &aws.Config{
			Endpoint:     fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort),
			IMDSEndpoint: fmt.Sprintf("http://127.0.0.1:%d", lab.IMDSPort),
			PrefixMode:   c.PrefixMode}}
	}
	// The lab serves Nova's os-interface beside Neutron: the NIC modes
	// (passthrough, secondary NICs) attach ports through it.
	return config.Provider{Type: "openstack", Settings: &openstack.Config{
		Endpoint:        fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort),
		ComputeEndpoint: fmt.Sprintf("http://127.0.0.1:%d%s", lab.EndpointPort, lab.ComputePath),
		SubnetID:        l.SubnetID, Mode: c.ProviderMode}}
}

// labUp starts `lab serve` in the background and waits until the lab is up.
func labUp(prefix string, nodes int, subnet string, agents bool, nc labNodeConfig, out io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("the lab builds network namespaces: run it as root")
	}
	if _, err := binDir(); err != nil {
		return err
	}
	dir := labDir(prefix)
	_ = labDown(prefix, io.Discard) // leftovers of a crashed lab
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, append([]string{"lab", "serve", "--prefix", prefix, "--nodes", strconv.Itoa(nodes), "--subnet", subnet, "--agents=" + strconv.FormatBool(agents)}, nc.args()...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(dir, "serve.pid"), fmt.Appendf(nil, "%d vpcnictl\n", cmd.Process.Pid), 0o600)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
	for {
		if st, err := readLabState(prefix); err == nil {
			fmt.Fprintf(out, "lab %s is up: endpoint %s, subnet %s\n", prefix, st.URL, subnet)
			fmt.Fprintf(out, "  router  %-16s %s\n  legacy  %-16s %s\n", st.Router.NS, st.Router.IP, st.Legacy.NS, st.Legacy.IP)
			for _, n := range st.Nodes {
				agent := "vpcnid " + n.Socket
				if n.Socket == "" {
					agent = "no vpcnid"
				}
				fmt.Fprintf(out, "  node    %-16s %s  %s\n", n.NS, n.IP, agent)
			}
			fmt.Fprintf(out, "look around: vpcnictl lab status --prefix %[1]s; vpcnictl lab exec --prefix %[1]s n1 ip route; tear down: vpcnictl lab down --prefix %[1]s\n", prefix)
			return nil
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
			return fmt.Errorf("lab serve exited (%v):\n%s", err, log)
		case <-deadline:
			return errors.New("the lab did not come up within 2 minutes; see " + filepath.Join(dir, "serve.log"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func readLabState(prefix string) (*labState, error) {
	data, err := os.ReadFile(filepath.Join(labDir(prefix), "state.json"))
	if err != nil {
		return nil, err
	}
	st := &labState{}
	return st, json.Unmarshal(data, st)
}

// labServe builds the lab, runs vpcnid on every node (unless !agents) and
// serves the endpoint until SIGTERM; then it takes everything down.
func labServe(prefix string, nodes int, subnet string, agents bool, nc labNodeConfig) error {
	bin, err := binDir()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	sn, err := netip.ParsePrefix(subnet)
	if err != nil {
		return err
	}
	var sn6 netip.Prefix
	if nc.Subnet6 != "" {
		if sn6, err = netip.ParsePrefix(nc.Subnet6); err != nil || !sn6.Addr().Is6() {
			return fmt.Errorf("--subnet6 %q is not an IPv6 prefix", nc.Subnet6)
		}
	}
	l, err := lab.Up(ctx, lab.Config{Prefix: prefix, Nodes: nodes, Subnet: sn, Subnet6: sn6, Cloud: nc.Provider})
	if err != nil {
		return err
	}
	defer l.Close()
	dir := labDir(prefix)
	st := labState{Prefix: prefix, URL: l.URL, SubnetID: l.SubnetID, SubnetID6: l.SubnetID6, Router: l.Router, Legacy: l.Legacy}
	modes := strings.Split(cmp.Or(nc.Datapath, "veth"), ",")
	for i, n := range l.Nodes {
		if !agents {
			st.Nodes = append(st.Nodes, labNodeRef{Host: n})
			continue
		}
		cfg := config.Defaults()
		cfg.NodeName = n.Name
		cfg.SocketPath = filepath.Join(dir, n.Name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(dir, n.Name, "state")
		cfg.Datapath = config.Datapath{Mode: modes[min(i, len(modes)-1)]}
		cfg.Provider = nc.provider(l)
		if l.SubnetID6 != "" {
			// The lab's network is dual-stack: so are its pods, their
			// IPv6 addresses from the subnet of the node's port.
			cfg.IPFamilies = []family.Family{family.V4, family.V6}
		}
		a, err := testbed.StartAgentIn(dir, n.NS, bin, cfg)
		if err != nil {
			return fmt.Errorf("vpcnid on %s: %w", n.Name, err)
		}
		defer a.Stop()
		st.Nodes = append(st.Nodes, labNodeRef{Host: n, Socket: cfg.SocketPath})
	}
	data, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "state.json"), data, 0o600); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// labDown stops `lab serve` by its recorded PID and removes what is left,
// also after a crash.
func labDown(prefix string, out io.Writer) error {
	dir := labDir(prefix)
	if data, err := os.ReadFile(filepath.Join(dir, "serve.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.Fields(string(data))[0]); err == nil && pid > 1 {
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), "lab") {
				_ = syscall.Kill(pid, syscall.SIGTERM)
				for i := 0; i < 100; i++ {
					if syscall.Kill(pid, 0) != nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	}
	errs := []error{testbed.StopRecorded(dir), lab.Down(prefix)}
	_ = os.RemoveAll(dir)
	fmt.Fprintf(out, "lab %s is down\n", prefix)
	return errors.Join(errs...)
}

func labStatus(prefix string, out io.Writer) error {
	st, err := readLabState(prefix)
	if err != nil {
		return fmt.Errorf("no lab %s is up (vpcnictl lab up): %w", prefix, err)
	}
	fmt.Fprintf(out, "lab %s: endpoint %s\n", prefix, st.URL)
	for _, n := range st.Nodes {
		fmt.Fprintf(out, "\n== %s (%s) ==\n", n.Name, n.IP)
		if n.Socket == "" {
			fmt.Fprintln(out, "no vpcnid (lab up --agents=false)")
			continue
		}
		if err := status([]string{"--socket", n.Socket}, out); err != nil {
			fmt.Fprintf(out, "%v\n", err)
		}
	}
	return nil
}
