package svcpath

import (
	"errors"
	"fmt"
	"net/netip"
)

// DefaultServiceCIDR is Kubernetes' default Service range (kube-apiserver
// --service-cluster-ip-range).
const DefaultServiceCIDR = "10.96.0.0/12"

// Settings is the part of a mode's section of vpcnid.yaml that the service
// path reads; modes embed it.
type Settings struct {
	// ServiceCIDRs are routed through the node's stack (the service veth),
	// so kube-proxy's rules apply to them: the cluster's Service ranges,
	// IPv4 and IPv6 (default [10.96.0.0/12]; a dual-stack or IPv6-only
	// cluster lists its IPv6 range too). A pod routes those of the
	// families it has an address of.
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
}

// Defaults fills what the section left out.
func (s *Settings) Defaults() {
	if len(s.ServiceCIDRs) == 0 {
		s.ServiceCIDRs = []string{DefaultServiceCIDR}
	}
}

// Validate names every bad Service CIDR.
func (s *Settings) Validate() error {
	return validateCIDRs("serviceCIDRs", s.ServiceCIDRs, "would send all of the pod's traffic through the node", true)
}

// ValidateCIDRs names every entry of a list of IPv4 CIDRs (the field
// field of a mode's section) that is not one, has host bits set, or is
// 0.0.0.0/0, which would do what everything says.
func ValidateCIDRs(field string, list []string, everything string) error {
	return validateCIDRs(field, list, everything, false)
}

// validateCIDRs is ValidateCIDRs, taking IPv6 CIDRs too with v6.
func validateCIDRs(field string, list []string, everything string, v6 bool) error {
	var errs []error
	for i, c := range list {
		p, err := netip.ParsePrefix(c)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s[%d]: %q is not a CIDR", field, i, c))
		case p.Addr().Is4In6() || p.Addr().Zone() != "":
			errs = append(errs, fmt.Errorf("%s[%d]: %q is neither an IPv4 nor an IPv6 CIDR", field, i, c))
		case !v6 && !p.Addr().Is4():
			errs = append(errs, fmt.Errorf("%s[%d]: %q: only IPv4 is supported so far", field, i, c))
		case p.Masked() != p:
			errs = append(errs, fmt.Errorf("%s[%d]: %q has host bits set (did you mean %s?)", field, i, c, p.Masked()))
		case p.Bits() == 0:
			errs = append(errs, fmt.Errorf("%s[%d]: %q %s", field, i, c, everything))
		}
	}
	return errors.Join(errs...)
}

// CIDRs are the validated Service CIDRs.
func (s *Settings) CIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, c := range s.ServiceCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p)
		}
	}
	return out
}
