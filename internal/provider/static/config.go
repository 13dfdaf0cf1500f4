package static

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/vpcni/vpcni/internal/family"
)

// Config is the static provider's section of vpcnid.yaml
// (provider.static): the ranges pods take addresses from.
type Config struct {
	Ranges []Range `json:"ranges"`
	// Blocks, when set, has the node take addresses only from aligned
	// blocks of the ranges that vpcni-controller assigned to it
	// (NodeBlock objects; the controller's -block-ranges split into
	// blocks of -block-size): one configuration for every node, and no
	// two nodes hand out the same address. Without it the node takes
	// from the whole ranges, which must then differ per node.
	Blocks *Blocks `json:"blocks,omitempty"`
	// Probe configures the check of the segment before an address is
	// handed out (an ARP probe on the uplink).
	Probe Probe `json:"probe,omitempty"`
	// MaxAddresses is the most addresses of one family the node holds
	// at once, and so its capacity for that family (default 65536). An
	// IPv6 range of a /64 holds 2^64: the capacity a node advertises
	// (vpcni.io/ip) stays a number that means something.
	MaxAddresses int `json:"maxAddresses,omitempty"`
}

// DefaultMaxAddresses is maxAddresses' default: more than an IPv4 /16
// holds, far more than a node runs pods.
const DefaultMaxAddresses = 1 << 16

// Probe is the ARP probe (RFC 5227: sender address 0.0.0.0, so no host
// learns anything from it) each address gets on the uplink before it
// enters the node's pool: an address another host answers for is skipped
// and set aside, said as a VpcniAddressInUse warning naming the MAC that
// answered, and probed again once Recheck has passed. Only addresses in the
// uplink's own subnets are probed (ARP and neighbour solicitations reach
// no further): not a range on a NIC of its own, nor a routed pod subnet.
// An IPv6 address is probed with a neighbour solicitation from :: (as
// duplicate address detection sends it). The node's own
// addresses, the gateway and, with Kubernetes on, every Node's
// InternalIP and ExternalIP are never handed out, probe or not.
type Probe struct {
	// Enabled turns the probe on (default true).
	Enabled *bool `json:"enabled,omitempty"`
	// Timeout is how long a probe waits for an answer (default 300ms; a
	// host on the segment answers in well under a millisecond). All the
	// addresses of one request are probed at once, so a request waits
	// this long once, and only when the pool had to grow: a pod's ADD
	// from a warm pool never waits.
	Timeout string `json:"timeout,omitempty"`
	// Recheck is how long an address that answered stays set aside before
	// it is probed again (default 10m).
	Recheck string `json:"recheck,omitempty"`
}

// Probe's defaults.
const (
	DefaultProbeTimeout = 300 * time.Millisecond
	DefaultProbeRecheck = 10 * time.Minute
)

// On says whether the probe runs.
func (p Probe) On() bool { return p.Enabled == nil || *p.Enabled }

// TimeoutDuration is timeout parsed (its default when empty).
func (p Probe) TimeoutDuration() time.Duration {
	if d, err := time.ParseDuration(p.Timeout); err == nil {
		return d
	}
	return DefaultProbeTimeout
}

// RecheckDuration is recheck parsed (its default when empty).
func (p Probe) RecheckDuration() time.Duration {
	if d, err := time.ParseDuration(p.Recheck); err == nil {
		return d
	}
	return DefaultProbeRecheck
}

// Blocks configures the node's side of per-node blocks.
type Blocks struct {
	// Wait bounds how long one request for addresses waits for
	// vpcni-controller to add a block when the node's blocks are full
	// (a duration, default 10s).
	Wait string `json:"wait,omitempty"`
}

// DefaultBlockWait is blocks.wait's default.
const DefaultBlockWait = 10 * time.Second

// WaitDuration is blocks.wait parsed (its default when empty).
func (b *Blocks) WaitDuration() time.Duration {
	if d, err := time.ParseDuration(b.Wait); err == nil {
		return d
	}
	return DefaultBlockWait
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
	// NIC, when set, says the range lives on a network interface of the
	// node other than the uplink (a second NIC on the same segment):
	// pods with these addresses send and receive through it, by policy
	// routing (see the veth datapath).
	NIC *NIC `json:"nic,omitempty"`
}

// NIC is a second network interface of the node.
type NIC struct {
	// MAC finds the interface, whatever its name.
	MAC string `json:"mac"`
	// Address is the interface's own address in the range's subnet (the
	// source of its ARP); it is never handed to a pod.
	Address string `json:"address"`
}

// Defaults implements provider.Settings.
func (c *Config) Defaults() {
	if c.Blocks != nil && c.Blocks.Wait == "" {
		c.Blocks.Wait = DefaultBlockWait.String()
	}
	if c.Probe.Enabled == nil {
		on := true
		c.Probe.Enabled = &on
	}
	if c.Probe.Timeout == "" {
		c.Probe.Timeout = DefaultProbeTimeout.String()
	}
	if c.Probe.Recheck == "" {
		c.Probe.Recheck = DefaultProbeRecheck.String()
	}
	if c.MaxAddresses == 0 {
		c.MaxAddresses = DefaultMaxAddresses
	}
}

