// Package config is vpcnid's configuration file: Defaults, then the file on
// top, then Validate naming every bad field at once.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/snat"
	"github.com/vpcni/vpcni/internal/units"
)

// Config is the whole agent configuration.
type Config struct {
	// NodeName identifies this node (default: the host name).
	NodeName string `json:"nodeName"`
	// SocketPath is the agent's unix socket (mode 0600, root only).
	SocketPath string `json:"socketPath"`
	// StateDir holds the allocation store and the static provider's state.
	StateDir string `json:"stateDir"`
	// Uplink is the node interface pods reach the network through
	// (default: the interface of the default route).
	Uplink string `json:"uplink"`
	// MTU of the pod interfaces (default: the uplink's MTU).
	MTU int `json:"mtu"`
	// IPFamilies are the address families each pod gets, in the order
	// of the CNI result: [ipv4] (default), [ipv6], or both for
	// dual-stack. Every family has a pool of its own. Empty: [ipv4].
	IPFamilies []family.Family `json:"ipFamilies"`
	// Datapath picks the pod wiring mode and holds its section.
	Datapath Datapath `json:"datapath"`
	// Cooldown is how long a released address rests before it is reused.
	Cooldown Duration `json:"cooldown"`
	// Resync is how often the pool is reconciled with what the provider
	// holds (addresses adopted, lost ones asked for again).
	Resync Duration `json:"resync"`
	// SelfHeal keeps the node's datapath whole while the agent runs.
	SelfHeal SelfHeal `json:"selfHeal"`
	// Health is the agent's periodic probe of every pod's datapath.
	Health Health `json:"health"`
	// MetricsAddr is where Prometheus metrics are served ("" = off). A
	// ${VAR} in it is read from the environment when the file loads, so a
	// DaemonSet can name the node's own address (status.hostIP) without a
	// file per node.
	MetricsAddr string `json:"metricsAddr"`
	// LogLevel: debug, info, warn, error.
	LogLevel   string     `json:"logLevel"`
	Pool       Pool       `json:"pool"`
	Provider   Provider   `json:"provider"`
	Kubernetes Kubernetes `json:"kubernetes"`
	// SNAT masquerades pod traffic leaving the VPC (off by default).
	SNAT snat.Config `json:"snat"`
}

// Kubernetes connects the agent to the cluster: pod annotations, events on
// pods whose setup failed, pool figures on the node, and a PodAddress
// object per pod address (what vpcni-controller reconciles).
type Kubernetes struct {
	// Mode: "auto" or empty (on when the agent runs in a pod or Kubeconfig is set),
	// "on" (the agent is not ready without the API server) or "off".
	Mode string `json:"mode"`
	// Kubeconfig, if set, is used instead of the pod's service account.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// IPResource "on" (default) advertises the extended resource
	// vpcni.io/ip on the Node (how many pods on the pod network it can
	// still address); "off" removes it. vpcni-controller's webhook makes
	// every such pod request one.
	IPResource string `json:"ipResource,omitempty"`
	// NotReadyTaint "on" (default) keeps the taint vpcni.io/not-ready:NoSchedule
	// on the Node until the agent's pool first reaches pool.warmTarget;
	// "off" never sets it (and removes one left over).
	NotReadyTaint string `json:"notReadyTaint,omitempty"`
}

// On reads an on/off field; empty means on.
func On(v string) bool { return v != "off" }

// Enabled says whether the agent talks to Kubernetes.
func (k Kubernetes) Enabled() bool {
	switch k.Mode {
	case "on":
		return true
	case "off":
		return false
	}
	return k.Kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != ""
}

// Pool sizes the warm pool of addresses held ahead of demand.
type Pool struct {
	// WarmTarget is how many free addresses the agent keeps ready.
	WarmTarget int `json:"warmTarget"`
	// BatchSize is how many addresses one provider call asks for at most;
	// 0 (the default): no bound but the node's capacity, so an empty pool
	// asks for every waiting ADD plus the warm target in one call.
	BatchSize int `json:"batchSize"`
	// MaxFree: free addresses above this go back to the provider.
	MaxFree int `json:"maxFree"`
	// MinHeld: surplus is never given back below this many held addresses.
	MinHeld int `json:"minHeld"`
	// SurplusGrace is how long free addresses must stay above MaxFree
	// before the surplus goes back (±25% jitter), so churn does not thrash
	// the cloud.
	SurplusGrace Duration `json:"surplusGrace"`
	// AddWait bounds how long an ADD waits for addresses when the pool is
	// empty (for a refill or a cooldown to end) before "try again later".
	AddWait Duration `json:"addWait"`
}

