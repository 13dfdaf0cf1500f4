// Package config is vpcnid's configuration file: Defaults, then the file on
// top, then Validate naming every bad field at once.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
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
	// Datapath is the pod wiring mode. Only "veth" (routed) exists so far.
	Datapath string `json:"datapath"`
	// Cooldown is how long a released address rests before it is reused.
	Cooldown Duration `json:"cooldown"`
	// Resync is how often the pool is reconciled with what the provider
	// holds (addresses adopted, lost ones asked for again).
	Resync Duration `json:"resync"`
	// MetricsAddr is where Prometheus metrics are served ("" = off).
	MetricsAddr string `json:"metricsAddr"`
	// LogLevel: debug, info, warn, error.
	LogLevel   string     `json:"logLevel"`
	Pool       Pool       `json:"pool"`
	Provider   Provider   `json:"provider"`
	Kubernetes Kubernetes `json:"kubernetes"`
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
}

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
	// BatchSize is how many addresses one provider call asks for at most.
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

// Provider selects and configures where addresses come from.
type Provider struct {
	Type      string     `json:"type"`
	Static    *Static    `json:"static,omitempty"`
	OpenStack *OpenStack `json:"openstack,omitempty"`
}

// OpenStack takes pod addresses from Neutron.
type OpenStack struct {
	// Endpoint is a Neutron endpoint used without Keystone (noauth test
	// clouds and labs), e.g. http://127.0.0.1:9696/. Leave empty with auth.
	Endpoint string `json:"endpoint,omitempty"`
	// Auth is how to log in to Keystone; CredentialsFile, if set, is read
	// for the same fields (a mounted Secret), over what Auth says.
	Auth            OpenStackAuth `json:"auth,omitempty"`
	CredentialsFile string        `json:"credentialsFile,omitempty"`
	// SubnetID is the Neutron subnet pods take addresses from.
	SubnetID string `json:"subnetID"`
	// PortLookup: "ip" finds this node's VM port by NodeIP (default: the
	// uplink's address); "instance" by InstanceID (the Nova server ID).
	PortLookup string `json:"portLookup,omitempty"`
	NodeIP     string `json:"nodeIP,omitempty"`
	InstanceID string `json:"instanceID,omitempty"`
	// Mode: "fixed-ips" (pod IPs are extra fixed IPs on the VM port) or
	// "address-pairs" (each pod IP is reserved by a port of its own and
	// allowed on the VM port as an allowed address pair).
	Mode string `json:"mode,omitempty"`
	// DeviceOwner marks the reservation ports of address-pairs mode.
	DeviceOwner string `json:"deviceOwner,omitempty"`
	// MaxAddressPairs is Neutron's max_allowed_address_pair (default 10).
	MaxAddressPairs int `json:"maxAddressPairs,omitempty"`
	// MaxAddresses caps how many pod addresses this node holds.
	MaxAddresses int `json:"maxAddresses,omitempty"`
	// Timeout of one Neutron call; Retries of a failed or conflicting one.
	Timeout Duration `json:"timeout,omitempty"`
	Retries int      `json:"retries,omitempty"`
}

// OpenStackAuth is a Keystone login: an application credential, or a user
// with a password and a project.
type OpenStackAuth struct {
	AuthURL                     string `json:"authURL,omitempty"`
	Region                      string `json:"region,omitempty"`
	ApplicationCredentialID     string `json:"applicationCredentialID,omitempty"`
	ApplicationCredentialSecret string `json:"applicationCredentialSecret,omitempty"`
	Username                    string `json:"username,omitempty"`
	Password                    string `json:"password,omitempty"`
	UserDomainName              string `json:"userDomainName,omitempty"`
	ProjectID                   string `json:"projectID,omitempty"`
	ProjectName                 string `json:"projectName,omitempty"`
	ProjectDomainName           string `json:"projectDomainName,omitempty"`
}

