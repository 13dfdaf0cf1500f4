package openstack

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpcni/vpcni/internal/units"
)

// Config is the openstack provider's section of vpcnid.yaml
// (provider.openstack): pod addresses from Neutron.
type Config struct {
	// Endpoint is a Neutron endpoint used without Keystone (noauth test
	// clouds and labs), e.g. http://127.0.0.1:9696/. Leave empty with auth.
	Endpoint string `json:"endpoint,omitempty"`
	// Auth is how to log in to Keystone; CredentialsFile, if set, is read
	// for the same fields (a mounted Secret), over what Auth says.
	Auth            Auth   `json:"auth,omitempty"`
	CredentialsFile string `json:"credentialsFile,omitempty"`
	// SubnetID is the Neutron subnet pods take addresses from. Empty:
	// the subnet of the node's own VM port's fixed IP (the one the port is
	// found by), so one config serves nodes in different subnets.
	SubnetID string `json:"subnetID,omitempty"`
	// SubnetIDv6 is the Neutron IPv6 subnet pods take their IPv6
	// addresses from (ipFamilies with ipv6; mode fixed-ips), on the VM
	// port's network. Empty: the subnet of the VM port's first IPv6 fixed
	// IP. Its ipv6_address_mode must be dhcpv6-stateful or unset, and its
	// ipv6_ra_mode not slaac or dhcpv6-stateless: Neutron refuses any
	// address but a port's EUI-64 one on such an auto-address subnet.
	SubnetIDv6 string `json:"subnetIDv6,omitempty"`
	// ModeV6 is how pods get IPv6 addresses: "fixed-ips" (default; more
	// fixed IPs on the VM port, as mode fixed-ips) or "prefix-pair" (the
	// node's /96 block of PrefixRangeV6 is one allowed address pair on the
	// VM port and its addresses are handed out with no Neutron IPAM: it
	// works on SLAAC subnets too).
	ModeV6 string `json:"modeV6,omitempty"`
	// PrefixRangeV6 (prefix-pair) is the range the nodes' /96 blocks come
	// from, inside the IPv6 subnet and outside its allocation pools: the
	// node whose IPv4 address is the n-th of its subnet takes the n-th
	// block.
	PrefixRangeV6 string `json:"prefixRangeV6,omitempty"`
	// Subnets (IDs) or SubnetTags (Neutron's tags filter: subnets with
	// every tag) select several IPv4 subnets, instead of SubnetID: the VM
	// port's own (or the first on its network) serves the VM port, and a
	// new secondary NIC goes on the one with the most free addresses,
	// a full one moving on to the next.
	Subnets    []string `json:"subnets,omitempty"`
	SubnetTags []string `json:"subnetTags,omitempty"`
	// PortLookup: "ip" finds this node's VM port by NodeIP (default: the
	// uplink's address); "instance" by InstanceID (the Nova server ID).
	PortLookup string `json:"portLookup,omitempty"`
	NodeIP     string `json:"nodeIP,omitempty"`
	InstanceID string `json:"instanceID,omitempty"`
	// Mode: "fixed-ips" (pod IPs are extra fixed IPs on the VM port),
	// "address-pairs" (each pod IP is reserved by a port of its own and
	// allowed on the VM port as an allowed address pair) or "passthrough"
	// (each pod IP is a port of its own, attached to the VM through Nova
	// as a NIC that the datapath moves into the pod).
	Mode string `json:"mode,omitempty"`
	// ComputeEndpoint is a Nova endpoint used without Keystone (labs), e.g.
	// http://127.0.0.1:8774/v2.1/; with auth Nova is found in the catalog.
	ComputeEndpoint string `json:"computeEndpoint,omitempty"`
	// MaxNICs is how many NICs the VM may have, its primary one included
	// (the hypervisor's or the cloud's limit; default 8). It bounds
	// passthrough pods and secondary NICs.
	MaxNICs int `json:"maxNICs,omitempty"`
	// SecondaryNICs (fixed-ips mode; default 0 = off): once the VM port
	// holds MaxAddresses pod addresses, up to this many more ports are
	// attached to the VM and hold MaxAddresses each.
	SecondaryNICs int `json:"secondaryNICs,omitempty"`
	// AttachTimeout bounds one NIC attach or detach through Nova
	// (measured ~1.1 s attach, ~1 s detach on a real Nova; first ~5 s).
	AttachTimeout units.Duration `json:"attachTimeout,omitempty"`
	// DeviceOwner marks the reservation ports of address-pairs mode.
	DeviceOwner string `json:"deviceOwner,omitempty"`
	// MaxAddressPairs is Neutron's max_allowed_address_pair (default 10).
	MaxAddressPairs int `json:"maxAddressPairs,omitempty"`
	// MaxAddresses caps how many pod addresses this node holds (with
	// SecondaryNICs: how many each port holds).
	MaxAddresses int `json:"maxAddresses,omitempty"`
	// Timeout of one Neutron call; Retries of a failed or conflicting one.
	Timeout units.Duration `json:"timeout,omitempty"`
	Retries int            `json:"retries,omitempty"`

	// CABundle is the CA certificates (PEM) that sign the certificates of
	// Keystone, Neutron and Nova, trusted beside the system's: a file's
	// absolute path, or the PEM text itself (default: the system's only).
	CABundle string `json:"caBundle,omitempty"`
	// Insecure skips verifying those certificates (a lab; never a cloud
	// that matters): logged as a warning at every connect.
	Insecure bool `json:"insecure,omitempty"`
	// EndpointInterface is which of the Keystone catalog's URLs for
	// Neutron and Nova to use: public (default), internal or admin.
	EndpointInterface string `json:"endpointInterface,omitempty"`
	// Proxy is an HTTP(S) proxy (http://host:port) every call to
	// Keystone, Neutron and Nova goes through. Empty: vpcnid's
	// HTTPS_PROXY, HTTP_PROXY and NO_PROXY apply, as for any Go program.
	Proxy string `json:"proxy,omitempty"`
}