// SelfHeal is how the agent notices and repairs what was taken from its
// datapath (a route, a proxy ARP entry, a link, a rule, a NAT table):
// it reconciles the node when the kernel reports a change to something of
// vpcni's, and periodically in any case.
type SelfHeal struct {
	// Watch: reconcile on the kernel's change notifications (links,
	// routes, rules, nftables; proxy ARP entries are polled). Default
	// true; off, repairs wait for the period.
	Watch *bool `json:"watch,omitempty"`
	// Period: a full reconcile at least this often, watch or not, for
	// what no notification reports (default 30s).
	Period Duration `json:"period"`
	// MinInterval bounds how often reconciles run however many changes
	// arrive (a burst of pod deletions), so the node's pods' ADDs are
	// never starved (default 50ms).
	MinInterval Duration `json:"minInterval"`
}

// Health sets the periodic probe of every pod's datapath, shown by
// vpcnictl status and the vpcni_pod_datapath metric.
type Health struct {
	// Interval between probes of all pods (default 30s; 0 = off). A probe
	// is the datapath mode's check: the node's route and neighbour entry,
	// the link, the pod's own addresses and routes.
	Interval Duration `json:"interval"`
	// Ping adds an ICMP echo from the node to every pod (off by default:
	// a pod whose network policy drops ICMP would show unhealthy).
	Ping bool `json:"ping,omitempty"`
	// PingTimeout is how long the echo replies are waited for (default 1s).
	PingTimeout Duration `json:"pingTimeout"`
}

// Watching says whether the kernel watch is on.
func (s SelfHeal) Watching() bool { return s.Watch == nil || *s.Watch }

// Duration is a time.Duration written as "30s" in the file: the one
// every config section spells (units.Duration), here under its old name.
type Duration = units.Duration

// Defaults returns the configuration used for every field the file omits.
func Defaults() Config {
	return Config{
		NodeName:    defaultNodeName(),
		SocketPath:  "/run/vpcni/vpcnid.sock",
		StateDir:    "/var/lib/vpcni",
		Datapath:    Datapath{Mode: "veth"},
		IPFamilies:  []family.Family{family.V4},
		Cooldown:    Duration{Duration: 30 * time.Second},
		Resync:      Duration{Duration: time.Minute},
		LogLevel:    "info",
		Pool:        Pool{WarmTarget: 8, MaxFree: 24, AddWait: Duration{Duration: 10 * time.Second}, SurplusGrace: Duration{Duration: 2 * time.Minute}},
		MetricsAddr: "127.0.0.1:9695",
		SelfHeal:    SelfHeal{Period: Duration{Duration: 30 * time.Second}, MinInterval: Duration{Duration: 50 * time.Millisecond}},
		Health:      Health{Interval: Duration{Duration: 30 * time.Second}, PingTimeout: Duration{Duration: time.Second}},
		Provider:    Provider{Type: "static"},
		Kubernetes:  Kubernetes{Mode: "auto"},
	}
}

// defaultNodeName: $VPCNI_NODE_NAME (a DaemonSet sets it from
// spec.nodeName), else the host name.
func defaultNodeName() string {
	if n := os.Getenv("VPCNI_NODE_NAME"); n != "" {
		return n
	}
	host, _ := os.Hostname()
	return host
}

