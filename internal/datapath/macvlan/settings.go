package macvlan

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// DefaultServiceCIDR is Kubernetes' default Service range (kube-apiserver
// --service-cluster-ip-range).
const DefaultServiceCIDR = "10.96.0.0/12"

// Settings is the section of vpcnid.yaml of either mode (datapath.macvlan,
// datapath.ipvlan).
type Settings struct {
	// ServiceCIDRs are routed through the node's stack (the service veth),
	// so kube-proxy's rules apply to them: the cluster's Service ranges
	// (default [10.96.0.0/12]).
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
	// Parent is the node interface pods' sub-interfaces hang off (default:
	// the uplink). It must sit on the network the provider's addresses
	// belong to.
	Parent string `json:"parent,omitempty"`
}

// Defaults implements datapath.Settings.
func (s *Settings) Defaults() {
	if len(s.ServiceCIDRs) == 0 {
		s.ServiceCIDRs = []string{DefaultServiceCIDR}
	}
}

// Validate implements datapath.Settings: every bad field at once.
func (s *Settings) Validate() error {
	var errs []error
	for i, c := range s.ServiceCIDRs {
		p, err := netip.ParsePrefix(c)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("serviceCIDRs[%d]: %q is not a CIDR", i, c))
		case !p.Addr().Is4():
			errs = append(errs, fmt.Errorf("serviceCIDRs[%d]: %q: only IPv4 is supported so far", i, c))
		case p.Masked() != p:
			errs = append(errs, fmt.Errorf("serviceCIDRs[%d]: %q has host bits set (did you mean %s?)", i, c, p.Masked()))
		case p.Bits() == 0:
			errs = append(errs, fmt.Errorf("serviceCIDRs[%d]: %q would send all of the pod's traffic through the node", i, c))
		}
	}
	if s.Parent != "" && (len(s.Parent) > 15 || strings.ContainsAny(s.Parent, "/ \t\n:") || s.Parent == "." || s.Parent == "..") {
		errs = append(errs, fmt.Errorf("parent: %q is not an interface name", s.Parent))
	}
	return errors.Join(errs...)
}

// cidrs are the validated Service CIDRs.
func (s *Settings) cidrs() []netip.Prefix {
	var out []netip.Prefix
	for _, c := range s.ServiceCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p)
		}
	}
	return out
}