// ApplyDefaults fills what an openstack provider section leaves out.
func (o *OpenStack) ApplyDefaults() {
	if o.PortLookup == "" {
		o.PortLookup = "ip"
	}
	if o.Mode == "" {
		o.Mode = "fixed-ips"
	}
	if o.MaxAddresses == 0 {
		o.MaxAddresses = 64
	}
	if o.DeviceOwner == "" {
		o.DeviceOwner = "network:vpcni"
	}
	if o.MaxAddressPairs == 0 {
		o.MaxAddressPairs = 10
	}
	if o.Timeout.Duration == 0 {
		o.Timeout.Duration = 15 * time.Second
	}
	if o.Retries == 0 {
		o.Retries = 6
	}
}

func (o *OpenStack) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("provider.openstack.%s: "+format, append([]any{field}, args...)...))
	}
	if o.SubnetID == "" {
		bad("subnetID", "is required: the Neutron subnet pods take addresses from")
	}
	hasAuth := o.Auth.AuthURL != "" || o.CredentialsFile != ""
	switch {
	case o.Endpoint == "" && !hasAuth:
		bad("auth", "set auth.authURL with credentials (or credentialsFile), or endpoint for a Neutron without Keystone")
	case o.Endpoint != "" && hasAuth:
		bad("endpoint", "is for a Neutron without Keystone; leave it empty when auth is set")
	}
	if o.Endpoint != "" && !strings.HasPrefix(o.Endpoint, "http://") && !strings.HasPrefix(o.Endpoint, "https://") {
		bad("endpoint", "%q is not an http(s) URL", o.Endpoint)
	}
	if a := o.Auth; a.AuthURL != "" && o.CredentialsFile == "" {
		appCred := a.ApplicationCredentialID != "" || a.ApplicationCredentialSecret != ""
		user := a.Username != "" || a.Password != ""
		switch {
		case appCred && (a.ApplicationCredentialID == "" || a.ApplicationCredentialSecret == ""):
			bad("auth", "an application credential needs both applicationCredentialID and applicationCredentialSecret")
		case user && (a.Username == "" || a.Password == "" || a.ProjectID == "" && a.ProjectName == ""):
			bad("auth", "a password login needs username, password and projectID or projectName")
		case !appCred && !user:
			bad("auth", "give an application credential or a username and password")
		}
	}
	if o.CredentialsFile != "" && !filepath.IsAbs(o.CredentialsFile) {
		bad("credentialsFile", "%q must be an absolute path", o.CredentialsFile)
	}
	switch o.PortLookup {
	case "ip":
		if o.NodeIP != "" {
			if _, err := netip.ParseAddr(o.NodeIP); err != nil {
				bad("nodeIP", "%q is not an IP address", o.NodeIP)
			}
		}
	case "instance":
		if o.InstanceID == "" {
			bad("instanceID", "is required with portLookup: instance")
		}
	default:
		bad("portLookup", "%q is not one of ip, instance", o.PortLookup)
	}
	if o.Mode != "fixed-ips" && o.Mode != "address-pairs" {
		bad("mode", "%q is not one of fixed-ips, address-pairs", o.Mode)
	}
	if o.MaxAddressPairs < 1 || o.MaxAddressPairs > 1000 {
		bad("maxAddressPairs", "%d is outside 1..1000", o.MaxAddressPairs)
	}
	if o.MaxAddresses < 1 || o.MaxAddresses > 4096 {
		bad("maxAddresses", "%d is outside 1..4096", o.MaxAddresses)
	}
	if o.Timeout.Duration < time.Second || o.Timeout.Duration > 5*time.Minute {
		bad("timeout", "%s is outside 1s..5m", o.Timeout)
	}
	if o.Retries < 1 || o.Retries > 50 {
		bad("retries", "%d is outside 1..50", o.Retries)
	}
	return errs
}

// Static is the cloud-less provider: ranges from this file.
type Static struct {
	Ranges []Range `json:"ranges"`
}

// Range is one subnet (or part of one) pods may use.
type Range struct {
	// CIDR is the subnet, e.g. 10.0.0.0/24.
	CIDR string `json:"cidr"`
	// Gateway of the subnet; never handed to a pod (default: first host).
	Gateway string `json:"gateway,omitempty"`
	// Exclude lists addresses or CIDRs inside the subnet never handed out
	// (nodes, routers, DHCP servers ...).
	Exclude []string `json:"exclude,omitempty"`
}