// Load reads a YAML or JSON file on top of Defaults and validates it.
func Load(path string) (Config, error) {
	cfg := Defaults()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	if cfg.NodeName == "" {
		// Written out empty means "the default", as for uplink and mtu.
		cfg.NodeName = defaultNodeName()
	}
	if cfg.MetricsAddr, err = expandEnv(cfg.MetricsAddr); err != nil {
		return cfg, fmt.Errorf("config %s: metricsAddr: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// expandEnv replaces $VAR and ${VAR} in s by the environment's value. A
// variable unset or empty is an error: "${VPCNI_HOST_IP}:9695" with the
// variable missing would otherwise listen on every address of the node.
func expandEnv(s string) (string, error) {
	var missing []string
	out := os.Expand(s, func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return s, fmt.Errorf("%q names $%s, which is not set in the environment", s, strings.Join(missing, ", $"))
	}
	return out, nil
}

// Families are the pods' address families, in order: IPFamilies, or
// IPv4 alone when the file left them empty.
func (c *Config) Families() []family.Family {
	if len(c.IPFamilies) == 0 {
		return []family.Family{family.V4}
	}
	return c.IPFamilies
}

// Validate names every bad field at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{field}, args...)...))
	}
	if c.NodeName == "" {
		bad("nodeName", "must be set (the host name is empty)")
	}
	if !filepath.IsAbs(c.SocketPath) {
		bad("socketPath", "%q must be an absolute path", c.SocketPath)
	} else if len(c.SocketPath) > 107 {
		bad("socketPath", "%q is longer than a unix socket path may be (107 bytes)", c.SocketPath)
	}
	if !filepath.IsAbs(c.StateDir) {
		bad("stateDir", "%q must be an absolute path", c.StateDir)
	}
	if len(c.Uplink) > 15 || strings.ContainsAny(c.Uplink, "/ ") {
		bad("uplink", "%q is not a valid interface name", c.Uplink)
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		bad("mtu", "%d is outside 576..65535 (0 = the uplink's MTU)", c.MTU)
	}
	if err := family.Check(c.Families()); err != nil {
		bad("ipFamilies", "%v", err)
	}
	errs = append(errs, c.Datapath.validate()...)
	if c.Cooldown.Duration < 0 || c.Cooldown.Duration > time.Hour {
		bad("cooldown", "%s is outside 0..1h", c.Cooldown)
	}
	if c.Resync.Duration < time.Second || c.Resync.Duration > 24*time.Hour {
		bad("resync", "%s is outside 1s..24h", c.Resync)
	}
	if p := c.SelfHeal.Period.Duration; p < 100*time.Millisecond || p > 24*time.Hour {
		bad("selfHeal.period", "%s is outside 100ms..24h", c.SelfHeal.Period)
	}
	if m := c.SelfHeal.MinInterval.Duration; m < 0 || m > 10*time.Second || m > c.SelfHeal.Period.Duration {
		bad("selfHeal.minInterval", "%s is outside 0..10s or above selfHeal.period", c.SelfHeal.MinInterval)
	}
	if i := c.Health.Interval.Duration; i != 0 && (i < time.Second || i > 24*time.Hour) {
		bad("health.interval", "%s is outside 1s..24h (0 = off)", c.Health.Interval)
	}
	if c.Health.Ping && (c.Health.PingTimeout.Duration < 10*time.Millisecond || c.Health.PingTimeout.Duration > 10*time.Second) {
		bad("health.pingTimeout", "%s is outside 10ms..10s", c.Health.PingTimeout)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("logLevel", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch c.Kubernetes.Mode {
	case "", "auto", "on", "off": // empty: auto
	default:
		bad("kubernetes.mode", "%q is not one of auto, on, off", c.Kubernetes.Mode)
	}
	for _, f := range []struct{ name, v string }{{"kubernetes.ipResource", c.Kubernetes.IPResource}, {"kubernetes.notReadyTaint", c.Kubernetes.NotReadyTaint}} {
		if f.v != "" && f.v != "on" && f.v != "off" {
			bad(f.name, "%q is not one of on, off", f.v)
		}
	}
	if c.Pool.WarmTarget < 0 {
		bad("pool.warmTarget", "%d must not be negative", c.Pool.WarmTarget)
	}
	if c.Pool.MinHeld < 0 {
		bad("pool.minHeld", "%d must not be negative", c.Pool.MinHeld)
	}
	if c.Pool.MaxFree < c.Pool.WarmTarget {
		bad("pool.maxFree", "%d is below pool.warmTarget %d", c.Pool.MaxFree, c.Pool.WarmTarget)
	}
	if c.Pool.SurplusGrace.Duration < 0 || c.Pool.SurplusGrace.Duration > 24*time.Hour {
		bad("pool.surplusGrace", "%s is outside 0..24h", c.Pool.SurplusGrace)
	}
	if c.Pool.AddWait.Duration < 0 || c.Pool.AddWait.Duration > 5*time.Minute {
		bad("pool.addWait", "%s is outside 0..5m", c.Pool.AddWait)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			bad("metricsAddr", "%q is not host:port", c.MetricsAddr)
		}
	}
	if c.Pool.BatchSize < 0 {
		bad("pool.batchSize", "%d is negative (0: no bound)", c.Pool.BatchSize)
	}
	errs = append(errs, c.Provider.validate()...)
	errs = append(errs, validateSection("snat", nopDefaults{c.SNAT})...)
	if reg, err := provider.Lookup(c.Provider.Type); err == nil && c.SNAT.On(reg.SNATByDefault) && len(c.SNAT.VPCCIDRs) == 0 && !reg.SNATByDefault {
		errs = append(errs, fmt.Errorf("snat.%w", snat.ErrNoVPC))
	}
	return errors.Join(errs...)
}

// SNATOn says whether the agent masquerades pod traffic leaving the VPC:
// as snat.enabled says, else as the provider's default.
func (c *Config) SNATOn() bool {
	reg, err := provider.Lookup(c.Provider.Type)
	return c.SNAT.On(err == nil && reg.SNATByDefault)
}