// Validate implements provider.Settings: every bad range field at once.
func (c *Config) Validate() error {
	if len(c.Ranges) == 0 {
		return errors.New("ranges: at least one range is required for the static provider")
	}
	var errs []error
	for i, r := range c.Ranges {
		errs = append(errs, r.validate(fmt.Sprintf("ranges[%d]", i))...)
	}
	if c.MaxAddresses < 0 {
		errs = append(errs, fmt.Errorf("maxAddresses: %d is negative (0: the default, %d)", c.MaxAddresses, DefaultMaxAddresses))
	}
	if c.Blocks != nil {
		if d, err := time.ParseDuration(c.Blocks.Wait); err != nil || d <= 0 || d > 10*time.Minute {
			errs = append(errs, fmt.Errorf("blocks.wait: %q is not a duration between 0s and 10m (e.g. 10s)", c.Blocks.Wait))
		}
	}
	if d, err := time.ParseDuration(c.Probe.Timeout); c.Probe.Timeout != "" && (err != nil || d < 10*time.Millisecond || d > 5*time.Second) {
		errs = append(errs, fmt.Errorf("probe.timeout: %q is not a duration between 10ms and 5s (e.g. 300ms)", c.Probe.Timeout))
	}
	if d, err := time.ParseDuration(c.Probe.Recheck); c.Probe.Recheck != "" && (err != nil || d < time.Second || d > 24*time.Hour) {
		errs = append(errs, fmt.Errorf("probe.recheck: %q is not a duration between 1s and 24h (e.g. 10m)", c.Probe.Recheck))
	}
	return errors.Join(errs...)
}

func (r Range) validate(field string) []error {
	var errs []error
	p, err := netip.ParsePrefix(r.CIDR)
	if err != nil {
		return []error{fmt.Errorf("%s.cidr: %q is not a CIDR", field, r.CIDR)}
	}
	switch {
	case p.Addr().Is4In6():
		errs = append(errs, fmt.Errorf("%s.cidr: %q is an IPv4 range written as IPv6: write it as IPv4", field, r.CIDR))
	case p.Masked() != p:
		errs = append(errs, fmt.Errorf("%s.cidr: %q has host bits set (did you mean %s?)", field, r.CIDR, p.Masked()))
	}
	// A node's range is the node's: an IPv4 /16 or an IPv6 /64 (the
	// usual subnet, 2^64 addresses, counted in closed form) is plenty.
	if p.Addr().Is4() && p.Bits() < 16 {
		errs = append(errs, fmt.Errorf("%s.cidr: %q is larger than a /16; split the subnet into per-node ranges", field, r.CIDR))
	}
	if p.Addr().Is6() && !p.Addr().Is4In6() && p.Bits() < 64 {
		errs = append(errs, fmt.Errorf("%s.cidr: %q is larger than a /64; give each node a /64 or less", field, r.CIDR))
	}
	if r.Gateway != "" {
		if gw, err := netip.ParseAddr(r.Gateway); err != nil || !p.Contains(gw) {
			errs = append(errs, fmt.Errorf("%s.gateway: %q is not an address inside %s", field, r.Gateway, r.CIDR))
		}
	}
	for j, e := range r.Exclude {
		if ep, err := ParseAddrOrPrefix(e); err != nil {
			errs = append(errs, fmt.Errorf("%s.exclude[%d]: %w", field, j, err))
		} else if family.Of(ep.Addr()) != family.Of(p.Addr()) {
			errs = append(errs, fmt.Errorf("%s.exclude[%d]: %q is not of the family of %s (%s)", field, j, e, r.CIDR, family.Of(p.Addr())))
		}
	}
	if r.NIC != nil {
		if _, err := net.ParseMAC(r.NIC.MAC); err != nil || len(r.NIC.MAC) != len("00:00:00:00:00:00") {
			errs = append(errs, fmt.Errorf("%s.nic.mac: %q is not a MAC address", field, r.NIC.MAC))
		}
		if a, err := netip.ParseAddr(r.NIC.Address); err != nil || !p.Contains(a) {
			errs = append(errs, fmt.Errorf("%s.nic.address: %q is not an address inside %s", field, r.NIC.Address, r.CIDR))
		}
		if r.Gateway == "" {
			errs = append(errs, fmt.Errorf("%s.gateway: a range on a NIC of its own needs its subnet's gateway (the NIC's default route)", field))
		}
	}
	return errs
}

// families are the address families of the ranges, IPv4 first.
func (c *Config) families() []family.Family {
	var out []family.Family
	for _, f := range family.All {
		for _, r := range c.Ranges {
			if p, err := netip.ParsePrefix(r.CIDR); err == nil && family.Of(p.Addr()) == f {
				out = append(out, f)
				break
			}
		}
	}
	return out
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