// Duration is a time.Duration written as "30s" in the file.
type Duration struct{ time.Duration }

// UnmarshalJSON accepts "30s"-style strings and plain seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		d.Duration = v
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\" or a number of seconds, got %s", b)
	}
	d.Duration = time.Duration(secs * float64(time.Second))
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Defaults returns the configuration used for every field the file omits.
func Defaults() Config {
	return Config{
		NodeName:    defaultNodeName(),
		SocketPath:  "/run/vpcni/vpcnid.sock",
		StateDir:    "/var/lib/vpcni",
		Datapath:    "veth",
		Cooldown:    Duration{30 * time.Second},
		Resync:      Duration{time.Minute},
		LogLevel:    "info",
		Pool:        Pool{WarmTarget: 8, BatchSize: 8, MaxFree: 24, AddWait: Duration{10 * time.Second}, SurplusGrace: Duration{2 * time.Minute}},
		MetricsAddr: "127.0.0.1:9695",
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
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
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
	if c.Datapath != "veth" {
		bad("datapath", "%q is not supported (supported: veth)", c.Datapath)
	}
	if c.Cooldown.Duration < 0 || c.Cooldown.Duration > time.Hour {
		bad("cooldown", "%s is outside 0..1h", c.Cooldown)
	}
	if c.Resync.Duration < time.Second || c.Resync.Duration > 24*time.Hour {
		bad("resync", "%s is outside 1s..24h", c.Resync)
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
	if c.Pool.BatchSize < 1 {
		bad("pool.batchSize", "%d must be at least 1", c.Pool.BatchSize)
	}
	switch c.Provider.Type {
	case "static":
		if c.Provider.Static == nil || len(c.Provider.Static.Ranges) == 0 {
			bad("provider.static.ranges", "at least one range is required for the static provider")
		} else {
			for i, r := range c.Provider.Static.Ranges {
				errs = append(errs, r.validate(fmt.Sprintf("provider.static.ranges[%d]", i))...)
			}
		}
	case "openstack":
		if c.Provider.OpenStack == nil {
			bad("provider.openstack", "is required for the openstack provider")
		} else {
			c.Provider.OpenStack.ApplyDefaults()
			errs = append(errs, c.Provider.OpenStack.validate()...)
		}
	default:
		bad("provider.type", "%q is not supported (supported: static, openstack)", c.Provider.Type)
	}
	return errors.Join(errs...)
}

func (r Range) validate(field string) []error {
	var errs []error
	p, err := netip.ParsePrefix(r.CIDR)
	if err != nil {
		return []error{fmt.Errorf("%s.cidr: %q is not a CIDR", field, r.CIDR)}
	}
	if !p.Addr().Is4() {
		errs = append(errs, fmt.Errorf("%s.cidr: %q: only IPv4 is supported so far", field, r.CIDR))
	}
	if p.Masked() != p {
		errs = append(errs, fmt.Errorf("%s.cidr: %q has host bits set (did you mean %s?)", field, r.CIDR, p.Masked()))
	}
	if p.Bits() < 16 {
		errs = append(errs, fmt.Errorf("%s.cidr: %q is larger than a /16; split the subnet into per-node ranges", field, r.CIDR))
	}
	if r.Gateway != "" {
		if gw, err := netip.ParseAddr(r.Gateway); err != nil || !p.Contains(gw) {
			errs = append(errs, fmt.Errorf("%s.gateway: %q is not an address inside %s", field, r.Gateway, r.CIDR))
		}
	}
	for j, e := range r.Exclude {
		if _, err := ParseAddrOrPrefix(e); err != nil {
			errs = append(errs, fmt.Errorf("%s.exclude[%d]: %w", field, j, err))
		}
	}
	return errs
}

// ParseAddrOrPrefix reads "10.0.0.5" as 10.0.0.5/32 and "10.0.0.0/28" as is.
func ParseAddrOrPrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("%q is not an address or CIDR", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
