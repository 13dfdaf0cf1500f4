package doctor

import (
	"context"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/provider"
)

// Options say where to look.
type Options struct {
	// AgentConfig is vpcnid's config file.
	AgentConfig string
	// Socket is the agent's ("": the config's socketPath).
	Socket string
	// ConfDir and BinDir are the runtime's CNI dirs.
	ConfDir, BinDir string
}

// Run runs every check that applies to this node. The registered
// datapath modes and providers are those the caller linked in; the cloud
// is looked at through the configured provider's Doctor.
func Run(ctx context.Context, o Options) Report {
	var rep Report
	cfg, cfgErr := config.Load(o.AgentConfig)
	mode := ""
	if cfgErr != nil {
		rep.add(Result{Name: "config", Status: Fail, Detail: cfgErr.Error(),
			Fix: "fix the file (vpcnid refuses it the same way), or pass --agent-config; checks that need it are skipped"})
	} else {
		mode = cfg.Datapath.Mode
		rep.add(Result{Name: "config", Status: OK, Detail: o.AgentConfig + ": datapath " + mode + ", provider " + cfg.Provider.Type})
	}

	var uplink Link
	uplinkErr := cfgErr
	if cfgErr == nil {
		uplink, uplinkErr = ReadUplink(cfg.Uplink)
	}
	rep.add(kernel(mode, cfg, uplink.Name)...)
	rep.add(BTF(Exists))
	if cfgErr == nil {
		if uplinkErr == nil {
			if r, _ := datapath.Lookup(mode); r.Needs != nil {
				n := r.Needs(datapath.Node{Uplink: uplink.Name, MTU: cfg.MTU, Families: cfg.Families()}, cfg.Datapath.Settings)
				rep.add(Sysctls(mode, n.Sysctls, ReadSysctl, o.AgentConfig)...)
			}
		}
		rep.add(Uplink(uplink, uplinkErr, cfg.MTU, o.AgentConfig))
	}

	rep.add(CNI(o.ConfDir, o.BinDir)...)

	socket := o.Socket
	if socket == "" {
		socket = cfg.SocketPath // Defaults' when the config could not be read
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	var st api.State
	err := api.NewClient(socket).Do(actx, api.PathState, nil, &st)
	cancel()
	rep.add(Agent(socket, &st, err))

	if cfgErr != nil {
		return rep
	}
	if r, err := provider.Lookup(cfg.Provider.Type); err == nil && r.Doctor != nil {
		clock := &DateClock{Next: http.DefaultTransport}
		nodeIP, _ := netip.ParseAddr(uplink.IPv4)
		rep.add(Cloud(r.Doctor.Diagnose(ctx, cfg.Provider.Settings, provider.DoctorNode{IP: nodeIP, ConfigFile: o.AgentConfig, Transport: clock,
			Wrap: func(rt http.RoundTripper) http.RoundTripper { clock.Next = rt; return clock }}))...)
		rep.add(clock.Skew(r.Doctor.API))
	}
	if cfg.Kubernetes.Enabled() {
		clock := &DateClock{}
		rc, err := k8s.RestConfig(cfg.Kubernetes.Kubeconfig)
		rep.add(APIServer(ctx, rc, err, cfg.NodeName, clock))
		if clock.Next != nil {
			rep.add(clock.Skew("apiserver"))
		}
	}
	return rep
}

// kernel probes the link types of every registered mode.
func kernel(mode string, cfg config.Config, uplink string) []Result {
	needs := map[string]datapath.Needs{}
	var kinds []string
	for _, name := range datapath.Names() {
		r, _ := datapath.Lookup(name)
		if r.Needs == nil {
			continue
		}
		var s datapath.Settings
		if name == mode {
			s = cfg.Datapath.Settings
		} else if s, _ = datapath.NewSettings(name); s != nil {
			s.Defaults()
		}
		n := r.Needs(datapath.Node{Uplink: uplink}, s)
		needs[name] = n
		for _, k := range n.Links {
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
	}
	probed, err := ProbeLinks(kinds)
	if err != nil {
		return []Result{{Name: "kernel", Status: Fail, Detail: err.Error(),
			Fix: "run doctor as root (or with CAP_SYS_ADMIN and CAP_NET_ADMIN, as vpcnid's pod has)"}}
	}
	return Kernel(mode, needs, probed)
}