// Auth is a Keystone login: an application credential, or a user
// with a password and a project.
type Auth struct {
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

// Defaults implements provider.Settings: what the section leaves out.
func (o *Config) Defaults() {
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
	if o.MaxNICs == 0 {
		o.MaxNICs = 8
	}
	if o.AttachTimeout.Duration == 0 {
		o.AttachTimeout.Duration = time.Minute
	}
	if o.EndpointInterface == "" {
		o.EndpointInterface = "public"
	}
}

// Validate implements provider.Settings: every bad field at once.
func (o *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{field}, args...)...))
	}
	switch {
	case o.SubnetID != "" && len(o.Subnets) > 0:
		bad("subnetID", "names one subnet and subnets several: give one of them")
	case o.SubnetID != "" && len(o.SubnetTags) > 0:
		bad("subnetID", "names one subnet and subnetTags selects several: give one of them")
	case len(o.Subnets) > 0 && len(o.SubnetTags) > 0:
		bad("subnets", "and subnetTags both select subnets: give one of them")
	}
	for i, id := range o.Subnets {
		if strings.TrimSpace(id) == "" || slices.Contains(o.Subnets[:i], id) {
			bad("subnets", "entry %d %q is empty or repeated", i, id)
		}
	}
	for i, tag := range o.SubnetTags {
		if strings.TrimSpace(tag) == "" || strings.Contains(tag, ",") {
			bad("subnetTags", "entry %d %q is empty or has a comma", i, tag)
		}
	}
	hasAuth := o.Auth != (Auth{}) || o.CredentialsFile != ""
	switch {
	case o.Endpoint == "" && !hasAuth:
		bad("auth", "set auth.authURL with credentials (or credentialsFile), or endpoint for a Neutron without Keystone")
	case o.Endpoint != "" && hasAuth:
		bad("endpoint", "is for a Neutron without Keystone; leave it empty when auth is set")
	}
	if o.Endpoint != "" && !strings.HasPrefix(o.Endpoint, "http://") && !strings.HasPrefix(o.Endpoint, "https://") {
		bad("endpoint", "%q is not an http(s) URL", o.Endpoint)
	}
	if hasAuth && o.Endpoint == "" {
		errs = append(errs, o.checkCredentials()...)
	}
	errs = append(errs, o.checkTransport()...)
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
	if o.Mode != "fixed-ips" && o.Mode != "address-pairs" && o.Mode != "passthrough" {
		bad("mode", "%q is not one of fixed-ips, address-pairs, passthrough", o.Mode)
	}
	if o.ComputeEndpoint != "" && !strings.HasPrefix(o.ComputeEndpoint, "http://") && !strings.HasPrefix(o.ComputeEndpoint, "https://") {
		bad("computeEndpoint", "%q is not an http(s) URL", o.ComputeEndpoint)
	}
	if o.Endpoint != "" && o.ComputeEndpoint == "" && o.usesNova() {
		bad("computeEndpoint", "is required with endpoint (no Keystone catalog) when mode is passthrough or secondaryNICs is set")
	}
	if o.MaxNICs < 2 || o.MaxNICs > 64 {
		bad("maxNICs", "%d is outside 2..64 (the VM's primary NIC counts)", o.MaxNICs)
	}
	if o.SecondaryNICs < 0 || o.SecondaryNICs > o.MaxNICs-1 {
		bad("secondaryNICs", "%d is outside 0..%d (maxNICs less the primary NIC)", o.SecondaryNICs, o.MaxNICs-1)
	}
	if o.SecondaryNICs > 0 && o.Mode != "fixed-ips" {
		bad("secondaryNICs", "is for mode fixed-ips, not %s", o.Mode)
	}
	if o.AttachTimeout.Duration < time.Second || o.AttachTimeout.Duration > 10*time.Minute {
		bad("attachTimeout", "%s is outside 1s..10m", o.AttachTimeout)
	}
	switch o.ModeV6 {
	case "", "fixed-ips":
		if o.PrefixRangeV6 != "" {
			bad("prefixRangeV6", "is for modeV6 prefix-pair")
		}
	case "prefix-pair":
		if r, err := netip.ParsePrefix(o.PrefixRangeV6); err != nil || !r.Addr().Is6() || r.Bits() < 64 || r.Bits() > blockBits || r != r.Masked() {
			bad("prefixRangeV6", "%q is not an IPv6 range of /64 to /%d (its first address, e.g. fd00:10::1:0:0:0/80), which modeV6 prefix-pair needs", o.PrefixRangeV6, blockBits)
		}
	default:
		bad("modeV6", "%q is not one of fixed-ips, prefix-pair", o.ModeV6)
	}
	if o.SubnetIDv6 != "" && (o.Mode != "fixed-ips" || o.SecondaryNICs > 0) {
		bad("subnetIDv6", "IPv6 pod addresses are fixed IPs on the VM port: mode fixed-ips without secondaryNICs, not mode %s with secondaryNICs %d", o.Mode, o.SecondaryNICs)
	}
	if o.MaxAddressPairs < 1 || o.MaxAddressPairs > 1000 {
		bad("maxAddressPairs", "%d is outside 1..1000", o.MaxAddressPairs)
	}
	if o.MaxAddresses < 1 || o.MaxAddresses > maxMarked {
		bad("maxAddresses", "%d is outside 1..%d", o.MaxAddresses, maxMarked)
	}
	if o.Timeout.Duration < time.Second || o.Timeout.Duration > 5*time.Minute {
		bad("timeout", "%s is outside 1s..5m", o.Timeout)
	}
	if o.Retries < 1 || o.Retries > 50 {
		bad("retries", "%d is outside 1..50", o.Retries)
	}
	return errors.Join(errs...)
}

// usesNova: the mode attaches ports to the VM as NICs.
func (o *Config) usesNova() bool { return o.Mode == "passthrough" || o.SecondaryNICs > 0 }
